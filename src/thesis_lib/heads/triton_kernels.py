"""The Triton kernels of :mod:`thesis_lib.heads.gpu_kernels`, which documents and launches them. Imports Triton at
its top, so only :func:`thesis_lib.heads.gpu_kernels._kernels` imports it; the CPU path never does.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

INT64_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _chained(PDL: tl.constexpr):
    # PDL (programmatic dependent launch, Hopper on): let the next kernel's programs launch now, and wait here
    # until the previous kernel has finished and its writes are visible; without it, stream order does both
    if PDL:
        gdc_launch_dependents()
        gdc_wait()

@triton.jit
def _key16(raw):
    # a bfloat16's bits (int32 in [0, 2^16)) -> its order-preserving key
    raw = tl.where(raw == 0x8000, 0, raw)  # -0.0 is +0.0: equal scores, one key (a tie)
    return tl.where((raw & 0x8000) != 0, 0xFFFF - raw, raw | 0x8000)


@triton.jit
def _keys(scores, row, C, offs, KEY_BITS: tl.constexpr):
    """Order-preserving non-negative integer keys of one row's scores at ``offs`` (bfloat16 read as int16 ->
    int32 keys in [0, 2^16); float32 read as int32 -> int64 keys in [0, 2^32)), and which offsets are inside."""
    inside = offs < C
    if KEY_BITS == 16:
        key = _key16(tl.load(scores + row * C + offs, mask=inside, other=0).to(tl.int32) & 0xFFFF)
    else:
        raw = tl.load(scores + row * C + offs, mask=inside, other=0).to(tl.int64) & 0xFFFFFFFF
        raw = tl.where(raw == 0x80000000, 0, raw)
        key = tl.where((raw & 0x80000000) != 0, 0xFFFFFFFF - raw, raw | 0x80000000)
    return key, inside


@triton.jit
def select_kernel(scores, top, best, P, C: tl.constexpr, KEY_BITS: tl.constexpr, CHUNK: tl.constexpr):
    # one program per row: the P largest of C scores by a radix select (per pass, a histogram of the next 8-bit
    # digit among keys matching the digits found so far), then one pass writing in ascending order every index
    # above the threshold key and the lowest ones equal to it. CHUNK-wide reads keep registers from spilling.
    row = tl.program_id(0)
    bins = tl.arange(0, 256)
    key0, _ = _keys(scores, row, C, tl.arange(0, 2), KEY_BITS)
    prefix = tl.sum(key0 * 0, axis=0)  # the threshold key's digits found so far (0 below them)
    need = tl.sum(tl.zeros((2,), dtype=tl.int32), axis=0) + P  # how many keys matching the prefix to pick
    for k in tl.static_range(KEY_BITS // 8):
        hist = tl.zeros((256,), dtype=tl.int32)
        for c0 in range(0, C, CHUNK):
            key, inside = _keys(scores, row, C, c0 + tl.arange(0, CHUNK), KEY_BITS)
            match = inside & ((key >> (KEY_BITS - 8 * k)) == (prefix >> (KEY_BITS - 8 * k)))
            hist += tl.histogram(((key >> (KEY_BITS - 8 * (k + 1))) & 0xFF).to(tl.int32), 256, mask=match)
        at_least = tl.cumsum(hist, axis=0, reverse=True)  # keys with this digit or a larger one
        digit = tl.max(tl.where(at_least >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
        prefix = prefix | (digit.to(prefix.dtype) << (KEY_BITS - 8 * (k + 1)))
    n_level = tl.sum(tl.zeros((2,), dtype=tl.int32), axis=0)
    n_out = n_level
    for c0 in range(0, C, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        key, inside = _keys(scores, row, C, offs, KEY_BITS)
        level = inside & (key == prefix)
        rank = n_level + tl.cumsum(level.to(tl.int32), axis=0) - 1
        chosen = (inside & (key > prefix)) | (level & (rank < need))
        slot = n_out + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(top + row * P + slot, offs, mask=chosen)
        n_level += tl.sum(level.to(tl.int32), axis=0)
        n_out += tl.sum(chosen.to(tl.int32), axis=0)
    tl.store(best + row, INT64_MIN)  # the candidates' packed maximum starts below all


@triton.jit
def _packed(score, token):
    # (score, token) -> int64 ordered by score, then the LOWER token id: an argmax with ties to the lowest id
    # becomes one integer maximum (one atomic_max across programs)
    bits = score.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (key.to(tl.int64) << 32) | (0xFFFFFFFF - token.to(tl.int64))


@triton.jit
def _dot_rows(h, row, base, valid, R: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # float32 sums of bfloat16 products: h[row] . w for R weight rows starting at the pointers ``base``
    acc = tl.zeros((R,), dtype=tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        w = tl.load(base[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        x = tl.load(h + row * D + d)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    return acc


@triton.jit
def cluster_kernel(h, weight, top, bias, out, D: tl.constexpr, B: tl.constexpr, P: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    # one program per probed cluster: its B rows' scores plus the slot bias, written out (the confidence head)
    j = tl.program_id(0)
    row = tl.program_id(1)
    c = tl.load(top + row * P + j).to(tl.int64)
    slots = tl.arange(0, B)
    score = _dot_rows(h, row, weight + (c * B + slots) * D, slots < B, B, D, BLOCK_D)
    tl.store(out + (row * P + j) * B + slots, score + tl.load(bias + c * B + slots))


@triton.jit
def count_kernel(scores, hist16, hist8, best, C: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # many programs, BLOCK scores each, counted (_count)
    _chained(PDL)
    pid = tl.program_id(0)
    row = tl.program_id(1)
    key, inside = _keys(scores, row, C, pid * BLOCK + tl.arange(0, BLOCK), 16)
    _count(hist16, hist8, best, row, pid, key, inside)


@triton.jit
def _count(hist16, hist8, best, row, pid, key, inside):
    # a program's keys into the row's 2^16-bin histogram, their top bytes into its 256-bin histogram (one atomic
    # per bin and program); the first program also starts the candidates' packed maximum below all
    tl.atomic_add(hist16 + row * 65536 + key, 1, mask=inside, sem="relaxed")
    h = tl.histogram(key >> 8, 256, mask=inside)
    tl.atomic_add(hist8 + row * 256 + tl.arange(0, 256), h, mask=h > 0, sem="relaxed")
    if pid == 0:
        tl.store(best + row, INT64_MIN)


@triton.jit
def score_count_kernel(h, centroids, scores, hist16, hist8, best, C: tl.constexpr, D: tl.constexpr,
                       CB: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    # the matrix product and count_kernel in one: many programs, CB centroids each, their scores (float32 sums of
    # bfloat16 products rounded to the nearest bfloat16 by integer arithmetic, as a GPU's conversion rounds and
    # Triton's interpreter does not) written out as bits and counted into the row's histograms
    _chained(PDL)
    pid = tl.program_id(0)
    row = tl.program_id(1)
    offs = pid * CB + tl.arange(0, CB)
    inside = offs < C
    bits = _dot_rows(h, row, centroids + offs.to(tl.int64) * D, inside, CB, D, BLOCK_D).to(tl.int32, bitcast=True)
    raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # to bfloat16, rounding to nearest even
    tl.store(scores + row * C + offs, raw.to(tl.int16), mask=inside)
    _count(hist16, hist8, best, row, pid, _key16(raw), inside)


@triton.jit
def _threshold(hist16, hist8, row, P):
    # from the histograms: the P-th largest key T, how many keys equal to T are to be picked, how many there are
    bins = tl.arange(0, 256)
    h = tl.load(hist8 + row * 256 + bins)
    at_least = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # keys whose top byte is this bin or larger
    top_byte = tl.max(tl.where(at_least >= P, bins, 0), axis=0)
    need = P - tl.sum(tl.where(bins > top_byte, h, 0), axis=0)
    h = tl.load(hist16 + row * 65536 + top_byte * 256 + bins)
    at_least = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
    low_byte = tl.max(tl.where(at_least >= need, bins, 0), axis=0)
    need -= tl.sum(tl.where(bins > low_byte, h, 0), axis=0)
    return top_byte * 256 + low_byte, need, tl.sum(tl.where(bins == low_byte, h, 0), axis=0)


@triton.jit
def pick_kernel(scores, hist16, hist8, top, counters, ties, ctl, P, C: tl.constexpr, BLOCK: tl.constexpr,
                CAP: tl.constexpr, PDL: tl.constexpr):
    # the same programs as count_kernel: each reads the threshold off the histograms, writes its keys above it
    # into ``top`` (slots from an atomic counter: their order varies, the set does not) and its keys equal to
    # it into the row's tie list (picked by index in candidate_kernel)
    _chained(PDL)
    pid = tl.program_id(0)
    row = tl.program_id(1)
    t, need, level_count = _threshold(hist16, hist8, row, P)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    key, inside = _keys(scores, row, C, offs, 16)
    above = inside & (key > t)
    base = tl.atomic_add(counters + row * 2, tl.sum(above.to(tl.int32), axis=0), sem="relaxed")
    slot = base + tl.cumsum(above.to(tl.int32), axis=0) - 1
    tl.store(top + row * P + slot, offs, mask=above & (slot < P - need))  # never past the row, whatever the counts
    level = inside & (key == t)
    base = tl.atomic_add(counters + row * 2 + 1, tl.sum(level.to(tl.int32), axis=0), sem="relaxed")
    slot = base + tl.cumsum(level.to(tl.int32), axis=0) - 1
    tl.store(ties + row * CAP + slot, offs, mask=level & (slot < CAP))
    if pid == 0:
        tl.store(ctl + row * 4, t)
        tl.store(ctl + row * 4 + 1, need)
        tl.store(ctl + row * 4 + 2, level_count)


@triton.jit
def _tied(scores, ties, row, rank, t, level_count, C: tl.constexpr, CAP: tl.constexpr, CHUNK: tl.constexpr):
    # the index of the rank-th lowest of the keys equal to the threshold t (those are picked lowest index first)
    if level_count <= CAP:  # from the tie list: each entry's rank is how many entries are below it
        e = tl.arange(0, CAP)
        listed = tl.load(ties + row * CAP + e, mask=e < level_count, other=2147483647)
        ranks = tl.sum((listed[None, :] < listed[:, None]).to(tl.int32), axis=1)
        c = tl.sum(tl.where((ranks == rank) & (e < level_count), listed, 0), axis=0)
    else:  # more ties than the list holds (degenerate scores): count them in index order
        c = tl.sum(tl.zeros((2,), dtype=tl.int32), axis=0)
        seen = c
        for c0 in range(0, C, CHUNK):
            offs = c0 + tl.arange(0, CHUNK)
            key, inside = _keys(scores, row, C, offs, 16)
            level = inside & (key == t)
            order = seen + tl.cumsum(level.to(tl.int32), axis=0) - 1
            c += tl.sum(tl.where(level & (order == rank), offs, 0), axis=0)
            seen += tl.sum(level.to(tl.int32), axis=0)
    return c


@triton.jit
def candidate_kernel(h, weight, top, bias, tokens, special_w, special_b, special_ids, best, scores, ties, ctl,
                     hist16, hist8, NS, P, NSP, C: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                     BLOCK_D: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # programs j < P: one probed cluster each (the first P - need from ``top``, the rest the lowest-index ties),
    # B rows plus slot bias; the next NSP: B special tokens each; each folds its best into the packed maximum.
    # Programs after them (only after pick_kernel) zero the histograms for the next call.
    _chained(PDL)
    j = tl.program_id(0)
    row = tl.program_id(1)
    slots = tl.arange(0, B)
    if j < P:
        t = tl.load(ctl + row * 4)
        need = tl.load(ctl + row * 4 + 1)
        if j < P - need:
            c = tl.load(top + row * P + j)
        else:
            c = _tied(scores, ties, row, j - (P - need), t, tl.load(ctl + row * 4 + 2), C, CAP, 1024)
        c = c.to(tl.int64)
        score = _dot_rows(h, row, weight + (c * B + slots) * D, slots < B, B, D, BLOCK_D)
        packed = _packed(score + tl.load(bias + c * B + slots), tl.load(tokens + c * B + slots))
        tl.atomic_max(best + row, tl.max(packed, axis=0))
    elif j < P + NSP:
        s = (j - P) * B + slots
        real = s < NS
        score = _dot_rows(h, row, special_w + s.to(tl.int64) * D, real, B, D, BLOCK_D)
        packed = tl.where(real, _packed(score + tl.load(special_b + s, mask=real, other=0.0),
                                        tl.load(special_ids + s, mask=real, other=0)), INT64_MIN)
        tl.atomic_max(best + row, tl.max(packed, axis=0))
    else:
        z = j - P - NSP
        key, inside = _keys(scores, row, C, z * BLOCK + tl.arange(0, BLOCK), 16)
        tl.store(hist16 + row * 65536 + key, 0, mask=inside)
        if z == 0:
            tl.store(hist8 + row * 256 + tl.arange(0, 256), tl.zeros((256,), dtype=tl.int32))


@triton.jit
def finish_kernel(best, out, counters, PDL: tl.constexpr):
    # the token id out of the row's packed maximum; the pick counters back to zero for the next call
    _chained(PDL)
    row = tl.program_id(0)
    tl.store(out + row, 0xFFFFFFFF - (tl.load(best + row) & 0xFFFFFFFF))
    tl.store(counters + row * 2, 0)
    tl.store(counters + row * 2 + 1, 0)
