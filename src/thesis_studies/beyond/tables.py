"""Chapter 6's tables and verdict from its runs (made by :mod:`thesis_studies.beyond.experiments`) and documents: margin and
co-design choices, block-length policies walked over the lookahead (:func:`policy_simulation`, :func:`walk_check`),
speedups per mode (:func:`mode_table`) and prompt category (:func:`category_table`), :func:`verdict_table`.
"""

from __future__ import annotations

import statistics

import pandas as pd

from thesis_lib.bench.metrics import median
from thesis_lib.bench.modes import parse
from thesis_lib.decoding.costs import verify_cost
from thesis_studies.beyond import lookahead as la
from thesis_lib.analysis import uncertainty
from thesis_lib.analysis.pooled import totals

#: Agreement an adaptive margin may lose against the fixed default, on the calibration states.
MARGIN_TOLERANCE = 0.005


def tuned_margin(curve: dict) -> float:
    """The margin with the fewest mean probes whose agreement is within MARGIN_TOLERANCE of the fixed default."""
    fixed = curve["rows"][0]
    ok = [r for r in curve["rows"][1:] if r["agreement"] >= fixed["agreement"] - MARGIN_TOLERANCE]
    return min(ok, key=lambda r: r["mean_probes"])["margin"] if ok else max(r["margin"] for r in curve["rows"][1:])


def best_codesign(doc: dict) -> dict:
    """The setting with the highest predicted decode tok/s."""
    return max(doc["rows"], key=lambda r: r["tokens_per_s"])


def policy_simulation(look: dict, doc: dict, *, k_max: int, stop_below_grid,
                      max_new_tokens: int | None = None) -> dict:
    """Block-length policies walked over the lookahead ``look`` at the co-design sweep ``doc``'s costs (default
    FlashHead): fixed K = 1..``k_max``, thresholds over ``stop_below_grid`` (with and without the free lookup) and
    the oracle bounds; speedups over modelled target-only time, ``max_new_tokens`` capping blocks as the loop does.
    ``tuned_stop_below`` is the grid's best threshold without the lookup."""
    costs = doc["costs"]
    rows, verify = look["rows"], costs["verify_ms"]
    step = costs["body_ms"] + default_row(doc)["head_ms"]
    target_ms = sum(len(r["target"]) - 1 for r in rows) * verify_cost(verify)(1)

    def entry(res: dict, **kw) -> dict:
        out = {**kw, "speedup": target_ms / res["ms"]}
        if "rounds" in res and res["rounds"]:
            out.update(mean_block=res["drafted"] / res["rounds"], accepted_share=res["accepted"] / res["drafted"])
        return out

    walk = dict(step_ms=step, verify_ms=verify, max_new_tokens=max_new_tokens)
    fixed = [entry(la.simulate(rows, la.fixed_policy(k), **walk), k=k) for k in range(1, k_max + 1)]
    thresholds = [entry(la.simulate(rows, la.threshold_policy(t, k_max), lookup=lookup, **walk), stop_below=t,
                        lookup=lookup)
                  for lookup in (False, True) for t in stop_below_grid]
    oracles = {name: entry(la.oracle(rows, step_ms=s, verify_ms=verify, k_max=k_max, lookup=lk))
               for name, s, lk in (("oracle", step, False), ("oracle_lookup", step, True),
                                   ("oracle_free_head", costs["body_ms"], False), ("oracle_free_draft", 0.0, False))}
    best_fixed = max(fixed, key=lambda r: r["speedup"])
    tuned = max((r for r in thresholds if not r["lookup"]), key=lambda r: r["speedup"])
    tuned_lookup = next(r for r in thresholds if r["lookup"] and r["stop_below"] == tuned["stop_below"])
    # how well the draft's probability of its next token predicts that the target keeps it
    first = [(r["probs"][t][0], r["tokens"][t][0] == r["target"][t]) for r in rows for t in range(len(r["target"]))]
    reliability = []
    for lo, hi in ((0.0, 0.5), (0.5, 0.9), (0.9, 1.01)):
        sel = [ok for prob, ok in first if lo <= prob < hi]
        reliability.append({"from": lo, "to": min(hi, 1.0), "share": len(sel) / len(first),
                            "accepted": sum(sel) / len(sel) if sel else float("nan")})
    return {"fixed": fixed, "thresholds": thresholds, "oracles": oracles, "best_fixed": best_fixed,
            "tuned": tuned, "tuned_lookup": tuned_lookup, "tuned_stop_below": tuned["stop_below"], "step_ms": step,
            "verify_ms": verify, "reliability": reliability, "positions": sum(len(r["target"]) for r in rows)}


def walk_check(sim: dict, look: dict, run, stop_below: float):
    """Table 6.9: the walk against the measured run, per mode: rounds, tokens, phase seconds, ratio to thesis-style."""
    cap = int(look["depth"])
    policies = {"flash_deferred": (la.fixed_policy(run.config["k"]), False),
                "flash_deferred_sk": (la.threshold_policy(stop_below, cap), False),
                "hybrid_deferred_sk": (la.threshold_policy(stop_below, cap), True)}
    modelled = {m: la.simulate(look["rows"], pol, step_ms=sim["step_ms"], verify_ms=sim["verify_ms"], lookup=lk,
                               max_new_tokens=run.config["max_new_tokens"]) for m, (pol, lk) in policies.items()}
    pooled = column(mode_table(run), "Speedup (pooled)")
    rows = []
    for m, sim_m in modelled.items():
        rs = [r for r in run.of(m) if r["iteration"] == 0]
        rows.append({"Mode": LABELS[m],
                     "Rounds (model / run)": f"{sim_m['rounds']} / {sum(r['rounds'] for r in rs)}",
                     "Drafted (model / run)": f"{sim_m['drafted']} / {sum(sum(r['drafted_per_round']) for r in rs)}",
                     "Accepted (model / run)": f"{sim_m['accepted']} / {sum(sum(r['accepted_per_round']) for r in rs)}",
                     "Draft s (model / run)": f"{sim_m['draft_ms'] / 1000:.1f} / {_phase(rs, 'draft_propose'):.1f}",
                     "Verify s (model / run)": f"{sim_m['verify_ms'] / 1000:.1f} / {_phase(rs, 'target_verify'):.1f}",
                     "vs thesis-style, modelled": modelled["flash_deferred"]["ms"] / sim_m["ms"],
                     "vs thesis-style, measured": pooled(m) / pooled("flash_deferred")})
    return pd.DataFrame(rows)


def column(table, name: str):
    """A :func:`mode_table`-shaped table's column as a function of the mode's name (rows labelled by :data:`LABELS`)."""
    col = table.set_index("Mode")[name]
    return lambda mode: float(col[LABELS[mode]])


def best_mode(table, modes) -> str:
    """Of ``modes``, the one with the highest pooled speedup in a :func:`mode_table`."""
    return max(modes, key=column(table, "Speedup (pooled)"))


def walk_parted(table) -> dict[str, int]:
    """:func:`walk_check`'s mode count and largest model-run gap in rounds, drafted and accepted tokens (0: equal)."""
    cols = {"rounds": "Rounds (model / run)", "drafted": "Drafted (model / run)", "accepted": "Accepted (model / run)"}
    gaps = {key: [abs(int(a) - int(b)) for a, b in (v.split(" / ") for v in table[col])] for key, col in cols.items()}
    return {"modes": len(table), **{key: max(g, default=0) for key, g in gaps.items()}}


def _phase(records, name: str) -> float:
    """Seconds a phase of the decoding loop took, summed over records."""
    return sum((r.get("phase_s") or {}).get(name, 0.0) for r in records)


def per_category_speedups(runs: dict[str, object], mode_of: dict[str, str]) -> "object":
    """Pooled decode speedup over the run's baseline per prompt category and "all"; a row per labelled (run, mode)."""
    rows = []
    for label, run in runs.items():
        recs = run.of(mode_of[label])
        base = {(r["iteration"], r["question_id"]): r for r in run.of("baseline")}
        row = {"Setting": label}
        for cat in sorted({r["category"] for r in recs}) + ["all"]:
            rs = [r for r in recs if cat == "all" or r["category"] == cat]
            bs = [base[(r["iteration"], r["question_id"])] for r in rs]
            t, b = totals(rs)["decode_tokens_per_s"], totals(bs)["decode_tokens_per_s"]
            row[cat] = t / b if t and b else None
        rows.append(row)
    return pd.DataFrame(rows)



# --- the chapter's tables ----------------------------------------------------------------------------------------

LABELS = {"flash_deferred": "FlashHead, fixed probes and K (thesis-style)", "adaflash_deferred": "FlashHead, adaptive probes",
          "freq_deferred": "Frequency-truncated head", "ngram_deferred": "Prompt lookup (no draft model)",
          "hybrid_deferred": "Prompt lookup + FlashHead draft", "flash_deferred_hk": "FlashHead, K heuristic (+2/-1)",
          "flash_deferred_ck": "FlashHead, K from the cost model", "sample_dense": "Sampling, dense draft",
          "sample_flash": "Sampling, FlashHead draft", "sample_baseline": "Sampling, target only",
          "baseline": "Target only (greedy)", "flash_deferred_sk": "FlashHead, block ends at an unsure token",
          "hybrid_deferred_sk": "Prompt lookup + FlashHead, block ends at an unsure token"}


def mode_table(run, modes=None):
    """Per mode: decode tok/s, pooled (with its 95 % interval over the prompts) and median speedup over its baseline
    (target-only greedy decoding; target-only sampling for a sampling mode), acceptance, emitted, K, probes,
    lookups."""
    rows = []
    for m in modes or run.modes():
        rs = run.of(m)
        base_mode = parse(m).baseline
        base = {(r["iteration"], r["question_id"]): r for r in run.of(base_mode)}
        t, b = totals(rs), totals([base[(r["iteration"], r["question_id"])] for r in rs])
        per = [r["decode_tokens_per_s"] / base[(r["iteration"], r["question_id"])]["decode_tokens_per_s"] for r in rs
               if r["decode_tokens_per_s"] and base[(r["iteration"], r["question_id"])]["decode_tokens_per_s"]]
        drafted = [d for r in rs for d in r.get("drafted_per_round", [])]
        lookups = [r.get("lookup_rounds", r.get("lookup_matched")) for r in rs]  # hybrid / prompt lookup only
        rows.append({"Mode": LABELS.get(m, m), "Decode Tok/s": t["decode_tokens_per_s"],
                     "Speedup (pooled)": t["decode_tokens_per_s"] / b["decode_tokens_per_s"] if m != base_mode else 1.0,
                     "Speedup (median per sample)": median(per) if m != base_mode else 1.0,
                     **_interval_columns(run, m, base_mode),
                     "Acceptance": t["acceptance"], "Mean emitted": t["mean_emitted"],
                     "Mean K": statistics.fmean(drafted) if drafted else None,
                     "Mean probes": median(r.get("mean_probes") for r in rs),
                     "Lookup rounds": sum(lookups) / sum(r["rounds"] for r in rs) if None not in lookups else None})
    return pd.DataFrame(rows)


def _interval_columns(run, mode: str, against: str) -> dict:
    """The pooled speedup's 95 % interval over the prompts, as one column (none for the baseline itself)."""
    if mode == against:
        return {"95 % interval": "–"}
    ci = uncertainty.ratio_interval(run, mode, against)
    return {"95 % interval": f"{ci['lo']:.2f}-{ci['hi']:.2f}"}


def best_fixed_k(sweep: dict, run, mode: str = "flash_deferred") -> tuple[dict, dict]:
    """Per category, the fixed K with ``mode``'s best pooled speedup: ({category: K}, {category: speedup})."""
    runs = {**sweep, run.config["k"]: run}
    table = per_category_speedups(runs, {k: mode for k in runs}).set_index("Setting")
    return ({c: int(table[c].astype(float).idxmax()) for c in table.columns},
            {c: float(table[c].max()) for c in table.columns})


def _warp(sampler: dict) -> str:
    return (f"T={sampler['temperature']}" + (f", top-k {sampler['top_k']}" if sampler.get("top_k") else "")
            + (f", top-p {sampler['top_p']}" if sampler.get("top_p") else ""))


def sampling_table(check: dict):
    """Table 6.1: one row per configuration of the sampling check."""
    return pd.DataFrame([{"Draft": r["draft"], "Schedule": r["schedule"], "Warp": _warp(r["sampler"]),
                          "Tokens": r["tokens"], "K": r["k"], "Draws": r["draws"], "Cells": r["cells"],
                          "Max |z|": r["max_abs_z"], "Critical z": r["critical_z"], "Power": r["power"],
                          "Acceptance": r["acceptance"], "Verdict": "ok" if r["ok"] else "FAIL"}
                         for r in check["configurations"]])


def margin_table(curve: dict):
    """Table 6.3: adaptive probing over margins, the fixed default first."""
    return pd.DataFrame([{"Margin": "fixed" if r["margin"] is None else r["margin"], "Mean probes": r["mean_probes"],
                          "Agreement with dense": r["agreement"], "Per-token acceptance": r["alpha"],
                          "Head (ms)": r["head_ms"]} for r in curve["rows"]])


def default_row(doc: dict) -> dict | None:
    """The co-design sweep's row of the default FlashHead setting."""
    d = doc["default"]
    return next((r for r in doc["rows"] if r["clusters"] == d["clusters"] and r["probes"] == d["probes"]), None)


def codesign_table(doc: dict):
    """Table 6.4: FlashHead at every (C, p), the truncated heads, the dense head."""
    def row(head, r, **kw):
        return {"Head": head, "C": kw.get("clusters"), "b": kw.get("cluster_size"), "Probes": kw.get("probes"),
                "Candidates": kw.get("candidates"), "Agreement": r["agreement"], "Per-token acceptance": r["alpha"],
                "Head (ms)": r["head_ms"], "Best K": r["k"], "Predicted Tok/s": r["tokens_per_s"],
                "Pareto": kw.get("pareto", "")}

    df = pd.DataFrame([row("FlashHead", r, **r, pareto="yes" if r in doc["front"] else "") for r in doc["rows"]]
                      + [row("Frequency-truncated", r, candidates=r["candidates"]) for r in doc["freq"]]
                      + [row("Dense", doc["dense"])])
    for col in ("C", "b", "Probes", "Candidates", "Best K"):
        df[col] = df[col].astype("Int64")  # whole numbers, blank where a head has none
    return df


def category_table(k: int, run, sweep: dict, co, conf=None):
    """Table 6.6: per-category speedups of each fixed K (``k``: the main run's), adaptive-K, lookup, co-designed
    and (with ``conf``) confidence-stopped drafts, plus a best-fixed-K row; returns it with :func:`best_fixed_k`'s."""
    fixed = {f"FlashHead, K = {kk}": r for kk, r in sorted({**sweep, k: run}.items())}
    others = configurations(run, co, conf, per_category=True)
    table = per_category_speedups({**fixed, **{k: r for k, (r, _) in others.items()}},
                                  {**{k: "flash_deferred" for k in fixed}, **{k: m for k, (_, m) in others.items()}})
    best_k, best = best_fixed_k(sweep, run)
    table = pd.concat([table, pd.DataFrame([{"Setting": BEST_FIXED_ROW, **best}])], ignore_index=True)
    return table, best_k, best


def configurations(run, co, conf=None, per_category: bool = False) -> dict:
    """Each adaptive or co-designed configuration of Tables 6.6 and 6.10 as ``(run, mode)``; the two measured only
    as a mode of the main run (adaptive probes, the frequency head) unless ``per_category``."""
    out = {"FlashHead, K heuristic": (run, "flash_deferred_hk"), "FlashHead, K cost model": (run, "flash_deferred_ck"),
           "Prompt lookup": (run, "ngram_deferred"), "Prompt lookup + FlashHead": (run, "hybrid_deferred"),
           "Co-designed FlashHead": (co, "flash_deferred")}
    if conf is not None:
        out.update({CONFIDENCE_ROWS["flash_deferred_sk"]: (conf, "flash_deferred_sk"),
                    CONFIDENCE_ROWS["hybrid_deferred_sk"]: (conf, "hybrid_deferred_sk")})
    if not per_category:
        out.update({"FlashHead, adaptive probes": (run, "adaflash_deferred"),
                    "Frequency-truncated head": (run, "freq_deferred")})
    return out


BEST_FIXED_ROW = "best fixed K (per column)"
CONFIDENCE_ROWS = {"flash_deferred_sk": "FlashHead, confidence stop", "hybrid_deferred_sk": "Prompt lookup + FlashHead, confidence stop"}


def policy_table(sim: dict):
    """Table 6.7: :func:`policy_simulation`'s best fixed K, tuned thresholds and oracle bounds, and their ratios to
    the best fixed K."""
    best, tau = sim["best_fixed"]["speedup"], sim["tuned_stop_below"]
    rows = [{"Policy": f"fixed K = {sim['best_fixed']['k']} (the best fixed K)", **_sim_cols(sim["best_fixed"], best)}]
    for key, name in (("tuned", "confidence stop"), ("tuned_lookup", "confidence stop + free lookup")):
        rows.append({"Policy": f"{name}, tau = {tau:g} (tuned)", **_sim_cols(sim[key], best)})
    for key, name in (("oracle", "clairvoyant K (bound)"), ("oracle_lookup", "clairvoyant K + free lookup (bound)"),
                      ("oracle_free_head", "clairvoyant K, head free (bound)"),
                      ("oracle_free_draft", "clairvoyant K, draft free (bound)")):
        rows.append({"Policy": name, **_sim_cols(sim["oracles"][key], best)})
    return pd.DataFrame(rows)


def oracle_ratio(sim: dict, look: dict, k: int, max_new_tokens: int | None = None) -> float:
    """Fixed K = ``k``'s modelled time over the oracle's on lookahead ``look``, at ``sim``'s costs."""
    kw = dict(step_ms=sim["step_ms"], verify_ms=sim["verify_ms"])
    return (la.simulate(look["rows"], la.fixed_policy(k), max_new_tokens=max_new_tokens, **kw)["ms"]
            / la.oracle(look["rows"], k_max=int(look["depth"]), **kw)["ms"])


def _sim_cols(r: dict, best: float) -> dict:
    return {"Modelled speedup": r["speedup"], "vs best fixed K": r["speedup"] / best,
            "Mean block": r.get("mean_block"), "Accepted share": r.get("accepted_share")}


def verdict_table(category: "object", modes: "object", best_fixed_all: float, sources: dict | None = None,
                  best_source: tuple | None = None):
    """Table 6.10: each adaptive or co-designed configuration's speedup and ratio to the best fixed K, best first;
    with ``sources`` (:func:`configurations`) and the best fixed K's ``(run, mode)``, the ratio's 95 % interval
    over the prompts (each speedup against its own run's baseline)."""
    rows = category[~category.Setting.str.startswith("FlashHead, K =") & (category.Setting != BEST_FIXED_ROW)]
    speed = rows.set_index("Setting")["all"]
    pooled = column(modes, "Speedup (pooled)")
    speed = pd.concat([speed, pd.Series({"FlashHead, adaptive probes": pooled("adaflash_deferred"),
                                         "Frequency-truncated head": pooled("freq_deferred")})])
    ratio = (speed / best_fixed_all).sort_values(ascending=False)
    out = pd.DataFrame({"Configuration": ratio.index, "Speedup over target-only": speed[ratio.index].values,
                        "vs thesis-style (best fixed K)": ratio.values})
    if sources and best_source:
        cis = [uncertainty.speedup_ratio_interval(sources[c], best_source) for c in out.Configuration]
        out["vs best fixed K 95 % low"] = [ci["lo"] for ci in cis]
        out["vs best fixed K 95 % high"] = [ci["hi"] for ci in cis]
    return out
