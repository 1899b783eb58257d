"""Decoding: the loops that turn a target (and a drafter) into tokens (thesis sections 2.2, 3.3-3.6).

- :mod:`~thesis_lib.decoding.state`: one model's KV cache and forward (:class:`ModelState`).
- :mod:`~thesis_lib.decoding.drafters`: the drafter protocol (``begin`` / ``propose`` / ``observe``): the
  draft model (dense or FlashHead head, optionally stopping at an unsure token), its profiled twin, prompt
  lookup and the lookup + model hybrid.
- :mod:`~thesis_lib.decoding.stats`: the stats record every loop returns, and the bookkeeping they share.
- :mod:`~thesis_lib.decoding.greedy`: target-only greedy and greedy speculative decoding (ordinary,
  deferred and pipelined schedules).
- :mod:`~thesis_lib.decoding.sampling`: lossless speculative sampling (beyond the thesis).
- :mod:`~thesis_lib.decoding.policies`: block-length policies (fixed, heuristic, cost model).
- :mod:`~thesis_lib.decoding.clocks`: phase clocks and forward timers (CUDA-synchronised on GPU).

This layer knows models and heads; it knows nothing about prompts, benchmarks or the book.
"""
