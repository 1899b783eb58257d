"""FlashHead's candidate scores as a Triton kernel, for decode rows on a GPU.

Measured on an H100 (``thesis-lib gpu-check``'s kernel profile, random weights at Qwen3-0.6B's shapes, 593 of
9,496 clusters, 2026-11-23): the code ``torch.compile`` made for the candidate scores read the 593 x 16 x 1,024
gathered rows at about 0.46 TB/s (36-42 us), and at 593 probes it picked wrong tokens (gpu-check's agreement
rows); the dense head's whole matrix product took 110 us. :func:`cluster_scores` computes ``h . w`` for every
row of the probed clusters, plus the padding-slot bias, with one program per probed cluster reading its
``b x D`` block once, coalesced: 29.5 us in isolation, the same scores as torch to 2.4e-7.

What it does not fix: ``torch.topk`` over a single row of cluster scores runs in one thread block (34 us at
593 of 9,496), now the largest part of the head. A one-program bitonic sort of packed ``(score, id)`` keys in
Triton was tried for it and took 0.54-0.61 ms, over ten times slower, so it was not kept; a multi-block radix
select is the next thing to try.

Only a CUDA device runs the kernel; importing this module never imports Triton (:func:`available` does), so the
CPU path does not depend on it. The greedy choice over the scores (ties to the lowest token id) stays in torch.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def _triton():
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001 - no Triton (a CPU build of torch): the kernels are unavailable
        return None
    return triton, tl


def available(device) -> bool:
    """Whether these kernels can run on ``device`` (a CUDA device, with Triton importable)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available() and _triton() is not None


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def cluster_kernel(h, weight, top, bias, out, D: tl.constexpr, B: tl.constexpr, P: tl.constexpr,
                       BLOCK_D: tl.constexpr):
        j = tl.program_id(0)
        row = tl.program_id(1)
        c = tl.load(top + row * P + j)
        slots = tl.arange(0, B)
        acc = tl.zeros((B,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            w = tl.load(weight + c * B * D + slots[:, None] * D + d[None, :])
            x = tl.load(h + row * D + d)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        acc += tl.load(bias + c * B + slots)
        tl.store(out + (row * P + j) * B + slots, acc)

    return cluster_kernel


def supports(cluster_size: int, hidden_size: int) -> bool:
    """The kernel's shape rules: a power-of-two cluster size, a hidden size its block width divides."""
    return cluster_size > 0 and cluster_size & (cluster_size - 1) == 0 and _block(hidden_size) >= 16


def serves(device, cluster_size: int, hidden_size: int) -> bool:
    """Whether the kernel can score a head of these shapes on ``device``: :func:`available` and :func:`supports`."""
    return available(device) and supports(cluster_size, hidden_size)


def _block(d: int) -> int:
    """The largest power of two up to 256 that divides ``d``."""
    return min(256, d & -d) if d > 0 else 0


def cluster_scores(h: torch.Tensor, weight_perm: torch.Tensor, top: torch.Tensor,
                   slot_bias: torch.Tensor) -> torch.Tensor:
    """``h [S, D]``, ``weight_perm [C, b, D]``, ``top [S, p]``, ``slot_bias [C, b]`` -> float32 ``[S, p, b]``:
    each probed row's score ``h . w`` plus its slot bias (``-inf`` on padding slots)."""
    cluster_kernel = _kernels()
    s, p = top.shape
    _, b, d = weight_perm.shape
    h = h.to(weight_perm.dtype).contiguous()
    out = torch.empty(s, p, b, dtype=torch.float32, device=h.device)
    cluster_kernel[(p, s)](h, weight_perm, top.contiguous(), slot_bias.float().contiguous(), out, D=d, B=b, P=p,
                           BLOCK_D=_block(d), num_warps=4)
    return out
