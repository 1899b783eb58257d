"""FlashHead's greedy head as Triton kernels for decode rows on a GPU (the "triton" path, and "auto" on CUDA).

:func:`greedy` runs the whole head without host synchronisation, so a CUDA graph can capture it with the
draft's body: the centroid scores and their counting (for one row ``score_count_kernel``, whose programs score
their centroids and put each score's order-preserving 16-bit key into the row's histograms; for several rows one
matrix product, which reads the centroids once for all, and ``count_kernel``); ``pick_kernel`` reads the P-th
largest key off the histograms and writes the probes (keys equal to it into a tie list, taken lowest index
first); ``candidate_kernel`` scores each probed cluster and the special tokens exactly and folds the best
(score, token) into one int64 ``atomic_max`` (ties to the lower token id), then zeroes the histograms;
``finish_kernel`` unpacks the token. The probe choice is spread over many programs because a one-block selection
(``torch.topk``, a single-program radix select) would dominate the head; without a graph, launch overhead exceeds
the work. On Hopper and later the Triton kernels are chained by programmatic dependent launch (:data:`PDL`): each
one's programs start while the one before runs and wait for it on the device. Designs with fewer launches (all
stages in one, ordered by waiting thread blocks; each probe program finding its own cluster; the threshold read
once by the scoring kernel's last program; the probe choice and the candidates in one kernel) were slower or no
faster on an H100 and an H200 (the measurement log). :func:`probe` serves
float32 centroid scores; :func:`cluster_scores` scores probed clusters for the confidence head. Triton is
imported only by :func:`_kernels`; tests run the kernels on a CPU with ``TRITON_INTERPRET=1``.
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
    """The module of Triton kernels (imported only here: it imports Triton at its top)."""
    _triton()
    from . import triton_kernels

    return triton_kernels


def supports(cluster_size: int, hidden_size: int) -> bool:
    """The kernel's shape rules: a power-of-two cluster size, a hidden size its block width divides."""
    return cluster_size > 0 and cluster_size & (cluster_size - 1) == 0 and _block(hidden_size) >= 16


def serves(device, cluster_size: int, hidden_size: int) -> bool:
    """Whether the kernel can score a head of these shapes on ``device``: :func:`available` and :func:`supports`."""
    return available(device) and supports(cluster_size, hidden_size)


@functools.lru_cache(maxsize=None)
def _chained(device: torch.device) -> bool:
    """Whether :data:`PDL` chaining applies on ``device`` (a CUDA device of compute capability 9 or more), asked
    once per device, not per head call."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _block(d: int) -> int:
    """The largest power of two up to 256 that divides ``d``."""
    return min(256, d & -d) if d > 0 else 0


def cluster_scores(h: torch.Tensor, weight_perm: torch.Tensor, top: torch.Tensor,
                   slot_bias: torch.Tensor) -> torch.Tensor:
    """``h [S, D]``, ``weight_perm [C, b, D]``, ``top [S, p]``, ``slot_bias [C, b]`` -> float32 ``[S, p, b]``:
    each probed row's score ``h . w`` plus its slot bias (``-inf`` on padding slots)."""
    cluster_kernel = _kernels().cluster_kernel
    s, p = top.shape
    _, b, d = weight_perm.shape
    h = h.to(weight_perm.dtype).contiguous()
    out = torch.empty(s, p, b, dtype=torch.float32, device=h.device)
    cluster_kernel[(p, s)](h, weight_perm, top.contiguous(), slot_bias.float().contiguous(), out, D=d, B=b, P=p,
                           BLOCK_D=_block(d), num_warps=4)
    return out


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def probe(cluster_scores: torch.Tensor, n_probes: int, *, warps: int = 4,
          chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n_probes`` best of each row of ``cluster_scores [S, C]`` (bfloat16 or float32) as ascending int32
    indices (threshold ties to the lowest index), and the int64 ``[S]`` reset of :func:`greedy`'s packed maximum.
    One program per row: a radix select, 8 bits a pass."""
    s, c = cluster_scores.shape
    if cluster_scores.dtype == torch.bfloat16:
        keys, bits = cluster_scores.contiguous().view(torch.int16), 16
    else:
        keys, bits = cluster_scores.float().contiguous().view(torch.int32), 32
    top = torch.empty(s, n_probes, dtype=torch.int32, device=keys.device)
    best = torch.empty(s, dtype=torch.int64, device=keys.device)
    _kernels().select_kernel[(s,)](keys, top, best, n_probes, C=c, KEY_BITS=bits, CHUNK=min(chunk, _next_pow2(c)),
                                   num_warps=warps)
    return top, best


#: tie-list length per row: more keys equal to the threshold than this and the tied probes are found by a scan
TIE_CAP = 64
#: scores per program of the counting and picking kernels
PICK_BLOCK = 128
#: chain the head's kernels by programmatic dependent launch where the GPU has it (Hopper on): each kernel's
#: programs launch while the one before runs and wait for it on the device, instead of launching after it
PDL = True
#: score one row's bfloat16 centroids in ``score_count_kernel`` (no matrix product, no ``count_kernel``), with
#: CENTROID_BLOCK centroids a program
SCORE_IN_TRITON = True
CENTROID_BLOCK = 16

_workspaces: dict = {}


def _workspace(device: torch.device, rows: int) -> dict:
    """Per (device, rows): the zeroed histograms and counters the bfloat16 path keeps between calls (each call
    leaves them zeroed again), the tie list and the threshold record. Shared by every head on the device: one
    call at a time per device (two streams calling at once would mix their counts)."""
    key = (str(device), rows)
    if key not in _workspaces:
        z = functools.partial(torch.zeros, dtype=torch.int32, device=device)
        _workspaces[key] = {"hist16": z(rows, 65536), "hist8": z(rows, 256), "counters": z(rows, 2),
                            "ties": z(rows, TIE_CAP), "ctl": z(rows, 4)}
    return _workspaces[key]


def greedy(h: torch.Tensor, centroids: torch.Tensor, weight_perm: torch.Tensor, slot_bias: torch.Tensor,
           tokens: torch.Tensor, special_w: torch.Tensor, special_b: torch.Tensor, special_ids: torch.Tensor,
           n_probes: int, sentinel: int | None = None, *, block_d: int | None = None, warps: int = 4) -> torch.Tensor:
    """FlashHead's greedy choice on a GPU, ``h [S, D] -> token ids [S]`` (int64), as in the module docstring;
    float32 centroids take :func:`probe` for the probes. Arguments as FlashHead's fused functions (``sentinel``
    unused: every row has a winner); ties go to the lowest token id."""
    k = _kernels()
    s, d = h.shape
    c, b, _ = weight_perm.shape
    ws = _workspace(h.device, s)
    pdl = bool(PDL) and _chained(h.device)
    chain = {"PDL": pdl, "launch_pdl": pdl}
    one = bool(SCORE_IN_TRITON) and s == 1 and centroids.dtype == torch.bfloat16
    if one:  # the scores' bits, written by score_count_kernel
        scores = torch.empty(s, c, dtype=torch.bfloat16, device=h.device)
        x, centroids = h.to(centroids.dtype).contiguous(), centroids.contiguous()
    else:  # [S, C], ranked as the torch paths rank
        scores = torch.matmul(h.to(centroids.dtype), centroids.T).contiguous()
    h = h.to(weight_perm.dtype).contiguous()
    try:
        if scores.dtype == torch.bfloat16:
            top = torch.empty(s, n_probes, dtype=torch.int32, device=h.device)
            best = torch.empty(s, dtype=torch.int64, device=h.device)
            keys = scores.view(torch.int16)
            grid = (-(-c // PICK_BLOCK), s)
            if one:
                k.score_count_kernel[(-(-c // CENTROID_BLOCK), s)](x, centroids, keys, ws["hist16"], ws["hist8"], best,
                                                                   C=c, D=d, CB=CENTROID_BLOCK, BLOCK_D=_block(d),
                                                                   num_warps=4, **chain)
            else:
                k.count_kernel[grid](keys, ws["hist16"], ws["hist8"], best, C=c, BLOCK=PICK_BLOCK, num_warps=4,
                                     **chain)
            k.pick_kernel[grid](keys, ws["hist16"], ws["hist8"], top, ws["counters"], ws["ties"], ws["ctl"], n_probes,
                                C=c, BLOCK=PICK_BLOCK, CAP=TIE_CAP, num_warps=4, **chain)
            n_zero = grid[0]
        else:
            top, best = probe(scores, n_probes)
            keys, n_zero = scores.float().view(torch.int32), 0
            ws["ctl"].zero_()  # every probe from ``top``: no ties to resolve
        ns = int(special_ids.numel())
        if ns == 0:  # never read (no program scores specials); valid pointers of the right types all the same
            special_w, special_b, special_ids = weight_perm, slot_bias, tokens
        n_special = -(-ns // b)
        k.candidate_kernel[(n_probes + n_special + n_zero, s)](
            h, weight_perm, top, slot_bias, tokens, special_w, special_b, special_ids, best, keys, ws["ties"],
            ws["ctl"], ws["hist16"], ws["hist8"], ns, n_probes, n_special, C=c, D=d, B=b,
            BLOCK_D=block_d or _block(d), CAP=TIE_CAP, BLOCK=PICK_BLOCK, num_warps=warps, **chain)
        out = torch.empty(s, dtype=torch.int64, device=h.device)
        k.finish_kernel[(s,)](best, out, ws["counters"], num_warps=1, **chain)
    except BaseException:
        for name in ("hist16", "hist8", "counters"):  # a half-run call may leave counts behind: zero them in place
            ws[name].zero_()                          # (captured graphs keep these buffers' addresses)
        raise
    return out
