"""Decoding: the loops that turn a target (and a drafter) into tokens (thesis sections 2.2, 3.3-3.6).

- :mod:`~thesis_lib.decoding.state`: one model's KV cache and forward (:class:`ModelState`).
- :mod:`~thesis_lib.decoding.drafters`: the drafter protocol (``begin`` / ``propose`` / ``observe``): the
  draft model (dense or FlashHead head, optionally stopping at an unsure token), its profiled twin, prompt
  lookup and the lookup + model hybrid.
- :mod:`~thesis_lib.decoding.stats`: the stats record every loop returns, and the bookkeeping they share.
- :mod:`~thesis_lib.decoding.greedy`: target-only greedy and greedy speculative decoding (ordinary,
  deferred and pipelined schedules).
- :mod:`~thesis_lib.decoding.sampling`: lossless speculative sampling (beyond the thesis).
- :mod:`~thesis_lib.decoding.trees`: token trees drafted and verified in one forward (beyond the thesis).
- :mod:`~thesis_lib.decoding.costs`: the cost model of a round and the one timer of its inputs.
- :mod:`~thesis_lib.decoding.clocks`: phase clocks and forward timers (CUDA-synchronised on GPU).

Block-length policies beyond the fixed K are a study's (:mod:`thesis_studies.beyond.policies`).

This layer knows models and heads; it knows nothing about prompts, benchmarks or the book.
"""
