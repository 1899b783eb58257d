"""Does a sampler reproduce a known distribution? The empirical proof that speculative sampling is lossless.

:func:`exact_distribution` computes target-only sampling's exact distribution of the first ``n`` generated
tokens by enumerating every prefix (small vocabularies only: ``V ** (n - 1)`` forwards). :func:`check`
compares counts of sampled sequences with it, cell by cell: each sequence's count gets a binomial z-score, and
the largest ``|z|`` is tested at family-wise level ``alpha`` (Bonferroni over the cells). A sequence that
has probability 0 but was drawn fails at once. :func:`draws_for_power` says how many draws make the check
catch, with the requested power, an absolute error of ``delta`` in the hardest cell (the one with the
largest binomial variance): ``N = ((z_crit + z_power) * sqrt(p (1 - p)) / delta) ** 2``. Power is computed
with the normal approximation to the binomial, stated as such. :func:`draw_sequences` makes the draws in
seeded chunks over one process per core (the draws are independent and single-threaded), with the same
result for any number of processes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Iterable, Sequence

import torch

from ..decoding import sampling
from ..decoding.sampling import Sampler
from ..decoding.state import ModelState
from ..heads.clustering import spherical_kmeans
from ..heads.dense import DenseGreedyHead
from ..heads.flashhead import FlashHead
from ..models import tiny


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _z(q: float) -> float:
    """The standard normal quantile."""
    return float(torch.special.ndtri(torch.tensor(q, dtype=torch.float64)))


@torch.inference_mode()
def exact_distribution(model, prompt_ids: Sequence[int], n: int, sampler: Sampler,
                       vocab_limit: int | None = None) -> dict[tuple[int, ...], float]:
    """Target-only sampling's probability of every sequence of the first ``n`` tokens (zeros left out)."""
    sampler.check()
    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, pr in dist.items():
            ids = torch.tensor([list(prompt_ids) + list(prefix)], dtype=torch.long)
            logits = model(input_ids=ids).logits[0, -1].float()
            if vocab_limit is not None:
                logits = logits[:vocab_limit]
            probs = sampler.probs(logits)
            for tok in torch.nonzero(probs > 0).flatten().tolist():
                nxt[prefix + (tok,)] = pr * float(probs[tok])
        dist = nxt
    return dist


#: Cells expected fewer times than this are pooled into one "rest" cell (the normal approximation needs counts).
MIN_EXPECTED = 5.0


def critical_z(cells: int, alpha: float) -> float:
    """Two-sided, Bonferroni over ``cells``."""
    return _z(1 - alpha / (2 * cells))


def _hardest(exact: dict) -> float:
    return max(exact.values(), key=lambda v: v * (1 - v))


def draws_for_power(exact: dict, *, delta: float = 0.01, alpha: float = 1e-3, power: float = 0.99) -> int:
    """Draws needed to catch an absolute error ``delta`` in the hardest cell with probability ``power``, with
    the Bonferroni bound over the cells :func:`check` will test at that many draws (found by iterating)."""
    p = _hardest(exact)

    def tested(draws: int) -> int:
        big = sum(draws * q >= MIN_EXPECTED for q in exact.values())
        return big + (big < len(exact))  # plus the pooled "rest" cell, if any

    cells = len(exact)
    for _ in range(20):
        z = critical_z(cells, alpha) + _z(power)
        draws = math.ceil((z * math.sqrt(p * (1 - p)) / delta) ** 2)
        if tested(draws) >= cells:
            break
        cells = tested(draws)
    # the cell count at the final number of draws decides the Bonferroni bound: make sure the power holds there
    while power_at(exact, draws, delta=delta, alpha=alpha, cells=tested(draws)) < power:
        draws = math.ceil(draws * 1.002) + 1
    return draws


def power_at(exact: dict, draws: int, *, delta: float = 0.01, alpha: float = 1e-3, cells: int | None = None) -> float:
    """Normal-approximation power of :func:`check` against an error ``delta`` in the hardest cell."""
    p = _hardest(exact)
    zc = critical_z(cells or len(exact), alpha)
    shift = delta * math.sqrt(draws) / math.sqrt(p * (1 - p))
    return _phi(shift - zc) + _phi(-shift - zc)


def check(samples: Iterable[Sequence[int]], exact: dict[tuple[int, ...], float], *, alpha: float = 1e-3,
          delta: float = 0.01) -> dict:
    """Compare sampled sequences with the exact distribution; ``ok`` is False when the largest ``|z|`` passes
    the Bonferroni bound or an impossible sequence (probability 0) was drawn. Sequences expected fewer than
    :data:`MIN_EXPECTED` times are pooled into one cell. Returns the numbers behind the verdict."""
    counts = Counter(tuple(s) for s in samples)
    n = sum(counts.values())
    impossible = sum(c for k, c in counts.items() if k not in exact)
    big = {k: p for k, p in exact.items() if n * p >= MIN_EXPECTED}
    cells = {k: (counts.get(k, 0), p) for k, p in big.items()}
    pooled = [p for k, p in exact.items() if k not in big]
    if pooled:  # (1 - sum(big) would leave a float-rounding "rest" cell when nothing is pooled)
        cells["rest"] = (n - impossible - sum(c for c, _ in cells.values()), sum(pooled))
    zc = critical_z(len(cells), alpha)
    worst_key, worst_z = None, 0.0
    for key, (c, p) in cells.items():
        z = (c - n * p) / math.sqrt(n * p * (1 - p)) if 0 < p < 1 else 0.0
        if abs(z) > abs(worst_z):
            worst_key, worst_z = key, z
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in cells.values() if p > 0)  # for reference only
    return {"draws": n, "cells": len(cells), "pooled_sequences": len(exact) - len(big), "alpha": alpha,
            "critical_z": zc, "max_abs_z": abs(worst_z), "z": worst_z,
            "worst_cell": worst_key if worst_key in (None, "rest") else list(worst_key),
            "impossible_draws": impossible, "chi2": chi2, "delta": delta,
            "power": power_at(exact, n, delta=delta, alpha=alpha, cells=len(cells)),
            "ok": impossible == 0 and abs(worst_z) <= zc}


# --- the stated experiment: tiny models, 8-token vocabulary (shared by the test suite and `thesis-lib sampling-check`)

VOCAB = 8
PROMPT = (1, 2, 3)
#: (sampler, tokens checked, K)
CASES = (
    (Sampler(1.0), 3, 2),
    (Sampler(0.8, top_k=4, top_p=0.9), 4, 3),
)


class _one_thread:
    """Tiny models gain nothing from a second thread, and where the cores are shared (a notebook kernel beside
    other work) a parallel region can wait a whole scheduler slice for its second thread: ~40x slower."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def tiny_pair(vocab: int = VOCAB):
    """A tiny random target, a noisy copy as its draft, and a FlashHead over the draft's head (4 clusters,
    2 probes, reference path): small enough to enumerate, different enough that rejections happen."""
    target = tiny.tiny_model("qwen2", vocab_size=vocab, seed=0, init_std=0.4)
    draft = tiny.noisy_copy(target, scale=0.15, seed=3)
    w = draft.get_output_embeddings().weight.detach()
    flash = FlashHead(w, spherical_kmeans(w, 4, progress=False), n_probes=2, path="reference")
    return target, draft, flash


#: Draws come in chunks of this many, each from its own generator (seeded by the run's seed and the chunk's
#: index), so a check's draws are the same whether one process or several make them.
CHUNK = 250


def _drawer(pair, control: bool, case: int, draft_kind: str, schedule: str, g: torch.Generator):
    """``draw() -> first n tokens`` for one configuration (``control``: the wrong always-accept rule), and
    the ``[accepted, drafted]`` counts it keeps."""
    target, draft, flash = pair
    s, n, k = CASES[case]
    seen = [0, 0]
    ts = ModelState(target)
    if control:
        d, head = sampling.SamplingModelDrafter(draft, s), DenseGreedyHead.from_model(target)

        def draw():
            ts.reset()
            first = sampling.draw(sampling.target_probs(ts, head, PROMPT, s)[-1], g)  # the target's first token
            d.begin(list(PROMPT) + [first])
            y, _ = d.propose(n - 1, g)
            return [first] + y
        return draw, seen
    d = sampling.SamplingModelDrafter(draft, s, flash_head=flash if draft_kind == "flash" else None)

    def draw():
        gen = sampling.speculative_sample(ts, d, PROMPT, k=k, max_new_tokens=n, sampler=s, generator=g,
                                          schedule=schedule)
        seen[0] += sum(gen.stats.accepted)
        seen[1] += sum(gen.stats.drafted)
        return gen.tokens
    return draw, seen


def _chunk(job: tuple) -> tuple[list, int, int]:
    """One chunk of draws (in a worker process or in this one): ``(sequences, accepted, drafted)``."""
    pair, control, case, draft_kind, schedule, seed, count = job
    draw, seen = _drawer(pair, control, case, draft_kind, schedule, torch.Generator().manual_seed(seed))
    n = CASES[case][1]
    with _one_thread(), torch.inference_mode():
        seqs = [tuple(draw()[:n]) for _ in range(count)]
    return seqs, seen[0], seen[1]


_POOLS: dict = {}


def _spawnable() -> bool:
    """Whether a spawned process can re-create this one's ``__main__`` (not so for a script read from stdin)."""
    import os
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return getattr(main, "__spec__", None) is not None or path is None or os.path.isfile(path)


def _pool(workers: int):
    """A pool of ``workers`` spawned processes, started once and kept (a test suite makes many checks)."""
    import atexit
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if workers not in _POOLS:
        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_POOLS[workers].shutdown)
    return _POOLS[workers]


def draw_sequences(pair, draws: int, *, seed: int, case: int = 0, draft_kind: str = "dense",
                   schedule: str = "ordinary", control: bool = False, workers: int | None = None,
                   progress: bool = False) -> tuple[list, int, int]:
    """``draws`` sequences of one configuration's first tokens, in chunks of :data:`CHUNK` (chunk ``j`` seeded
    ``seed * 1_000_003 + j``), over ``workers`` processes (default: one per core; one chunk, one worker, or a
    ``__main__`` a spawned process cannot import: in this process). The result does not depend on
    ``workers``. Returns ``(sequences, accepted, drafted)``."""
    from ..bench.protocol import available_cores
    from ..progress import tqdm

    counts = [min(CHUNK, draws - i) for i in range(0, draws, CHUNK)]
    jobs = [(pair, control, case, draft_kind, schedule, seed * 1_000_003 + j, c) for j, c in enumerate(counts)]
    workers = min(available_cores() if workers is None else int(workers), len(jobs))
    results = map(_chunk, jobs) if workers <= 1 or not _spawnable() else _pool(workers).map(_chunk, jobs)
    seqs, accepted, drafted = [], 0, 0
    with tqdm(total=draws, disable=not progress, desc="draws") as bar:
        for chunk, a, d in results:
            seqs += chunk
            accepted, drafted = accepted + a, drafted + d
            bar.update(len(chunk))
    return seqs, accepted, drafted


def run_case(pair, case: int, draft_kind: str, schedule: str, *, delta: float, alpha: float = 1e-3,
             power: float = 0.99, seed: int | None = None, workers: int | None = None,
             progress: bool = False) -> dict:
    """One configuration of the experiment: speculative sampling (dense or FlashHead draft, ordinary or
    deferred) against target-only sampling's exact distribution, with as many draws as ``power`` needs to
    catch an absolute error ``delta`` (made by :func:`draw_sequences`). Returns :func:`check`'s numbers plus
    the acceptance rate seen."""
    target = pair[0]
    s, n, k = CASES[case]
    with _one_thread():
        exact = exact_distribution(target, PROMPT, n, s)
    draws = draws_for_power(exact, delta=delta, alpha=alpha, power=power)
    seqs, accepted, drafted = draw_sequences(pair, draws, seed=1000 + case if seed is None else seed, case=case,
                                             draft_kind=draft_kind, schedule=schedule, workers=workers,
                                             progress=progress)
    r = check(seqs, exact, alpha=alpha, delta=delta)
    return {**r, "case": case, "sampler": dataclasses.asdict(s), "tokens": n, "k": k,
            "draft": draft_kind, "schedule": schedule, "acceptance": accepted / max(1, drafted)}


def run_always_accept(pair, *, delta: float, alpha: float = 1e-3, power: float = 0.99, seed: int = 5,
                      workers: int | None = None, progress: bool = False) -> dict:
    """Negative control: a wrong rule that keeps every draft token gives the draft's distribution; the check
    must reject it at the same number of draws."""
    s, n, k = CASES[0]
    exact = exact_distribution(pair[0], PROMPT, n, s)
    draws = draws_for_power(exact, delta=delta, alpha=alpha, power=power)
    seqs, _, _ = draw_sequences(pair, draws, seed=seed, control=True, workers=workers, progress=progress)
    r = check(seqs, exact, alpha=alpha, delta=delta)
    return {**r, "case": "always-accept (negative control)", "tokens": n}


def run_all(pair, *, delta: float, alpha: float = 1e-3, power: float = 0.99, workers: int | None = None,
            progress: bool = False, on_row=None) -> dict:
    """The whole experiment: every case of :data:`CASES` with dense and FlashHead drafts, ordinary and deferred
    (:func:`run_case`, each row with its seconds; ``on_row(row)`` after each), then the negative control;
    ``ok`` when every configuration passes and the control is rejected."""
    import time

    rows = []
    for case in range(len(CASES)):
        for draft in ("dense", "flash"):
            for schedule in ("ordinary", "deferred"):
                t = time.perf_counter()
                r = run_case(pair, case, draft, schedule, delta=delta, alpha=alpha, power=power, workers=workers,
                             progress=progress)
                r["seconds"] = round(time.perf_counter() - t, 1)
                rows.append(r)
                if on_row is not None:
                    on_row(r)
    control = run_always_accept(pair, delta=delta, alpha=alpha, power=power, workers=workers, progress=progress)
    return {"delta": delta, "alpha": alpha, "power": power, "configurations": rows, "negative_control": control,
            "ok": all(r["ok"] for r in rows) and not control["ok"]}


__all__ = ["exact_distribution", "draws_for_power", "power_at", "check", "critical_z", "CASES",
           "tiny_pair", "run_case", "run_always_accept", "draw_sequences", "CHUNK", "run_all"]
