"""Heads: how a draft turns final hidden states into tokens (thesis sections 2.3, 2.5 and 3.4).

- :mod:`~thesis_lib.heads.dense`: the dense LM head (greedy, ties to the lowest id) and its confidence.
- :mod:`~thesis_lib.heads.clustering`: FlashHead's offline step, equal-size spherical k-means.
- :mod:`~thesis_lib.heads.assets`: Embedl's asset format and the content-keyed clustering cache.
- :mod:`~thesis_lib.heads.flashhead`: the FlashHead head (greedy, confidence, sampling; compiled and eager).
- :mod:`~thesis_lib.heads.cpu_kernels`: its greedy head in one call of the project's C++ kernel module (a CPU).
- :mod:`~thesis_lib.heads.gpu_kernels`, :mod:`~thesis_lib.heads.triton_kernels`: its greedy head in Triton kernels
  (a GPU).
- :mod:`~thesis_lib.heads.for_model`: a FlashHead for a loaded model: assets, an Embedl checkpoint's settings,
  the always-scored tokens.
- :mod:`~thesis_lib.heads.draws`: seeded draws whose generator lives on another device.

The heads beyond the thesis (adaptive probes, the frequency-truncated rival) are a study's
(:mod:`thesis_studies.beyond`).

Every greedy head maps ``h: [S, D]`` to token ids ``[S]`` with no host sync, so a drafter swaps one for another
without touching the transformer body. This layer knows models, not decoding loops.
"""
