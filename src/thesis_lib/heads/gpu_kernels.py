"""FlashHead's two costly steps as Triton kernels, for one decode row on a GPU.

Measured on an H100 (``thesis-lib gpu-check``'s kernel profile, random weights at Qwen3-0.6B's shapes, 593 of
9,496 clusters): ``torch.topk`` ran one thread block (a single row is one "slice"), 34 us, and the code
``torch.compile`` made for the candidate scores read the 593 x 16 x 1,024 gathered rows at about 0.46 TB/s,
42 us, while the dense head's whole matrix product took 110 us. These kernels do the same two steps:

- :func:`top_clusters`: the indices of the ``p`` largest centroid scores of each row, exactly (ties to the lower
  cluster id), by one bitonic sort of ``(score, id)`` keys packed into 64-bit integers, in one program per row;
- :func:`cluster_scores`: ``h . w`` for every row of the probed clusters (plus the padding-slot bias), one
  program per probed cluster reading its ``b x D`` block once, coalesced.

Only a CUDA device runs them; importing this module never imports Triton (:func:`available` does), so the
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
    def topk_kernel(scores, out, n, stride, P: tl.constexpr, NPAD: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, NPAD)
        x = tl.load(scores + row * stride + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # integer order == float order
        packed = (key.to(tl.int64) << 32) | (NPAD - 1 - offs).to(tl.int64)  # equal scores: lower id first
        ranked = tl.sort(packed, descending=True)
        ids = (NPAD - 1) - (ranked & 0xFFFFFFFF).to(tl.int32)
        tl.store(out + row * P + offs, ids.to(tl.int64), mask=offs < P)

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

    return topk_kernel, cluster_kernel


def supports(cluster_size: int, hidden_size: int) -> bool:
    """The kernel's shape rules: a power-of-two cluster size, a hidden size its block width divides."""
    return cluster_size > 0 and cluster_size & (cluster_size - 1) == 0 and _block(hidden_size) >= 16


def _block(d: int) -> int:
    """The largest power of two up to 256 that divides ``d``."""
    return min(256, d & -d) if d > 0 else 0


def top_clusters(scores: torch.Tensor, p: int) -> torch.Tensor:
    """``scores [S, C] -> [S, p]`` long: each row's ``p`` best clusters (the same set as ``torch.topk``)."""
    topk_kernel, _ = _kernels()
    triton, _ = _triton()
    s, n = scores.shape
    npad = triton.next_power_of_2(n)
    out = torch.empty(s, p, dtype=torch.long, device=scores.device)
    topk_kernel[(s,)](scores, out, n, scores.stride(0), P=p, NPAD=npad, num_warps=16)
    return out


def cluster_scores(h: torch.Tensor, weight_perm: torch.Tensor, top: torch.Tensor,
                   slot_bias: torch.Tensor) -> torch.Tensor:
    """``h [S, D]``, ``weight_perm [C, b, D]``, ``top [S, p]``, ``slot_bias [C, b]`` -> float32 ``[S, p, b]``:
    each probed row's score ``h . w`` plus its slot bias (``-inf`` on padding slots)."""
    _, cluster_kernel = _kernels()
    s, p = top.shape
    _, b, d = weight_perm.shape
    h = h.to(weight_perm.dtype).contiguous()
    out = torch.empty(s, p, b, dtype=torch.float32, device=h.device)
    cluster_kernel[(p, s)](h, weight_perm, top.contiguous(), slot_bias.float().contiguous(), out, D=d, B=b, P=p,
                           BLOCK_D=_block(d), num_warps=4)
    return out
