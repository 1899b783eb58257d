"""This project's extra tables from run folders: per-sample ratios, peers (transformers' ``generate``), the
pipelined schedule, verification, accepted-length histograms and run-to-run reproducibility.
"""

from __future__ import annotations

import statistics
from collections import Counter

import pandas as pd

from ..bench.modes import parse
from ..errors import ConfigError
from .pooled import LABELS, as_run, per_sample_ratios, quartiles3, samples_of, totals


def category_ratios(run, pairs: dict[str, tuple[str, str]], rounds: str | None = None) -> pd.DataFrame:
    """Per prompt category: each pair's (label -> ``(mode, against)``) pooled decode speed ratio over the category's
    prompts, and how many prompts it has: where a ratio depends on the category, the spread the intervals hide. With
    ``rounds`` (a mode), that mode's acceptance (accepted / drafted) and tokens per round (the target's own
    included) too, and a last row over all prompts: where the round's shape, and so the speedup, follows the text."""
    run = as_run(run)
    rows = []
    for category in sorted({r.get("category", "?") for r in run.samples}) + ([None] if rounds else []):
        def of(mode):
            return [r for r in run.of(mode) if category in (None, r.get("category", "?"))]
        row = {"Category": "all" if category is None else category.replace("_", " "),
               "Prompts": len({r["question_id"] for r in run.samples if category in (None, r.get("category", "?"))})}
        if rounds:
            t = totals(of(rounds)) if of(rounds) else {"acceptance": float("nan"), "mean_emitted": float("nan")}
            row.update({"Acceptance": t["acceptance"], "Tokens per round": t["mean_emitted"]})
        for label, (mode, against) in pairs.items():
            a, b = of(mode), of(against)
            row[label] = (totals(a)["decode_tokens_per_s"] / totals(b)["decode_tokens_per_s"]) if a and b else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def ratio_table(run, against: str = "baseline") -> pd.DataFrame:
    """Per mode: median decode tok/s and the per-sample ratio to ``against`` with quartiles (robust to noise)."""
    run = as_run(run)
    rows = []
    for mode in run.modes():
        rs = run.of(mode)
        tps = [r["decode_tokens_per_s"] for r in rs if r.get("decode_tokens_per_s")]
        p25, p50, p75 = quartiles3(per_sample_ratios(run, mode, against))
        rows.append({"Mode": LABELS.get(mode, mode), "Samples": len(rs),
                     "Median decode Tok/s": statistics.median(tps) if tps else float("nan"),
                     f"Median ratio vs {against}": p50, "Ratio P25": p25, "Ratio P75": p75,
                     "Identical to baseline": sum(bool(r.get("matches_baseline")) for r in rs)})
    return pd.DataFrame(rows)


def peers_table(run) -> pd.DataFrame:
    """This library's loops beside transformers' ``generate()`` and assisted ``generate()`` on the same prompts."""
    run = as_run(run)
    rows = []
    for mode in ("baseline", "hf_greedy", "dense_ordinary", "hf_assisted"):
        rs = samples_of(run, mode, "peers")
        t = totals(rs)
        rows.append({"Mode": LABELS[mode], "Samples": t["samples"], "Decode Tok/s": t["decode_tokens_per_s"],
                     "TTFT (ms)": t["ttft_ms"], "E2E Tok/s": t["e2e_tokens_per_s"],
                     "Median E2E ratio vs baseline": quartiles3(per_sample_ratios(run, mode, key="e2e_tokens_per_s"))[1],
                     "Identical to baseline": sum(bool(r.get("matches_baseline")) for r in rs)})
    return pd.DataFrame(rows)


def pipelined_table(run) -> pd.DataFrame:
    """Does overlapping the target's append with the draft's next proposal help (section 3.6.1)?"""
    run = as_run(run)
    rows = []
    for draft in ("dense", "flash"):
        a, b = f"{draft}_ordinary", f"{draft}_pipelined"
        if not run.of(a) or not run.of(b):
            continue
        ta, tb = totals(run.of(a)), totals(run.of(b))
        rows.append({"Comparison": f"{LABELS[a]} vs. {LABELS[b]}", "A Tok/s": ta["decode_tokens_per_s"],
                     "B Tok/s": tb["decode_tokens_per_s"], "Speedup": tb["decode_tokens_per_s"] / ta["decode_tokens_per_s"],
                     "Median per-sample ratio": quartiles3(per_sample_ratios(run, b, a))[1],
                     "A finalize (ms)": 1000 * ta["finalize_s"], "B finalize wait (ms)": 1000 * tb["finalize_s"],
                     "B propose (ms)": 1000 * tb["propose_s"], "A propose (ms)": 1000 * ta["propose_s"]})
    if not rows:
        raise ConfigError(f"Run {run.name!r} has no ordinary/pipelined pair of modes.")
    return pd.DataFrame(rows)


def verification_table(run) -> pd.DataFrame:
    """Verification behaviour per speculative mode: rounds, skipped, zero-accept and full-accept rounds."""
    run = as_run(run)
    rows = []
    for mode in run.modes():
        rs = [r for r in run.of(mode) if "rounds" in r]
        if not rs:
            continue
        rounds = sum(r["rounds"] for r in rs)
        rows.append({"Mode": LABELS.get(mode, mode), "Rounds": rounds, "Skipped": sum(r["skipped"] for r in rs),
                     "Zero-accept rounds": sum(r["zero_accept_rounds"] for r in rs),
                     "Full-accept rounds": sum(r["full_accept_rounds"] for r in rs),
                     "Verify calls": sum(r["verify_calls"] for r in rs), "Append calls": sum(r["append_calls"] for r in rs),
                     "Acceptance": sum(r["accepted"] for r in rs) / sum(r["drafted"] for r in rs)})
    return pd.DataFrame(rows)


def accepted_lengths(run) -> pd.DataFrame:
    """Rounds per accepted length 0..L (L: the longest block drafted) per speculative mode; fixed-K modes count
    only full-length rounds, variable-length modes every round."""
    run = as_run(run)
    k = run.config.get("k")
    counts: dict[str, Counter] = {}
    longest = k or 0
    for mode in run.modes():
        c: Counter = Counter()
        fixed = parse(mode).policy == "fixed"
        for r in run.of(mode):
            for a, d in zip(r.get("accepted_per_round", []), r.get("drafted_per_round", [])):
                if d == k or not fixed:
                    c[a] += 1
                    longest = max(longest, d)
        if c:
            counts[mode] = c
    if not counts:
        raise ConfigError(f"Run {run.name!r} has no speculative rounds of full length K = {k}.")
    return pd.DataFrame([{"Mode": LABELS.get(m, m), **{f"accepted {i}": c.get(i, 0) for i in range(longest + 1)}}
                         for m, c in counts.items()])


def reproducibility(run_a, run_b) -> pd.DataFrame:
    """Two runs of one configuration: identical tokens and acceptance per mode, and the spread of speed."""
    a, b = as_run(run_a), as_run(run_b)
    rows = []
    for mode in a.modes():
        ra = {(r.get("iteration", 0), r["question_id"]): r for r in a.of(mode)}
        rb = {(r.get("iteration", 0), r["question_id"]): r for r in b.of(mode)}
        common = sorted(set(ra) & set(rb))
        if not common:
            continue
        same = sum(ra[k]["tokens"] == rb[k]["tokens"] for k in common)
        acc_same = sum(ra[k].get("accepted_per_round") == rb[k].get("accepted_per_round") for k in common)
        ma = statistics.median(ra[k]["decode_tokens_per_s"] for k in common)
        mb = statistics.median(rb[k]["decode_tokens_per_s"] for k in common)
        ratios = [rb[k]["decode_tokens_per_s"] / ra[k]["decode_tokens_per_s"] for k in common]
        p25, p50, p75 = quartiles3(ratios)
        rows.append({"Mode": LABELS.get(mode, mode), "Samples": len(common), "Identical tokens": same,
                     "Identical acceptance": acc_same, "Median Tok/s A": ma, "Median Tok/s B": mb,
                     "B/A medians": mb / ma, "Per-sample B/A P25": p25, "Per-sample B/A P50": p50,
                     "Per-sample B/A P75": p75})
    return pd.DataFrame(rows)
