"""Analysis: from measurements to the thesis' tables, theory and verdicts (models run only in co-design and
lookahead, whose input is a model's hidden states).

- :mod:`~thesis_lib.analysis.theory`, :mod:`~thesis_lib.analysis.precision`: chapter 2's arithmetic and CPU precisions;
- :mod:`~thesis_lib.analysis.reference`, :mod:`~thesis_lib.analysis.gpucheck`: the thesis' own numbers, a GPU's;
- :mod:`~thesis_lib.analysis.pooled`, :mod:`~thesis_lib.analysis.tables`, :mod:`~thesis_lib.analysis.diagnostics`,
  :mod:`~thesis_lib.analysis.formatting`: tables from run folders, and how they are shown;
- :mod:`~thesis_lib.analysis.codesign`, :mod:`~thesis_lib.analysis.lookahead`, :mod:`~thesis_lib.analysis.beyond`:
  chapter 6 (draft heads and block-length policies judged without a decoding run each, its tables);
- :mod:`~thesis_lib.analysis.distcheck`: sampling is lossless; :mod:`~thesis_lib.analysis.verdicts`: verdict sentences.
"""
