"""FlashHead's greedy head on a CPU in one call of the project's kernel module (the "kernel" path, and "auto" on a
CPU where the module builds): ``csrc/flash_head.cpp`` scores the centroids (in bfloat16 as the fast path ranks them,
or float32), keeps the ``n_probes`` best clusters (ties to the lower cluster index, as the GPU kernels take them),
scores their rows and the special tokens in float32 and returns the best token (ties to the lowest id). The
same stages as the compiled path's, without its separate product, selection and generated loops between them;
:func:`serves` says where it applies (CPU tensors, bfloat16 or float32 centroids and rows)."""

from __future__ import annotations

import sys

import torch

#: the dtypes the kernel reads centroids and rows in
DTYPES = (torch.bfloat16, torch.float32)
#: whether "auto" takes the kernel where it serves (off: the compiled path, for side-by-side timing)
ENABLED = True


def enabled(on: bool):
    """Run a block with "auto" FlashHeads on the kernel (on) or on the compiled path (off)."""
    from ..models.fused import switched

    return switched(sys.modules[__name__], on)


def serves(device: torch.device, centroid_dtype: torch.dtype, row_dtype: torch.dtype) -> bool:
    """Whether the kernel serves a head on ``device`` with these dtypes (building the kernel module if need be)."""
    from ..models import weight_only

    return (torch.device(device).type == "cpu" and centroid_dtype in DTYPES and row_dtype in DTYPES
            and weight_only.available())


def greedy(hidden, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids, n_probes: int,
           sentinel: int) -> torch.Tensor:
    """The greedy head's tokens ``[S]`` for ``hidden [S, D]`` (the fast path's arguments, as ``_greedy_fused``)."""
    from ..models import weight_only

    return weight_only.kernel().flash_greedy(hidden.float().contiguous(), centroids, weight_perm, slot_bias, tokens,
                                             special_w, special_b, special_ids, int(n_probes), int(sentinel),
                                             weight_only.path_arg())
