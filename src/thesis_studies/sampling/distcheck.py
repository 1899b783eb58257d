"""The empirical proof that speculative sampling is lossless: :func:`check` tests sampled sequences' binomial
z-scores (Bonferroni) against :func:`exact_distribution` (``V ** (n - 1)`` forwards), with :func:`draws_for_power`
draws made by :func:`draw_sequences`; :func:`run_all` is the whole experiment on :func:`tiny_pair`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Iterable, Sequence

import torch

from . import loop as sampling
from .loop import Sampler
from thesis_lib.decoding.state import ModelState
from thesis_lib.heads.clustering import spherical_kmeans
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.flashhead import FlashHead
from thesis_lib.models import tiny


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
    """Draws to catch an error ``delta`` with probability ``power`` in the hardest cell (largest ``p (1 - p)``):
    ``((z_crit + z_power) * sqrt(p (1 - p)) / delta) ** 2``, iterated until the cells :func:`check` tests agree."""
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
    # the Bonferroni bound is over the cells tested at the final draw count: make sure the power holds there
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
    """The verdict's numbers: not ``ok`` when the largest ``|z|`` passes the bound or an impossible draw is seen."""
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


# --- the stated experiment: tiny models, 8-token vocabulary (shared by the test suite and `thesis-lib studies sampling-check`)

VOCAB = 8
PROMPT = (1, 2, 3)
#: (sampler, tokens checked, K)
CASES = (
    (Sampler(1.0), 3, 2),
    (Sampler(0.8, top_k=4, top_p=0.9), 4, 3),
)


class _one_thread:
    """One torch thread: tiny models gain nothing from more, and on shared cores a parallel region can wait a
    scheduler slice for its second thread."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def tiny_pair(vocab: int = VOCAB):
    """A tiny random target, a noisy copy as draft and a FlashHead (4 clusters, 2 probes) over the draft's head:
    small enough to enumerate, different enough to reject."""
    target = tiny.tiny_model("qwen2", vocab_size=vocab, seed=0, init_std=0.4)
    draft = tiny.noisy_copy(target, scale=0.15, seed=3)
    w = draft.get_output_embeddings().weight.detach()
    flash = FlashHead(w, spherical_kmeans(w, 4, progress=False), n_probes=2, path="reference")
    return target, draft, flash


#: Draws per chunk; each chunk has its own seeded generator, so the draws do not depend on the process count.
CHUNK = 250


def _drawer(pair, control: bool, case: int, draft_kind: str, schedule: str, g: torch.Generator):
    """``draw() -> first n tokens`` of a configuration (``control``: always accept) and its ``[accepted, drafted]``."""
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
    """``(sequences, accepted, drafted)`` of ``draws`` draws, in seeded :data:`CHUNK` chunks over ``workers`` processes
    (default one per core; in-process where spawning can't)."""
    from thesis_lib.bench.disturbance import available_cores
    from thesis_lib.progress import tqdm

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
    """One configuration (draft kind, schedule) checked against the exact distribution with as many draws as
    ``power`` needs for ``delta``: :func:`check`'s numbers plus the acceptance rate."""
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
    """Negative control: keeping every draft token gives the draft's distribution, which the check must reject."""
    s, n, k = CASES[0]
    exact = exact_distribution(pair[0], PROMPT, n, s)
    draws = draws_for_power(exact, delta=delta, alpha=alpha, power=power)
    seqs, _, _ = draw_sequences(pair, draws, seed=seed, control=True, workers=workers, progress=progress)
    r = check(seqs, exact, alpha=alpha, delta=delta)
    return {**r, "case": "always-accept (negative control)", "tokens": n}


def run_all(pair, *, delta: float, alpha: float = 1e-3, power: float = 0.99, workers: int | None = None,
            progress: bool = False, on_row=None) -> dict:
    """Every :data:`CASES` x draft x schedule (:func:`run_case`, timed; ``on_row(row)`` after each) and the
    negative control; ``ok`` when all pass and the control is rejected."""
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
