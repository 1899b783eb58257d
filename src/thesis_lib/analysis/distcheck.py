"""Does a sampler reproduce a known distribution? The empirical proof that speculative sampling is lossless.

:func:`exact_distribution` computes target-only sampling's exact distribution of the first ``n`` generated
tokens by enumerating every prefix (small vocabularies only: ``V ** (n - 1)`` forwards). :func:`check`
compares counts of sampled sequences with it, cell by cell: each sequence's count gets a binomial z-score, and
the largest ``|z|`` is tested at family-wise level ``alpha`` (Bonferroni over the cells). A sequence that
has probability 0 but was drawn fails at once. :func:`draws_for_power` says how many draws make the check
catch, with the requested power, an absolute error of ``delta`` in the hardest cell (the one with the
largest binomial variance): ``N = ((z_crit + z_power) * sqrt(p (1 - p)) / delta) ** 2``. Power is computed
with the normal approximation to the binomial, stated as such.
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


def sequences(prompt_ids: Sequence[int], n: int, draw, count: int, progress: bool = False) -> list[tuple[int, ...]]:
    """``count`` sequences of the first ``n`` tokens from ``draw(prompt_ids, n) -> list[int]``."""
    from ..progress import tqdm

    return [tuple(draw(prompt_ids, n)[:n]) for _ in tqdm(range(count), disable=not progress, desc="draws")]


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


def run_case(pair, case: int, draft_kind: str, schedule: str, *, delta: float, alpha: float = 1e-3,
             power: float = 0.99, seed: int | None = None, progress: bool = False) -> dict:
    """One configuration of the experiment: speculative sampling (dense or FlashHead draft, ordinary or
    deferred) against target-only sampling's exact distribution, with as many draws as ``power`` needs to
    catch an absolute error ``delta``. Returns :func:`check`'s numbers plus the acceptance rate seen."""
    target, draft, flash = pair
    s, n, k = CASES[case]
    with _one_thread():
        exact = exact_distribution(target, PROMPT, n, s)
    draws = draws_for_power(exact, delta=delta, alpha=alpha, power=power)
    g = torch.Generator().manual_seed(1000 + case if seed is None else seed)
    d = sampling.SamplingModelDrafter(draft, s, flash_head=flash if draft_kind == "flash" else None)
    ts = ModelState(target)
    seen = [0, 0]

    def draw(prompt, m):
        gen = sampling.speculative_sample(ts, d, prompt, k=k, max_new_tokens=m, sampler=s, generator=g,
                                          schedule=schedule)
        seen[0] += sum(gen.stats.accepted)
        seen[1] += sum(gen.stats.drafted)
        return gen.tokens

    with _one_thread():
        r = check(sequences(PROMPT, n, draw, draws, progress=progress), exact, alpha=alpha, delta=delta)
    return {**r, "case": case, "sampler": dataclasses.asdict(s), "tokens": n, "k": k,
            "draft": draft_kind, "schedule": schedule, "acceptance": seen[0] / max(1, seen[1])}


def run_always_accept(pair, *, delta: float, alpha: float = 1e-3, power: float = 0.99, seed: int = 5,
                      progress: bool = False) -> dict:
    """Negative control: a wrong rule that keeps every draft token gives the draft's distribution; the check
    must reject it at the same number of draws."""
    target, draft, _ = pair
    s, n, k = CASES[0]
    exact = exact_distribution(target, PROMPT, n, s)
    draws = draws_for_power(exact, delta=delta, alpha=alpha, power=power)
    g = torch.Generator().manual_seed(seed)
    d = sampling.SamplingModelDrafter(draft, s)
    ts, head = ModelState(target), DenseGreedyHead.from_model(target)

    def draw(prompt, m):
        ts.reset()
        first = sampling.draw(sampling.target_probs(ts, head, prompt, s)[-1], g)  # the target's first token
        d.begin(list(prompt) + [first])
        y, _ = d.propose(m - 1, g)
        return [first] + y

    with _one_thread():
        r = check(sequences(PROMPT, n, draw, draws, progress=progress), exact, alpha=alpha, delta=delta)
    return {**r, "case": "always-accept (negative control)", "tokens": n}


__all__ = ["exact_distribution", "draws_for_power", "power_at", "check", "critical_z", "sequences", "CASES",
           "tiny_pair", "run_case", "run_always_accept"]
