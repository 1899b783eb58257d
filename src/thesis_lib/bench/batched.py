"""Heads at batch B (issue 48): the dense head against FlashHead on B hidden states at once.

At batch B the dense head is one matrix product that reads the vocabulary's rows once for all B rows, so its cost
per row falls as B grows. FlashHead probes its clusters row by row (each row's candidates are its own, exactly as
at B = 1), so B rows read the union of the clusters their rows probe: one row's worth where the rows agree, B times
that where they share nothing. :func:`candidate_union` counts that union on real states; :func:`heads_by_batch`
times both heads on the same states grouped B at a time, interleaved, keeping every timing for the intervals
(:mod:`thesis_lib.analysis.batched` reads them).
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from ..errors import ConfigError
from .disturbance import Watch
from .timing import interleaved, stats_ms

#: the batch sizes measured by default
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def candidate_union(head, states: torch.Tensor, batch: int) -> dict:
    """Over groups of ``batch`` consecutive ``states``, the mean number of distinct clusters the group's rows
    probe (``clusters``), the candidate rows that means (``rows``: clusters x cluster size, plus the special
    tokens scored on every row), and the clusters over one row's probes (``over_one_row``: 1 where every row
    probes the same clusters, ``batch`` where no two rows share one)."""
    groups = states.shape[0] // batch
    if groups < 1:
        raise ConfigError(f"{states.shape[0]} states make no group of {batch}.")
    top = head.top_clusters(states[: groups * batch], reference=False)
    distinct = [torch.unique(top[g * batch:(g + 1) * batch]).numel() for g in range(groups)]
    mean = statistics.fmean(distinct)
    return {"groups": groups, "clusters": mean, "rows": mean * head.cluster_size + head.special_ids.numel(),
            "over_one_row": mean / head.n_probes}


def serving_order(states: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``states`` in a seeded random order: the rows of a served batch come from different requests at different
    positions, while consecutive states of one generation probe nearly the same clusters."""
    return states[torch.randperm(states.shape[0], generator=torch.Generator().manual_seed(seed))]


def heads_by_batch(heads: dict[str, object], states: torch.Tensor, flash: str = "flashhead",
                   batch_sizes: Sequence[int] = BATCH_SIZES, *, base: str = "dense", reps: int = 3,
                   warmup: int = 3, progress: bool = True, order_seed: int | None = 0) -> dict:
    """For each batch size B: every head's greedy call (a module or a function of ``[B, D]`` states; the first
    must be a module, whose device the clocks use) on ``[B, D]`` groups of the same ``states`` (as many whole
    groups as the states make), interleaved; the median per call and per row; every timing (repetition-major over
    the groups); and the union of ``flash``'s candidate rows (:func:`candidate_union`) beside the dense head's
    whole vocabulary. With ``order_seed`` the states are first put in :func:`serving_order` (None: as given, each
    group then holds consecutive states of one generation)."""
    if order_seed is not None:
        states = serving_order(states, order_seed)
    if base not in heads or flash not in heads:
        raise ConfigError(f"heads_by_batch needs the {base!r} and {flash!r} heads, got {', '.join(heads)}.")
    device = next(iter(heads.values())).device
    vocab = getattr(heads[base], "vocab_limit", None)
    out = {}
    for b in batch_sizes:
        n = states.shape[0] // b
        if n < 2:
            raise ConfigError(f"batch {b} needs at least {2 * b} states (two groups), got {states.shape[0]}.")
        groups = [states[i * b:(i + 1) * b].contiguous().to(device) for i in range(n)]
        fns = {name: (lambda i, h=h: h(groups[i])) for name, h in heads.items()}
        with Watch() as machine:
            times = interleaved(fns, n, reps=reps, warmup=warmup, desc=f"heads at batch {b}", progress=progress,
                                device=device)
        stats = {name: stats_ms(ts) for name, ts in times.items()}
        out[str(b)] = {
            "groups": n, "stats": stats, "per_row_ms": {k: s["p50_ms"] / b for k, s in stats.items()},
            "union": candidate_union(heads[flash], states, b), "dense_rows": vocab,
            "times_ms": {k: [round(1e3 * t, 6) for t in ts] for k, ts in times.items()}, "machine": machine.record}
    return {"batch_sizes": list(batch_sizes), "base": base, "flash": flash, "order_seed": order_seed, "by_batch": out}
