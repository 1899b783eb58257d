"""Analysis: from measurements to the thesis' tables, theory and verdicts.

- :mod:`~thesis_lib.analysis.theory`: chapter 2's arithmetic and the cost model's inputs with their intervals;
- :mod:`~thesis_lib.analysis.reference`: the thesis' own numbers; :mod:`~thesis_lib.analysis.headline`: what
  reproduced;
- :mod:`~thesis_lib.analysis.pooled`, :mod:`~thesis_lib.analysis.tables`, :mod:`~thesis_lib.analysis.diagnostics`,
  :mod:`~thesis_lib.analysis.formatting`: tables from run folders, and how they are shown;
- :mod:`~thesis_lib.analysis.uncertainty`: intervals, and the one rule that turns an interval into words;
  :mod:`~thesis_lib.analysis.verdicts`: the thesis' chapters' verdict sentences and the rules that glue them.

The studies' tables and verdicts are theirs (:mod:`thesis_studies`).
"""
