"""Analysis: from measurements to the thesis' tables, its theory, and the chapter-6 models (no model runs
here except where a model's hidden states are the input: co-design and lookahead).

- :mod:`~thesis_lib.analysis.theory`: chapter 2's arithmetic (head cost, work ratio, speedup model).
- :mod:`~thesis_lib.analysis.reference`: the thesis' own numbers, read from ``data/thesis_reference.json``.
- :mod:`~thesis_lib.analysis.pooled`, :mod:`~thesis_lib.analysis.tables`,
  :mod:`~thesis_lib.analysis.diagnostics`, :mod:`~thesis_lib.analysis.formatting`: Tables 4.1-4.11 and this
  project's extra tables from run folders, and how they are shown.
- :mod:`~thesis_lib.analysis.codesign`, :mod:`~thesis_lib.analysis.lookahead`: draft heads and block-length
  policies judged without a decoding run per setting.
- :mod:`~thesis_lib.analysis.beyond`: chapter 6's tables and verdict.
- :mod:`~thesis_lib.analysis.distcheck`: the exact test that speculative sampling is lossless.
"""
