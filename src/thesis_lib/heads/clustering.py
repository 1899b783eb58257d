"""FlashHead's offline step: equal-size spherical k-means over a model's output embedding (thesis section 2.5).

Rows of the ``V x D`` embedding are compared by direction (cosine). Every cluster holds ``b = ceil(V / C)`` or
``b - 1`` tokens (:func:`capacities`, ``C`` in ``1..V``), so the cluster-to-token table is rectangular; a short
cluster is padded with its lowest token id, as Embedl's loader does. :func:`balanced_assign` is the
capacity-constrained step: points propose to their best clusters in turn, each cluster keeps the best-scoring
proposals that fit. :func:`spherical_kmeans` stores each centroid as the plain mean of its members' raw rows
(Embedl's format, :mod:`thesis_lib.heads.assets`): the greedy head normalises it, the sampling head reads
``h . c`` as the cluster's mean logit. The seeded result is deterministic for one machine and thread count.
Where the CPU has fast bfloat16, the similarities (which only rank clusters) are bfloat16; updates stay float32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ClusteringAssetError, ConfigError
from ..models.cpu import fast_bf16

ALGORITHM_VERSION = 1  # bump when the algorithm changes what it produces


@dataclass
class Clustering:
    """A partition of the vocabulary into ``C`` clusters plus one centroid per cluster."""

    centroids: torch.Tensor  # [C, D] float32, plain means of the members' rows
    assignments: torch.Tensor  # [V] int64 in 0..C-1
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_clusters(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.assignments.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.centroids.shape[1])

    def sizes(self) -> torch.Tensor:
        return torch.bincount(self.assignments, minlength=self.n_clusters)

    def cluster_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [C, b], real [C, b])``: each cluster's token ids in ascending order, padded with its lowest id
        (``real`` False there); ``b`` is the largest cluster size."""
        sizes = self.sizes()
        if int(sizes.min()) < 1:
            raise ClusteringAssetError("a cluster is empty; FlashHead needs every cluster to hold at least one token")
        b = int(sizes.max())
        # Sort tokens by (cluster, id): a stable sort by cluster of the ids 0..V-1 does it.
        order = torch.sort(self.assignments, stable=True).indices
        starts = torch.cumsum(sizes, 0) - sizes
        slot = torch.arange(self.vocab_size) - starts[self.assignments[order]]
        tokens = torch.empty(self.n_clusters, b, dtype=torch.long)
        tokens[:] = order[starts].unsqueeze(1)  # pad with the cluster's lowest id
        tokens[self.assignments[order], slot] = order
        real = torch.arange(b).unsqueeze(0) < sizes.unsqueeze(1)
        return tokens, real


def default_clusters(vocab_size: int) -> int:
    """FlashHead's default cluster count: V/16 (clusters of 16 tokens)."""
    return vocab_size // 16


def check_cluster_count(vocab_size: int, n_clusters: int) -> None:
    if not 1 <= int(n_clusters) <= int(vocab_size):
        raise ConfigError(f"n_clusters={n_clusters} does not fit a vocabulary of {vocab_size} rows: use 1..{vocab_size} "
                          f"(FlashHead's default is V/16 = {default_clusters(vocab_size)}).")


def capacities(vocab_size: int, n_clusters: int) -> torch.Tensor:
    """Cluster sizes: ``b = ceil(V / C)`` for the first clusters, ``b - 1`` for the rest, summing to V."""
    check_cluster_count(vocab_size, n_clusters)
    b = math.ceil(vocab_size / n_clusters)
    big = vocab_size - n_clusters * (b - 1)
    cap = torch.full((n_clusters,), b - 1, dtype=torch.long)
    cap[:big] = b
    return cap


def _topm(xn: torch.Tensor, cn: torch.Tensor, m: int, chunk: int, low_precision: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """For each point, its ``m`` most similar clusters (ids sorted by score, best first) and their scores."""
    n = xn.shape[0]
    cand = torch.empty(n, m, dtype=torch.long)
    score = torch.empty(n, m, dtype=torch.float32)
    cl = cn.to(torch.bfloat16) if low_precision else cn
    for s in range(0, n, chunk):
        x = xn[s : s + chunk]
        sim = (x.to(torch.bfloat16) if low_precision else x) @ cl.T
        top = sim.topk(m, dim=1)  # sorted, best first
        cand[s : s + chunk] = top.indices
        score[s : s + chunk] = top.values
    return cand, score


def _propose_rounds(points: torch.Tensor, cand: torch.Tensor, score: torch.Tensor, remaining: torch.Tensor,
                    assign: torch.Tensor) -> torch.Tensor:
    """Capacity-constrained assignment in rounds; returns the points left unassigned. Updates in place."""
    n_c = remaining.shape[0]
    m = cand.shape[1]
    ptr = torch.zeros(points.shape[0], dtype=torch.long)
    active = torch.arange(points.shape[0])
    for _ in range(m):
        if active.numel() == 0:
            break
        c = cand[active, ptr[active]]
        s = score[active, ptr[active]]
        # group proposals by cluster, best score first within a cluster (ties: lower point index first)
        o = torch.sort(s, descending=True, stable=True).indices
        o = o[torch.sort(c[o], stable=True).indices]
        cs = c[o]
        counts = torch.bincount(cs, minlength=n_c)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(cs.shape[0]) - starts[cs]
        ok = rank < remaining[cs]
        won = active[o[ok]]
        assign[points[won]] = cs[ok]
        remaining -= torch.bincount(cs[ok], minlength=n_c)
        active = active[o[~ok]]
        ptr[active] += 1
    return points[active]


def balanced_assign(xn: torch.Tensor, cn: torch.Tensor, cap: torch.Tensor, *, m: int = 32, chunk: int = 8192,
                    low_precision: bool = False) -> tuple[torch.Tensor, int]:
    """Assign every row of ``xn`` to a cluster so that cluster ``j`` gets exactly ``cap[j]`` rows; returns the
    assignment and the number of passes (each ranks the clusters with room for the points still unplaced)."""
    n = xn.shape[0]
    if int(cap.sum()) != n:
        raise ValueError("capacities must sum to the number of points")
    assign = torch.full((n,), -1, dtype=torch.long)
    remaining = cap.clone()
    left = torch.arange(n)
    passes = 0
    while left.numel():
        passes += 1
        free = torch.nonzero(remaining > 0).flatten()
        mm = min(m if passes == 1 else 4 * m, free.numel())
        cand, score = _topm(xn[left], cn[free], mm, chunk, low_precision)
        sub = remaining[free].clone()
        sub_assign = torch.full((n,), -1, dtype=torch.long)
        left = _propose_rounds(left, cand, score, sub, sub_assign)
        placed = sub_assign >= 0
        assign[placed] = free[sub_assign[placed]]
        remaining[free] = sub
    return assign, passes


def member_means(w: torch.Tensor, assign: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """Each cluster's centroid as its members' raw mean (Embedl's format): ``[C, d]`` from rows ``w`` ``[V, d]``,
    their clusters ``assign`` and the cluster sizes ``cap``."""
    return torch.zeros(cap.numel(), w.shape[1]).index_add_(0, assign, w) / cap.unsqueeze(1).to(w.dtype)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def spherical_kmeans(weight: torch.Tensor, n_clusters: int, *, iterations: int = 20, seed: int = 0, tol: float = 1e-3,
                     candidates: int = 32, low_precision: bool | None = None, progress: bool = True) -> Clustering:
    """Equal-size spherical k-means of the rows of ``weight`` (``[V, D]``) into ``n_clusters`` clusters.

    Stops after ``iterations`` or once fewer than ``tol`` of the points change cluster in an iteration.
    ``low_precision=None`` uses bfloat16 similarities for the candidate lists where the CPU has fast bf16.
    """
    from ..progress import tqdm

    w = weight.detach().to(torch.float32).cpu()
    v, d = w.shape
    cap = capacities(v, n_clusters)
    low_precision = fast_bf16() if low_precision is None else low_precision
    t0 = time.perf_counter()
    xn = _normalise(w)
    g = torch.Generator().manual_seed(int(seed))
    init = torch.randperm(v, generator=g)[:n_clusters]
    cn = xn[init].clone()
    assign = None
    history = []
    bar = tqdm(range(iterations), desc=f"k-means V={v} C={n_clusters}", disable=not progress, unit="it")
    for it in bar:
        new, passes = balanced_assign(xn, cn, cap, m=candidates, low_precision=low_precision)
        moved = 1.0 if assign is None else float((new != assign).float().mean())
        assign = new
        sums = torch.zeros(n_clusters, d).index_add_(0, assign, xn)
        cn = _normalise(sums)
        objective = float((xn * cn[assign]).sum(-1).mean())
        history.append({"iteration": it + 1, "moved": moved, "mean_cosine": objective, "passes": passes})
        bar.set_postfix(moved=f"{moved:.4f}", cos=f"{objective:.4f}")
        if moved < tol:
            break
    bar.close()
    means = member_means(w, assign, cap)
    info = {
        "algorithm": "equal-size spherical k-means",
        "algorithm_version": ALGORITHM_VERSION,
        "n_clusters": int(n_clusters),
        "seed": int(seed),
        "max_iterations": int(iterations),
        "iterations": len(history),
        "tol": tol,
        "candidates": int(candidates),
        "similarity_dtype": "bfloat16" if low_precision else "float32",
        "seconds": round(time.perf_counter() - t0, 2),
        "threads": torch.get_num_threads(),
        "history": history,
    }
    return Clustering(centroids=means, assignments=assign, info=info)


#: a k-means iteration's seconds over its first candidate ranking's (the later passes, the proposal rounds, the
#: update): 1.27-1.72 on the embedded draft's head (C = 2,374-9,496, bfloat16 and float32), measurement log
ITERATION_OVER_RANKING = 1.5


def kmeans_seconds(vocab_size: int, hidden: int, n_clusters: int, *, iterations: int = 20,
                   low_precision: bool | None = None, rows: int = 4096) -> float:
    """:func:`spherical_kmeans`' seconds on this machine, predicted before it starts: the candidate ranking of
    ``rows`` random unit rows against ``n_clusters`` centroids, timed (the faster of two), scaled to
    ``vocab_size`` rows and ``iterations`` iterations (each one run: an upper bound where it stops early) by
    :data:`ITERATION_OVER_RANKING`."""
    low_precision = fast_bf16() if low_precision is None else low_precision
    g = torch.Generator().manual_seed(0)
    xn = _normalise(torch.randn(min(rows, vocab_size), hidden, generator=g))
    cn = _normalise(torch.randn(n_clusters, hidden, generator=g))
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        _topm(xn, cn, min(32, n_clusters), 8192, low_precision)
        best = min(best, time.perf_counter() - t0)
    return best * vocab_size / xn.shape[0] * iterations * ITERATION_OVER_RANKING


def random_clustering(vocab: int, hidden: int, n_clusters: int, seed: int = 0) -> Clustering:
    """An equal-size random partition of ``vocab`` tokens with random centroids (latency work only)."""
    g = torch.Generator().manual_seed(seed)
    assignments = torch.randperm(vocab, generator=g) % n_clusters
    return Clustering(centroids=torch.randn(n_clusters, hidden, generator=g), assignments=assignments,
                      info={"algorithm": "random equal-size partition (gpu-check: latency only)"})
