"""The benchmark: the thesis' protocol (section 3.7) from prompts to run folders, and the model-only benchmarks.

- :mod:`~thesis_lib.bench.prompts`: question files (Spec-Bench format), the shipped sets, selection, encoding.
- :mod:`~thesis_lib.bench.modes`: every mode by name (drafts x schedules x block-length policies, sampling,
  transformers' peers).
- :mod:`~thesis_lib.bench.runner`: a loaded pair bound to every mode.
- :mod:`~thesis_lib.bench.execute`: the interleaved loop over prompts x iterations x modes, component costs.
- :mod:`~thesis_lib.bench.metrics`: the per-sample record and the per-mode summary.
- :mod:`~thesis_lib.bench.protocol`: ``BenchConfig`` (every parameter), cheap checks, ``run()`` into a folder.
- :mod:`~thesis_lib.bench.drafts`: the draft heads a configuration asks for (the studies' drafts built by them).
- :mod:`~thesis_lib.bench.runs` and :mod:`~thesis_lib.bench.environment`: run folders (never overwritten,
  resumable) and what they record about the machine.
- :mod:`~thesis_lib.bench.modelbench` and :mod:`~thesis_lib.bench.timing`: model-only measurements of the
  draft (Tables 4.1-4.4) and the one timer behind them; :mod:`~thesis_lib.bench.disturbance`: what else used the
  machine while something was timed.

This layer measures; turning measurements into the thesis' tables is :mod:`thesis_lib.analysis`'.
"""
