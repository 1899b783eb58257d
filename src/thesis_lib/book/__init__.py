"""The book: parameter sets, the chapters' shared results, notebook execution, figures, widgets, the build.

- :mod:`~thesis_lib.book.params`: the parameter sets (``params/*.yaml``) and :class:`Params`.
- :mod:`~thesis_lib.book.shared`: the chapters' shared results (hash-named run folders and documents, one
  model load per process); :mod:`~thesis_lib.book.experiments`: chapter 6's.
- :mod:`~thesis_lib.book.provenance`: where the numbers come from (the ``Source`` labels, the environment page).
- :mod:`~thesis_lib.book.figures` and :mod:`~thesis_lib.book.widgets`: the figures and the explorer.
- :mod:`~thesis_lib.book.execute`, :mod:`~thesis_lib.book.vendor`, :mod:`~thesis_lib.book.build`: papermill,
  the offline JavaScript and the Jupyter Book build; :mod:`~thesis_lib.book.browser`: the real-browser check.

It knows what a chapter needs, not how it is measured (:mod:`thesis_lib.bench`) or tabulated
(:mod:`thesis_lib.analysis`).
"""
