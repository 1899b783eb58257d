"""The book: what the chapters need; measuring is :mod:`thesis_lib.bench`'s, tabulating :mod:`thesis_lib.analysis`'s.

Modules: ``params`` (parameter sets), ``sizing`` and ``buildcosts`` (the sample a time budget affords, from
what earlier builds cost), ``shared`` (the chapters' hash-named results; the studies' chapters keep theirs),
``provenance``, ``gluing``, ``figures``, the explorers (``widgets``, ``live``, ``static_explorer``) and the build:
``execute`` (papermill), ``scheduled``, ``rehearsal``, ``vendor`` (offline JavaScript), ``build``, ``browser``.
"""
