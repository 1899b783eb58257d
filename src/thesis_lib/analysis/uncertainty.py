"""How sure a measured ratio is: a paired bootstrap over prompts of the ratio of two modes' pooled decode speeds
(:func:`ratio_interval`), and the words a verdict may use given that interval (:func:`against_thesis`,
:func:`which_faster`).

The two modes ran on the same prompts, so a prompt's draw keeps both modes' samples of it together (paired); where
a prompt ran several iterations they are resampled within it. The ratio is the thesis' pooled one (all decode
tokens over all decode time, per mode), recomputed for every resample; the interval is the resamples' percentile
interval.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..bench.metrics import decode_tokens
from ..bench.runs import Run

#: Resamples and level of every interval the book shows.
RESAMPLES, LEVEL = 2000, 0.95


def _pairs(run: Run, mode: str, against: str) -> dict[str, list[tuple[dict, dict]]]:
    """prompt -> [(sample of ``mode``, sample of ``against``)] for every iteration both modes have."""
    base = {(r.get("iteration", 0), r["question_id"]): r for r in run.of(against)}
    out: dict[str, list] = defaultdict(list)
    for r in run.of(mode):
        b = base.get((r.get("iteration", 0), r["question_id"]))
        if b is not None:
            out[str(r["question_id"])].append((r, b))
    return dict(out)


def ratio_interval(run: Run, mode: str, against: str = "baseline", *, resamples: int = RESAMPLES,
                   level: float = LEVEL, seed: int = 0) -> dict:
    """``mode``'s pooled decode tok/s over ``against``'s on the prompts both ran: the point estimate and the
    paired bootstrap's percentile interval at ``level`` (``lo``, ``hi``), with the number of prompts (one prompt
    of one iteration leaves nothing to resample: the interval is the point; none is a ValueError)."""
    pairs = _pairs(run, mode, against)
    if not pairs:
        raise ValueError(f"no prompt has samples of both {mode} and {against}")
    # per prompt and iteration: [tokens, seconds] of each mode
    cells = [np.array([[decode_tokens(r), r["decode_s"], decode_tokens(b), b["decode_s"]] for r, b in its], float)
             for its in pairs.values()]
    total = np.sum([c.sum(axis=0) for c in cells], axis=0)
    point = (total[0] / total[1]) / (total[2] / total[3])
    rng = np.random.default_rng(seed)
    n = len(cells)
    draws = np.empty(resamples)
    for i in range(resamples):
        acc = np.zeros(4)
        for j in rng.integers(0, n, n):
            c = cells[j]
            acc += c[rng.integers(0, len(c), len(c))].sum(axis=0) if len(c) > 1 else c[0]
        draws[i] = (acc[0] / acc[1]) / (acc[2] / acc[3])
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return {"ratio": float(point), "lo": float(lo), "hi": float(hi), "prompts": n, "level": level,
            "resamples": resamples}


#: The deferred schedule's ratios the results and the conclusion print with an interval: glued key -> (mode, against)
DEFERRED = {"def_dense_vs_base": ("dense_deferred", "baseline"),
            "def_flash_vs_base": ("flash_deferred", "baseline"),
            "def_flash_vs_dense": ("flash_deferred", "dense_deferred")}


def glued_intervals(run: Run, keys=tuple(DEFERRED)) -> dict:
    """``<key>_lo`` and ``<key>_hi`` of :data:`DEFERRED`'s ratios named by ``keys``, with the prompts resampled and
    the resamples: what a page glues beside the ratios."""
    out = {}
    for key in keys:
        ci = ratio_interval(run, *DEFERRED[key])
        out[f"{key}_lo"], out[f"{key}_hi"] = ci["lo"], ci["hi"]
    return {**out, "ci_prompts": ci["prompts"], "ci_resamples": RESAMPLES}


def against_thesis(lo: float, hi: float, thesis: float) -> str:
    """``reproduced`` when the thesis' value lies in the interval, else ``larger``/``smaller`` here."""
    if lo <= thesis <= hi:
        return "reproduced"
    return "larger" if lo > thesis else "smaller"


def which_faster(lo: float, hi: float, first: str, second: str) -> str:
    """Which of two modes is faster by the interval of ``first``'s speed over ``second``'s; neither when it
    contains 1."""
    if lo > 1:
        return f"{first} is faster"
    if hi < 1:
        return f"{second} is faster"
    return f"{first} and {second} cannot be told apart at this sample size"


def prompts_to_resolve(ratio: float, lo: float, hi: float, prompts: int) -> int | None:
    """About how many prompts an interval as wide as ``[lo, hi]`` per sqrt(prompts) needs to exclude 1 at the
    same ratio (the half-width shrinks as 1/sqrt(prompts)); ``prompts`` itself where it already does, None at a
    ratio of exactly 1 (no number of prompts resolves no difference)."""
    if lo > 1 or hi < 1:
        return prompts
    if ratio == 1:
        return None
    half = (hi - lo) / 2
    return math.ceil(prompts * (half / abs(ratio - 1)) ** 2)


def resolution(ratio: float, lo: float, hi: float, prompts: int) -> str:
    """The sentence a page says about whether its prompts resolve a ratio from 1."""
    need = prompts_to_resolve(ratio, lo, hi, prompts)
    if need == prompts:
        return f"the {prompts} prompts resolve it from 1"
    if need is None:
        return "no number of prompts would resolve a ratio of exactly 1"
    return (f"the {prompts} prompts do not resolve it from 1; at this spread about {need} prompts would "
            f"(the interval narrows as one over the square root of their number)")
