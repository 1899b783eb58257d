"""thesis-companion: speculative decoding with a dense or FlashHead draft, reproducibly.

This package is the thesis' core. Subpackages, each a layer that imports only from the layers before it:
``models`` (specs, the embedded pair, loading, CPU kernels) <- ``heads`` (dense, FlashHead, clustering) <-
``decoding`` (cache state, drafters, greedy, sampling and tree loops, clocks, the cost model) <- ``bench``
(prompts, modes, the protocol, run folders, model-only benchmarks) <- ``analysis`` (theory, the thesis' numbers,
tables, verdicts) <- ``sweep`` <- ``book`` (parameter sets, shared results, figures, widgets, the build) <- ``cli``.
``errors``, ``progress`` and ``extensions`` (where studies plug in) are shared by all. What the project measures
beyond the thesis lives beside it in :mod:`thesis_studies`, which imports the core and is never imported by it.
"""

import os as _os

__version__ = "0.1.0"

from .progress import quiet_known_noise as _quiet

_quiet()  # two warnings of torchao's import nobody here can act on (progress._KnownNoise)

if _os.environ.get("THESIS_LIB_VIRTUAL_CUDA"):  # a rehearsal of the GPU path on a CPU (models.virtual)
    from .models import virtual as _virtual

    _virtual.enable_from_environment()
