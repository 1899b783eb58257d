"""How sure a measured number is: a paired bootstrap over prompts of any pooled quantity of a run
(:func:`run_interval`; the ratio of two modes' decode speeds, :func:`ratio_interval`; a share of decode time,
:func:`share_interval`), of a ratio of two interleaved timings (:func:`timing_interval`), and the words a verdict
may use given an interval (:func:`against_thesis`, :func:`which_faster`).

Modes ran on the same prompts, so a prompt's draw keeps every mode's samples of it together (paired); where a
prompt ran several iterations they are resampled within it. Quantities are the thesis' pooled ones (all decode
tokens over all decode time, per mode), recomputed for every resample; the interval is the resamples' expanded
percentile interval (:func:`expanded_level`): a plain percentile interval over few prompts is too narrow.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..bench.metrics import decode_tokens
from ..bench.runs import Run
from .pooled import totals

#: Resamples and level of every interval the book shows.
RESAMPLES, LEVEL = 2000, 0.95


#: A sample's quantities the intervals pool (summed over the resampled prompts and iterations, per mode).
FIELDS = {"tokens": decode_tokens, "decode_s": lambda r: r["decode_s"],
          "accepted": lambda r: r.get("accepted", 0), "drafted": lambda r: r.get("drafted", 0),
          "emitted": lambda r: r.get("emitted", 0), "rounds": lambda r: r.get("rounds", 0),
          **{name: (lambda r, n=name: r.get("phase_s", {}).get(n, 0.0))
             for name in ("draft_propose", "target_verify", "finalize_align", "draft_prefill", "draft_body",
                          "draft_head")}}


def _units(run: Run, modes: tuple[str, ...]) -> list[np.ndarray]:
    """Per prompt: an array [iterations, modes x fields] of the iterations every mode ran (paired by iteration)."""
    by = [{(r.get("iteration", 0), r["question_id"]): r for r in run.of(m)} for m in modes]
    out: dict[str, list] = defaultdict(list)
    for key in by[0]:  # in the first mode's order of samples
        if all(key in b for b in by[1:]):
            out[str(key[1])].append([f(b[key]) for b in by for f in FIELDS.values()])
    if not out:
        raise ValueError(f"no prompt has samples of {'both ' if len(modes) == 2 else ''}{' and '.join(modes)}")
    return [np.array(v, float) for v in out.values()]


def expanded_level(level: float, n: int) -> float:
    """The percentile level that gives a bootstrap over ``n`` clusters its nominal ``level`` (Hesterberg's expanded
    percentile interval): the normal level whose quantile is Student's t quantile with n - 1 degrees of freedom,
    widened by sqrt(n / (n - 1)) for the bootstrap's variance. A plain percentile interval of a pooled ratio covers
    about 85 % at a nominal 95 % over 7 prompts (docs/measurements.md); this one about 92 %."""
    if n < 2:
        return level
    from scipy import stats

    return float(2 * stats.norm.cdf(math.sqrt(n / (n - 1)) * stats.t.ppf((1 + level) / 2, n - 1)) - 1)


def bootstrap(cells: list[np.ndarray], statistic, *, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = 0) -> dict:
    """``statistic`` of the column sums of ``cells`` (one array [units, columns] per cluster), and its expanded
    percentile interval at ``level`` (:func:`expanded_level`) over ``resamples`` draws that take clusters with
    replacement and, within a drawn cluster of several units, its units with replacement. Draws where the statistic
    is undefined (NaN) are left out."""
    point = statistic(np.sum([c.sum(axis=0) for c in cells], axis=0))
    rng = np.random.default_rng(seed)
    n = len(cells)
    sizes = {len(c) for c in cells}
    if len(sizes) == 1:  # clusters of one size (the usual case): every draw at once
        m = sizes.pop()
        picks = rng.integers(0, n, (resamples, n))
        units = rng.integers(0, m, (resamples, n, m)) if m > 1 else np.zeros((resamples, n, 1), dtype=int)
        sums = np.stack(cells)[picks[..., None], units].sum(axis=(1, 2))
    else:
        sums = np.zeros((resamples, cells[0].shape[1]))
        for i in range(resamples):
            for j in rng.integers(0, n, n):
                c = cells[j]
                sums[i] += c[rng.integers(0, len(c), len(c))].sum(axis=0) if len(c) > 1 else c[0]
    draws = np.array([statistic(v) for v in sums], dtype=float)
    tail = 100 * (1 - expanded_level(level, n)) / 2
    lo, hi = np.nanpercentile(draws, [tail, 100 - tail]) if np.isfinite(draws).any() else (np.nan, np.nan)
    return {"value": float(point), "lo": float(lo), "hi": float(hi), "clusters": n, "level": level,
            "resamples": resamples}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def run_interval(run: Run, modes, statistic, **kw) -> dict:
    """``statistic(sums)`` over the prompts every mode of ``modes`` ran, where ``sums[mode][field]`` pools
    :data:`FIELDS` over the prompts and iterations drawn, with its paired bootstrap interval (``value``, ``lo``,
    ``hi``, ``prompts``)."""
    modes = tuple(modes)
    names = list(FIELDS)

    def stat(v: np.ndarray) -> float:
        sums = {m: dict(zip(names, v[i * len(names):(i + 1) * len(names)])) for i, m in enumerate(modes)}
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(statistic(sums))

    out = bootstrap(_units(run, modes), stat, **kw)
    return {**out, "prompts": out["clusters"]}


def speed(s: dict) -> float:
    """A mode's pooled decode tokens per second from its sums."""
    return _ratio(s["tokens"], s["decode_s"])


def ratio_interval(run: Run, mode: str, against: str = "baseline", *, resamples: int = RESAMPLES,
                   level: float = LEVEL, seed: int = 0) -> dict:
    """``mode``'s pooled decode tok/s over ``against``'s on the prompts both ran: the point estimate and the
    paired bootstrap's interval at ``level`` (``lo``, ``hi``), with the number of prompts (one prompt
    of one iteration leaves nothing to resample: the interval is the point; none is a ValueError)."""
    out = run_interval(run, (mode, against), lambda s: _ratio(speed(s[mode]), speed(s[against])),
                       resamples=resamples, level=level, seed=seed)
    return {**out, "ratio": out["value"]}


def share_interval(run: Run, mode: str, part, whole="decode_s", **kw) -> dict:
    """The pooled share ``sum(part) / sum(whole)`` of one mode (fields of :data:`FIELDS`, or tuples of them
    summed), with its bootstrap interval over prompts."""
    def total(s, f):
        return sum(s[x] for x in ((f,) if isinstance(f, str) else f))

    return run_interval(run, (mode,), lambda s: _ratio(total(s[mode], part), total(s[mode], whole)), **kw)


def timing_interval(times_a, times_b, items: int, **kw) -> dict:
    """The ratio of the mean of ``times_a`` to that of ``times_b``, timed interleaved over ``items`` items for
    several repetitions (index ``rep * items + item``, as :func:`thesis_lib.bench.timing.interleaved` records),
    with a bootstrap interval that resamples items, and repetitions within each."""
    a, b = np.asarray(times_a, float), np.asarray(times_b, float)
    if len(a) != len(b) or len(a) % items:
        raise ValueError(f"{len(a)} and {len(b)} timings do not pair over {items} items")
    cells = [np.stack([a[i::items], b[i::items]], axis=1) for i in range(items)]
    return bootstrap(cells, lambda v: _ratio(v[0], v[1]), **kw)


def cross_ratio_interval(a: tuple[Run, str], b: tuple[Run, str], **kw) -> dict:
    """:func:`ratio_interval` of ``a``'s mode over ``b``'s, each ``(run, mode)``, the runs possibly different
    (paired by prompt and iteration as within one run)."""
    samples = [{**r, "mode": "a"} for r in a[0].of(a[1])] + [{**r, "mode": "b"} for r in b[0].of(b[1])]
    return ratio_interval(Run(path=None, config={}, environment={}, samples=samples), "a", "b", **kw)


def speedup_ratio_interval(a: tuple[Run, str], b: tuple[Run, str], against: str = "baseline", **kw) -> dict:
    """The ratio of two speedups, each ``(run, mode)``'s pooled speed over its own run's ``against`` (the runs may
    differ: a configuration against the best fixed K), with a bootstrap over the prompts all four ran."""
    parts = {"a": (a[0], a[1]), "a0": (a[0], against), "b": (b[0], b[1]), "b0": (b[0], against)}
    samples = [{**r, "mode": name} for name, (run, mode) in parts.items() for r in run.of(mode)]
    joint = Run(path=None, config={}, environment={}, samples=samples)
    out = run_interval(joint, tuple(parts), lambda s: _ratio(_ratio(speed(s["a"]), speed(s["a0"])),
                                                             _ratio(speed(s["b"]), speed(s["b0"]))), **kw)
    return {**out, "ratio": out["value"]}


def fastest(candidates: dict) -> tuple:
    """The fastest of ``candidates`` (name -> ``(run, mode)``) by pooled decode speed, and the names the prompts
    cannot tell apart from it (the interval of its speed over theirs holds 1)."""
    best = max(candidates, key=lambda n: totals(candidates[n][0].of(candidates[n][1]))["decode_tokens_per_s"])
    tied = [n for n in candidates if n != best and cross_ratio_interval(candidates[best], candidates[n])["lo"] <= 1]
    return best, tied


#: The ratios of the main run the pages print with an interval: glued key -> (mode, against)
RATIOS = {"ord_dense_vs_base": ("dense_ordinary", "baseline"),
          "ord_flash_vs_base": ("flash_ordinary", "baseline"),
          "ord_flash_vs_dense": ("flash_ordinary", "dense_ordinary"),
          "def_dense_vs_base": ("dense_deferred", "baseline"),
          "def_flash_vs_base": ("flash_deferred", "baseline"),
          "def_flash_vs_dense": ("flash_deferred", "dense_deferred"),
          "def_vs_ord_dense": ("dense_deferred", "dense_ordinary"),
          "def_vs_ord_flash": ("flash_deferred", "flash_ordinary")}


def acceptance(s: dict) -> float:
    """A mode's pooled acceptance (accepted over drafted proposals) from its sums."""
    return _ratio(s["accepted"], s["drafted"])


def path_per_token(s: dict) -> float:
    """A mode's pooled draft path (proposal seconds) per decoded token from its sums."""
    return _ratio(s["draft_propose"], s["tokens"])


#: Other pooled quantities the verdicts judge by their intervals: (modes, statistic of their sums).
QUANTITIES = {
    # acceptance of the dense draft minus the FlashHead draft's, under deferred verification
    "acc_diff_def": (("dense_deferred", "flash_deferred"),
                     lambda s: acceptance(s["dense_deferred"]) - acceptance(s["flash_deferred"])),
    # the FlashHead draft's acceptance (Table 4.5's)
    "acc_flash_ord": (("flash_ordinary",), lambda s: acceptance(s["flash_ordinary"])),
    # the dense draft path's cost per decoded token over FlashHead's, deferred (above 1: FlashHead's is cheaper)
    "path_dense_vs_flash": (("dense_deferred", "flash_deferred"),
                            lambda s: _ratio(path_per_token(s["dense_deferred"]), path_per_token(s["flash_deferred"]))),
}


def glued_intervals(run: Run, keys=tuple(RATIOS) + tuple(QUANTITIES)) -> dict:
    """``<key>_lo`` and ``<key>_hi`` of :data:`RATIOS` and :data:`QUANTITIES` named by ``keys`` (those whose
    modes the run has), with the prompts resampled and the resamples: what a page glues beside the ratios."""
    out, prompts = {}, 0
    for key in keys:
        modes = RATIOS[key] if key in RATIOS else QUANTITIES[key][0]
        if not all(run.of(m) for m in modes):
            continue
        ci = ratio_interval(run, *modes) if key in RATIOS else run_interval(run, modes, QUANTITIES[key][1])
        out[f"{key}_lo"], out[f"{key}_hi"], prompts = ci["lo"], ci["hi"], max(prompts, ci["prompts"])
    return {**out, "ci_prompts": prompts, "ci_resamples": RESAMPLES}


def bound_text(x: float, *lines: float) -> str:
    """An interval's bound to two decimals, or to as many more (up to six) as it takes for the printed bound to
    stand on the same side of each line (1, and any in ``lines``, such as the thesis' value) as the bound itself: a
    reader tells from the printed interval whether it holds 1 or the thesis' value, as the verdict beside it does."""
    for digits in (2, 3, 4, 5, 6):
        text, sides = f"{x:.{digits}f}", [(x > at, x < at) for at in (1.0, *lines)]
        if [(float(text) > at, float(text) < at) for at in (1.0, *lines)] == sides:
            return text
    return text


def side(lo: float, hi: float, at: float = 1.0, *, closed: str = "") -> int:
    """The one rule by which every verdict reads an interval against a line (1 for a ratio, the thesis' value, a
    target): 1 where the whole interval lies above ``at``, -1 where it lies below, 0 where it holds ``at``. A bound
    equal to the line holds it, unless ``closed`` gives the line to one side: ``"above"`` (reaching a target counts as
    meeting it) or ``"below"`` (a ratio at most 1 counts as no gain)."""
    if lo > at or (closed == "above" and lo == at):
        return 1
    if hi < at or (closed == "below" and hi == at):
        return -1
    return 0


def reads(lo: float, hi: float, above: str, below: str, holds: str, at: float = 1.0, *, closed: str = "") -> str:
    """A verdict's words for its interval by :func:`side`: ``above``, ``below`` or ``holds`` (the line inside)."""
    return {1: above, -1: below, 0: holds}[side(lo, hi, at, closed=closed)]


def direction(thesis: float, value: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    """Whether a measured ratio points the thesis' way (both above 1, or both not): ``yes`` or ``no`` when its
    interval lies on one side of 1, ``cannot tell`` when it holds 1; without an interval (NaN) the point
    decides, and the answer says so."""
    if lo != lo or hi != hi:
        return ("yes" if (value > 1) == (thesis > 1) else "no") + " (point only)"
    if not side(lo, hi):
        return "cannot tell"
    return "yes" if (side(lo, hi) > 0) == (thesis > 1) else "no"


def against_thesis(lo: float, hi: float, thesis: float) -> str:
    """``reproduced`` when the thesis' value lies in the interval, else ``larger``/``smaller`` here."""
    return reads(lo, hi, "larger", "smaller", "reproduced", at=thesis)


def which_faster(lo: float, hi: float, first: str, second: str) -> str:
    """Which of two modes is faster by the interval of ``first``'s speed over ``second``'s; neither when it
    contains 1."""
    return reads(lo, hi, f"{first} is faster", f"{second} is faster",
                 f"{first} and {second} cannot be told apart at this sample size")


def prompts_to_resolve(ratio: float, lo: float, hi: float, prompts: int) -> int | None:
    """About how many prompts an interval as wide as ``[lo, hi]`` per sqrt(prompts) needs to exclude 1 at the
    same ratio (the half-width shrinks as 1/sqrt(prompts)); ``prompts`` itself where it already does, None at a
    ratio of exactly 1 (no number of prompts resolves no difference)."""
    if side(lo, hi):
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
