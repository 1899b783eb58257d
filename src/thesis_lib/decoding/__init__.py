"""Decoding: the loops that turn a target (and a drafter) into tokens (thesis sections 2.2, 3.3-3.6).

- :mod:`~thesis_lib.decoding.state`: one model's KV cache and forward (:class:`ModelState`).
- :mod:`~thesis_lib.decoding.drafters`: the drafter protocol (``begin`` / ``propose`` / ``observe``): the
  draft model (dense or FlashHead head, optionally stopping at an unsure token) and its profiled twin.
- :mod:`~thesis_lib.decoding.stats`: the stats record every loop returns, and the words it counts in.
- :mod:`~thesis_lib.decoding.rounds`: the steps every loop shares (the prefill, the accepted prefix, a round's
  emission, the record's close).
- :mod:`~thesis_lib.decoding.greedy`: target-only greedy and greedy speculative decoding (ordinary,
  deferred and pipelined schedules, a function each).
- :mod:`~thesis_lib.decoding.costs`: the cost model of a round and the one timer of its inputs.
- :mod:`~thesis_lib.decoding.clocks`: phase clocks and forward timers (CUDA-synchronised on GPU).

Beyond the thesis, the studies hold their own loops and drafters, which the runner reaches through
:mod:`thesis_lib.extensions`: speculative sampling (:mod:`thesis_studies.sampling.loop`), token trees
(:mod:`thesis_studies.trees.loop`), prompt lookup (:mod:`thesis_studies.beyond.lookup`), block-length policies
(:mod:`thesis_studies.beyond.policies`).

This layer knows models and heads; it knows nothing about prompts, benchmarks or the book.
"""
