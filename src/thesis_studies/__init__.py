"""What this project measures beyond the thesis, each study beside the core (:mod:`thesis_lib`), importing it and
never imported by it. A study owns its measurement, its document, its tables and the values its chapter glues; it
plugs into the core through :mod:`thesis_lib.extensions` (commands under ``thesis-lib studies``, model-bench
parts, verdict rules, a scheduled book's runs), registered when this package is imported (the entry point
``thesis_lib.studies`` in ``pyproject.toml``).

- :mod:`.beyond`: chapter 6, adaptive probes and K, the co-designed head, the frequency-truncated head, lookahead;
- :mod:`.serving`: chapter 7, batched decoding, longer generations, memory (``serving-bench``);
- :mod:`.trees`: chapter 8, token trees, their shapes and cost model (``tree-bench``);
- :mod:`.precision`: chapter 2's precisions and byte floor, the step profile (``precision-bench``,
  ``step-profile``);
- :mod:`.peers`: llama.cpp (``llama-bench``) and Embedl's own FlashHead (model-bench's ``embedl`` part);
- :mod:`.gpucheck`: the GPU acceptance run at the thesis' shapes, random weights (``gpu-check``);
- :mod:`.sampling`: speculative sampling proved lossless by an exact test (``sampling-check``).
"""

from . import beyond, gpucheck, peers, precision, sampling, serving, trees  # noqa: F401  (each registers itself)
