"""Greedy decoding of B prompts at once: batched target-only decoding, and batched speculative decoding in which
every row accepts its own number of tokens per round (the thesis' open question of batch sizes above one).

Ragged rows, by per-row cache lengths. :class:`RaggedCache` keeps one ``[B, Hkv, capacity, d]`` tensor per layer
and each row's own length. A forward feeds every row the same number of positions; row b writes its real tokens
at its own length onwards, and a row with fewer real tokens than the widest is padded at the end. A round then
crops each row by its own rejected count, which only lowers that row's length: the next forward overwrites what
lay beyond. So a row's keys are always one contiguous prefix (the prompt and its accepted output, nothing else).
The other choice, a shared length with rejected and padded positions masked out, leaves holes that grow every
round and make each row's attention differ from its one-row computation. Here each row's query runs through
:func:`thesis_lib.models.attention.exact_attention` with exactly its prefix, and the weight-only kernels compute
each row alone, so every row of a batched forward equals, bit for bit, that row's one-row decoding: greedy
output per row is target-only greedy output (tested on tiny models and the real pair).

Prompts are prefilled one row at a time (each exactly as the one-row loops do it) and gathered into the ragged
cache. A row that ends (EOS or its token budget) leaves the batch, so the others stop paying for it.

The round, per row, is the one-row loop's (:mod:`~thesis_lib.decoding.greedy`): the draft proposes
``min(k, tokens left - 1)`` tokens for that row (all rows draft the widest row's count; a row keeps its own
first ones), the target verifies them (deferred: behind the row's carried final token), the row emits its
accepted prefix and the target's token. Ordinary schedule: a row whose first proposal disagrees with its known
next token skips verification (it is padding in that forward; the forward is not run when every row skips);
every row then appends its final token in one batched forward.

:func:`batched_greedy` and :func:`batched_speculative` return a :class:`BatchRun`: one
:class:`~thesis_lib.decoding.stats.Generation` per prompt (its ``ttft_s`` and ``decode_s`` measured from the
batch's start: a row's latency) and the batch's wall time and phase seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache

from thesis_lib.errors import ConfigError
from thesis_lib.decoding.clocks import PhaseClock
from thesis_lib.decoding.state import ModelState
from thesis_lib.decoding.rounds import accepted_prefix, check_request, emit_round
from thesis_lib.decoding.stats import FINALIZE, PREFILL, PROPOSE, VERIFY, DecodeStats, Generation


class RaggedCache:
    """Keys and values of B token sequences of different lengths (module docstring). The model calls
    :meth:`update` once per layer in a forward; :meth:`feed` prepares that forward and :meth:`advance` /
    :meth:`crop` / :meth:`keep` change the rows between forwards."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], lengths: list[int]):
        self.layers = layers
        self.lengths = list(lengths)
        self._offsets: list[int] | None = None

    @classmethod
    def from_rows(cls, caches: Sequence[DynamicCache], capacity: int) -> "RaggedCache":
        """Gather one-row caches (each ``[1, Hkv, L_b, d]`` per layer) into ``capacity`` positions per row."""
        lengths = [c.get_seq_length() for c in caches]
        if max(lengths) > capacity:
            raise ValueError(f"a row holds {max(lengths)} positions; capacity {capacity}")
        layers = []
        for i in range(len(caches[0].layers)):
            k0 = caches[0].layers[i].keys
            shape = (len(caches), k0.shape[1], capacity, k0.shape[3])
            k, v = k0.new_zeros(shape), k0.new_zeros(shape)
            for b, c in enumerate(caches):
                k[b, :, :lengths[b]] = c.layers[i].keys[0]
                v[b, :, :lengths[b]] = c.layers[i].values[0]
            layers.append((k, v))
        return cls(layers, lengths)

    @property
    def capacity(self) -> int:
        return self.layers[0][0].shape[2]

    def feed(self, counts: Sequence[int], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepare a forward of ``width`` positions per row, the first ``counts[b]`` real: the position ids
        ``[B, width]`` and the boolean mask ``[B, 1, width, kv]`` (a real query sees its row's prefix up to itself; a
        padded one only the row's first position: a finite result that is discarded, at the least cost)."""
        off = self.lengths
        if max(off) + width > self.capacity:
            raise ValueError(f"a forward of {width} positions overflows the cache's {self.capacity}")
        self._offsets = list(off)
        kv = max(off) + width
        start = torch.tensor(off, device=device)
        j = torch.arange(width, device=device)
        positions = start[:, None] + j
        seen = torch.where(j < torch.tensor(counts, device=device)[:, None], positions + 1, 1)  # [B, width]
        mask = torch.arange(kv, device=device) < seen[..., None]
        return positions, mask[:, None]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write a forward's keys and values at each row's length; return every row's positions so far."""
        k, v = self.layers[layer_idx]
        width = key.shape[2]
        for b, o in enumerate(self._offsets):
            k[b, :, o:o + width] = key[b]
            v[b, :, o:o + width] = value[b]
        kv = max(self._offsets) + width
        return k[:, :, :kv], v[:, :, :kv]

    def advance(self, counts: Sequence[int]) -> None:
        """After a forward: row b now holds its ``counts[b]`` real tokens more."""
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]
        self._offsets = None

    def crop(self, removes: Sequence[int]) -> None:
        """Forget the last ``removes[b]`` positions of row b."""
        if any(not 0 <= r <= n for r, n in zip(removes, self.lengths)):
            raise ValueError(f"cannot remove {list(removes)} of {self.lengths} cached positions")
        self.lengths = [n - r for n, r in zip(self.lengths, removes)]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order)."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.layers[0][0].device)
        self.layers = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.layers]
        self.lengths = [self.lengths[r] for r in rows]


class BatchState:
    """A model, its greedy head and a :class:`RaggedCache` over the rows of a batch (``ModelState`` for B rows)."""

    def __init__(self, state: ModelState):
        self.state = state
        self.cache: RaggedCache | None = None

    def prefill(self, rows: Sequence[Sequence[int]], capacity: int, clock: PhaseClock | None = None,
                done_at: list[float] | None = None) -> list[int]:
        """Run each row's tokens alone (as the one-row loops do) and gather the caches; returns each row's greedy
        token after its last position (``done_at[b]``: the clock's time when row b's token was known)."""
        caches, first = [], []
        for ids in rows:
            self.state.reset()
            first.append(int(self.state.greedy(ids, last_only=True)))
            caches.append(self.state.cache)
            if done_at is not None:
                done_at.append(clock.now())
        self.cache = RaggedCache.from_rows(caches, capacity)
        self.state.reset()
        return first

    def hidden(self, feeds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Feed each row its tokens (ragged; at least one row non-empty) after its cache; returns each row's final
        hidden states ``[n_b, D]``. The cache advances by each row's count."""
        counts = [len(f) for f in feeds]
        width = max(counts)
        ids = torch.tensor([list(f) + [f[-1] if f else 0] * (width - len(f)) for f in feeds],
                           dtype=torch.long, device=self.state.device)
        positions, mask = self.cache.feed(counts, width, self.state.device)
        out = self.state.body(input_ids=ids, attention_mask=mask, position_ids=positions,
                              past_key_values=self.cache, use_cache=True)
        self.cache.advance(counts)
        return [out.last_hidden_state[b, :n] for b, n in enumerate(counts)]

    def greedy(self, feeds: Sequence[Sequence[int]]) -> list[list[int]]:
        """:meth:`hidden`, then per row the greedy token after each fed position (one head call for all rows)."""
        h = self.hidden(feeds)
        tokens = self.state.head(torch.cat(h)).tolist()
        rows, at = [], 0
        for x in h:
            rows.append(tokens[at:at + len(x)])
            at += len(x)
        return rows


@dataclass
class BatchRun:
    """One batch's generations (prompt order), its wall time, and the seconds of each phase of its loop."""

    generations: list[Generation]
    seconds: float
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)

    @property
    def tokens_per_s(self) -> float:
        """All rows' new tokens over the batch's wall time (prefills included)."""
        return self.new_tokens / self.seconds


def _check(prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int | None = None) -> None:
    if not prompts:
        raise ConfigError("A batch needs at least one prompt.")
    for p in prompts:
        check_request(max_new_tokens, p, k)


class _Rows:
    """Per-row bookkeeping of a batched loop: outputs, stats, finish times, and which rows are still running."""

    def __init__(self, n: int, mode: str, k: int, clock: PhaseClock, t0: float):
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.stats = [DecodeStats(mode=mode, k=k) for _ in range(n)]
        self.first_at: list[float] = []
        self.done_at = [0.0] * n
        self.active = list(range(n))
        self.clock, self.t0 = clock, t0

    def close(self, finished: Sequence[int]) -> list[int]:
        """Mark rows (ids) done now; return the positions, in the active list, of the rows that go on."""
        now = self.clock.now()
        for r in finished:
            self.done_at[r] = now
        keep = [i for i, r in enumerate(self.active) if r not in finished]
        self.active = [self.active[i] for i in keep]
        return keep

    def result(self, eos: frozenset[int], seconds: float) -> BatchRun:
        gens = []
        for r, (out, st) in enumerate(zip(self.out, self.stats)):
            st.new_tokens = len(out)
            st.stopped_by = "eos" if out[-1] in eos else "max_new_tokens"
            st.ttft_s, st.decode_s = self.first_at[r] - self.t0, self.done_at[r] - self.first_at[r]
            gens.append(Generation(out, st))
        return BatchRun(gens, seconds, self.clock.as_dict())


def _first_tokens(rows: _Rows, first: list[int], eos: frozenset[int], max_new_tokens: int) -> list[int]:
    """Emit each row's prefill token; close the rows it ends; the active positions that go on."""
    for r, t in enumerate(first):
        rows.out[r].append(t)
    return rows.close([r for r in range(len(first)) if first[r] in eos or max_new_tokens == 1])


def batched_greedy(target: ModelState, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                   eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> BatchRun:
    """Target-only greedy decoding of every prompt at once: one batched forward per token over the rows left."""
    with torch.inference_mode():
        _check(prompts, max_new_tokens)
        clock = clock or PhaseClock([target.device])
        eos = frozenset(eos_ids)
        t0 = clock.now()
        rows = _Rows(len(prompts), "baseline", 0, clock, t0)
        batch = BatchState(target)
        with clock.phase(PREFILL):
            first = batch.prefill(prompts, max(map(len, prompts)) + max_new_tokens, clock, rows.first_at)
        batch.cache.keep(_first_tokens(rows, first, eos, max_new_tokens))
        while rows.active:
            with clock.phase(VERIFY):
                nxt = batch.greedy([[rows.out[r][-1]] for r in rows.active])
            finished = []
            for r, t in zip(rows.active, nxt):
                rows.out[r].append(t[0])
                rows.stats[r].append_calls += 1
                if t[0] in eos or len(rows.out[r]) >= max_new_tokens:
                    finished.append(r)
            if finished:
                batch.cache.keep(rows.close(finished))
        return rows.result(eos, clock.now() - t0)


def batched_speculative(target: ModelState, draft: ModelState, prompts: Sequence[Sequence[int]], *, k: int,
                        max_new_tokens: int, eos_ids: Sequence[int] = (), schedule: str = "deferred",
                        name: str = "dense", clock: PhaseClock | None = None) -> BatchRun:
    """Greedy speculative decoding of every prompt at once (module docstring), ``schedule`` ``ordinary`` or
    ``deferred``; ``draft`` is the draft model's state with its dense or FlashHead head (``name`` names it)."""
    with torch.inference_mode():
        if schedule not in ("ordinary", "deferred"):
            raise ConfigError(f"Batched speculative decoding runs the ordinary or deferred schedule, not {schedule!r}.")
        _check(prompts, max_new_tokens, k)
        deferred = schedule == "deferred"
        clock = clock or PhaseClock([target.device, draft.device])
        eos = frozenset(eos_ids)
        t0 = clock.now()
        rows = _Rows(len(prompts), f"{name}_{schedule}", k, clock, t0)
        tgt, drf = BatchState(target), BatchState(draft)
        capacity = max(map(len, prompts)) + max_new_tokens + k + 2
        with clock.phase(PREFILL):
            first = tgt.prefill(prompts, capacity, clock, rows.first_at)
        go = _first_tokens(rows, first, eos, max_new_tokens)
        tgt.cache.keep(go)
        if not rows.active:
            return rows.result(eos, clock.now() - t0)
        # the draft reads each prompt and its first token: its greedy token there is the row's first proposal
        with clock.phase(PROPOSE, draft.device):
            lead = drf.prefill([list(prompts[r]) + rows.out[r] for r in rows.active], capacity)
        pending: list[list[int]] = [[] for _ in rows.active]  # per active row: tokens the draft has not fed yet
        nxt: list[int] = []  # ordinary: per active row, the target's next token (its cache holds every emitted token)
        if not deferred:
            with clock.phase(FINALIZE, target.device):
                nxt = [t[0] for t in tgt.greedy([[rows.out[r][-1]] for r in rows.active])]
            for r in rows.active:
                rows.stats[r].append_calls += 1
        while rows.active:
            left = [max_new_tokens - len(rows.out[r]) for r in rows.active]
            ks = [min(k, n - 1) for n in left]
            widest = max(ks)
            # 1. proposals: every row drafts `widest` tokens, keeping its first ks[i]
            drafted = [[t] for t in lead] if lead else [[] for _ in rows.active]
            with clock.phase(PROPOSE, draft.device):
                if not lead and widest:
                    drafted = [[t[-1]] for t in drf.greedy(pending)]
                    pending = [[] for _ in rows.active]
                while widest and len(drafted[0]) < widest:
                    step = drf.greedy([[d[-1]] for d in drafted])
                    drafted = [d + t for d, t in zip(drafted, step)]
            lead = []
            ys = [d[:kk] for d, kk in zip(drafted, ks)]
            # 2. verification, one batched target forward
            with clock.phase(VERIFY, target.device):
                if deferred:
                    feeds = [[rows.out[r][-1]] + y for r, y in zip(rows.active, ys)]
                else:
                    feeds = [y if y and y[0] == n else [] for y, n in zip(ys, nxt)]
                verdicts = tgt.greedy(feeds) if any(feeds) else [[] for _ in feeds]
            results = []  # per active row: (accepted, correction, target positions to drop)
            for i, (r, y, f, t) in enumerate(zip(rows.active, ys, feeds, verdicts)):
                st = rows.stats[r]
                if deferred:
                    n = accepted_prefix(y, t)
                    results.append((n, t[n], len(y) - n))
                    st.verify_calls += bool(y)  # without proposals it is the tail's append, counted below
                elif not y:  # one token left: the target knows it
                    results.append((0, nxt[i], 0))
                elif not f:
                    results.append((0, nxt[i], 0))
                    st.skipped += 1
                else:
                    n = 1 + accepted_prefix(y[1:], t[:-1])
                    results.append((n, t[n - 1], len(y) - n))
                    st.verify_calls += 1
            # 3. emission and 4. alignment, per row
            finished = []
            for (n, correction, _), r, y, kk in zip(results, rows.active, ys, ks):
                if kk == 0:
                    if deferred:
                        rows.stats[r].append_calls += 1  # the carried token's verify is the tail's append
                    rows.out[r].append(correction)
                    rows.stats[r].tail_tokens += 1
                    finished.append(r)
                elif emit_round(rows.stats[r], rows.out[r], y, n, correction, kk, eos, max_new_tokens):
                    finished.append(r)
            with clock.phase(FINALIZE):
                tgt.cache.crop([drop for _, _, drop in results])
                # the draft fed drafted[:-1]; keep what was accepted, queue the rest of the row's story
                drf.cache.crop([max(widest - 1 - n, 0) for n, _, _ in results] if widest else [0] * len(results))
                if widest:
                    pending = [([d[-1]] if n == widest else []) + [c] for d, (n, c, _) in zip(drafted, results)]
                else:
                    pending = [p + [c] for p, (_, c, _) in zip(pending, results)]
                keep = rows.close(finished) if finished else list(range(len(results)))
                if finished:
                    for cache in (tgt.cache, drf.cache):
                        cache.keep(keep)
                    pending = [pending[i] for i in keep]
                if not deferred and rows.active:
                    nxt = [t[0] for t in tgt.greedy([[results[i][1]] for i in keep])]
                    for r in rows.active:
                        rows.stats[r].append_calls += 1
        return rows.result(eos, clock.now() - t0)
