"""Token trees, read from a ``tree-bench`` document (:mod:`thesis_studies.trees.bench`): the rank table, the shapes the
cost model picks, tokens per target forward by shape, and the timed comparison with its paired intervals; the
sentences that say which wins are computed here from the intervals."""

from __future__ import annotations

import itertools
import math
import statistics

import pandas as pd

from thesis_lib.bench.runs import Run
from thesis_studies.trees.shapes import gate_study, independent_nodes, search
from .loop import TreeShape
from thesis_lib.analysis.uncertainty import reads, run_interval, speed, which_faster

#: Tokens per target forward the best tree should reach over the best chain's, and the speed over transformers'
#: assisted generation at its best the best tree should reach (this chapter's targets).
FORWARD_TARGET = PEER_TARGET = 1.25
#: Decoder layers of the thesis' target (Qwen3-32B): the GPU document times 8 of them.
THESIS_TARGET_LAYERS = 64


def _run(doc: dict) -> Run:
    return Run(path=None, config={}, environment={}, samples=doc["records"])


def rank_rows(doc: dict, depths: int = 4) -> pd.DataFrame:
    """Per draft and depth: the probability that the target's token is the draft's rank-r candidate, given the depths
    before were covered (ranks 0, 1, 2 and 3-7 together), what no kept candidate covers, and the starts counted."""
    return pd.DataFrame([{"draft": name, "depth": depth, "rank 0": row[0], "rank 1": row[1], "rank 2": row[2],
                          "ranks 3-7": sum(row[3:]), "not among 8": 1 - sum(row), "starts": n}
                         for name, d in doc["calibration"]["drafts"].items()
                         for depth, (row, n) in enumerate(zip(d["table"][:depths], d["trials"]), 1)])


def search_rows(doc: dict) -> pd.DataFrame:
    """Per draft: the model's best chain, beam and grown tree (nodes, depth, widths, expected tokens per round,
    seconds per round, modelled speedup over target-only)."""
    return pd.DataFrame([{"draft": name, "kind": kind, "shape": r["label"], "nodes": r["nodes"], "depth": r["depth"],
                          "widths": " ".join(map(str, r["widths"])), "tokens per round (model)": r["expected_emitted"],
                          "round ms (model)": 1000 * r["round_s"], "speedup (model)": r["speedup"]}
                         for name, d in doc["calibration"]["drafts"].items()
                         for kind, r in d["search"]["best"].items()])


def shape_rows(doc: dict) -> pd.DataFrame:
    """Per draft and shape run untimed: tokens per target forward measured and modelled, and outputs equal to
    target-only."""
    return pd.DataFrame([{"draft": r["draft"], "shape": r["label"], "nodes": r["nodes"], "depth": r["depth"],
                          "tokens per forward": r["emitted_per_round"], "model": r["model_emitted"],
                          "equal": f"{r['equal']}/{r['prompts']}"} for r in doc["shapes"]])


def closed_form_rows(doc: dict, draft: str = "flash") -> pd.DataFrame:
    """Full w-ary trees d deep: the background texts' independent-node expectation (alpha = the rank-0 probability at
    depth 1) beside the rank table's, and the depth, which no round can exceed."""
    d = doc["calibration"]["drafts"][draft]
    alpha, rows = d["table"][0][0], []
    for w, depth in itertools.product((2, 3), (2, 3, 4)):
        full = TreeShape(tuple(p for n in range(1, depth + 1) for p in itertools.product(range(w), repeat=n)))
        rows.append({"width": w, "depth": depth, "nodes": full.size,
                     "independent nodes": independent_nodes(alpha, w, depth),
                     "rank table": full.expected_accepted(d["table"]), "at most": depth})
    return pd.DataFrame(rows)


def best_modes(doc: dict) -> dict:
    """The timed run's modes by role: each draft's chain at the model's K and its tree of 2K nodes at that depth; the
    fastest FlashHead chain and the fastest FlashHead tree measured (each picked on the same data: optimistic)."""
    out = {}
    for name, d in doc["calibration"]["drafts"].items():
        k = d["search"]["best"]["chain"]["depth"]
        out[f"{name}_chain"] = f"{name}_deferred@k{k}"
        out[f"{name}_tree"] = f"{name}_tree@k{k}n{2 * k}"
    run = _run(doc)
    for kind, prefix in (("chain", "flash_deferred@"), ("tree", "flash_tree@")):
        found = [m for m in doc["modes"] if m.startswith(prefix)]
        out[f"flash_fastest_{kind}"] = max(found, key=lambda m: _interval(run, m, "baseline")["value"])
    return out


def _interval(run: Run, a: str, b: str, speed_of: bool = True) -> dict:
    """``a``'s pooled decode speed (or tokens per target forward) over ``b``'s, with its paired interval."""
    if speed_of:
        return run_interval(run, (a, b), lambda s: speed(s[a]) / speed(s[b]))
    return run_interval(run, (a, b), lambda s: (s[a]["emitted"] / s[a]["rounds"]) / (s[b]["emitted"] / s[b]["rounds"]))


def speed_rows(doc: dict) -> pd.DataFrame:
    """Per timed mode: decode speed over target-only with its interval, tokens per target forward, and the samples
    equal to target-only output."""
    run, rows = _run(doc), []
    for m in doc["modes"]:
        recs = run.of(m)
        r = _interval(run, m, "baseline")
        rounds = sum(x.get("rounds", 0) for x in recs)
        rows.append({"mode": m, "x target-only": r["value"], "lo": r["lo"], "hi": r["hi"],
                     "tokens per forward": sum(x.get("emitted", 0) for x in recs) / rounds if rounds else None,
                     "equal": f"{sum(bool(x['matches_baseline']) for x in recs)}/{len(recs)}"})
    return pd.DataFrame(rows)


def forward_verdict(lo: float, hi: float, target: float = FORWARD_TARGET) -> str:
    """Whether tokens per forward reached ``target`` times the chain's, by the interval."""
    return reads(lo, hi, f"reaches {target:g}x the chain's", f"falls short of {target:g}x the chain's",
                 f"cannot be told from {target:g}x the chain's at this sample size", at=target, closed="above")


def tree_values(doc: dict) -> dict:
    """The numbers and verdicts the book glues: per draft, the tree over its chain in tokens per forward and in
    speed; the FlashHead tree over the fastest chain measured and over both assisted-generation peers."""
    run, best, out = _run(doc), best_modes(doc), {}
    for name in doc["calibration"]["drafts"]:
        tree, chain = best[f"{name}_tree"], best[f"{name}_chain"]
        fwd, spd = _interval(run, tree, chain, speed_of=False), _interval(run, tree, chain)
        out[name] = {"tree": tree, "chain": chain, "forward": fwd, "speed": spd,
                     "forward_verdict": forward_verdict(fwd["lo"], fwd["hi"]),
                     "speed_verdict": which_faster(spd["lo"], spd["hi"], "the tree", "the chain")}
    tree = best["flash_fastest_tree"]
    for other in (best["flash_fastest_chain"], "hf_assisted", "hf_assisted_defaults"):
        r = _interval(run, tree, other)
        out[other] = {**r, "verdict": which_faster(r["lo"], r["hi"], "the tree", other)}
    ours = [r for r in doc["records"] if not r["mode"].startswith("hf_")]  # this library's loops
    out["equal"], out["samples"] = sum(bool(r["matches_baseline"]) for r in ours), len(ours)
    out["modes"] = best
    return out


def tree_text(doc: dict) -> str:
    """What ``thesis-lib studies tree-bench`` prints before its JSON line."""
    from thesis_lib.analysis.formatting import to_markdown

    v = tree_values(doc)
    lines = ["Rank table (calibration prompts):", to_markdown(rank_rows(doc)), "",
             "Best shapes under the cost model:", to_markdown(search_rows(doc)), "",
             "Tokens per target forward by shape (measured prompts, untimed):", to_markdown(shape_rows(doc)), "",
             "Timed, interleaved (speed over target-only, 95 % paired interval):", to_markdown(speed_rows(doc)), ""]
    for name in doc["calibration"]["drafts"]:
        x = v[name]
        lines.append(f"{x['tree']} over {x['chain']}: tokens per forward {x['forward']['value']:.2f}x "
                     f"[{x['forward']['lo']:.2f}, {x['forward']['hi']:.2f}] ({x['forward_verdict']}); speed "
                     f"{x['speed']['value']:.2f}x [{x['speed']['lo']:.2f}, {x['speed']['hi']:.2f}] ({x['speed_verdict']})")
    for other in (v["modes"]["flash_fastest_chain"], "hf_assisted", "hf_assisted_defaults"):
        x = v[other]
        lines.append(f"{v['modes']['flash_fastest_tree']} over {other}: {x['value']:.2f}x [{x['lo']:.2f}, {x['hi']:.2f}] "
                     f"({x['verdict']})")
    lines.append(f"equal to target-only: {v['equal']}/{v['samples']} timed samples of this library's modes")
    return "\n".join(lines)


def gpu_prediction(doc: dict, gpu_doc: dict | None, draft: str = "flash") -> dict | None:
    """The thesis' shapes under the model: an H100's verify curve (the GPU check's; the thesis names no GPU model) and captured FlashHead draft step at the thesis'
    shapes (random weights: costs, never acceptance), in target steps, with this pair's rank table; trees of at most
    12 nodes (the curve ends at 13 tokens). None without a GPU document."""
    if gpu_doc is None:
        return None
    check = gpu_doc["gpu_check"]
    over = {int(n): float(x) for n, x in check["verify"]["over_step"].items()}
    step_ms = float(check["verify"]["ms"]["1"]) * THESIS_TARGET_LAYERS / check["verify"]["layers"]
    c = float(check["draft_step_graphs"]["captured"]["flashhead_ms"]) / step_ms
    draft_s = {e: c * over[e] for e in range(1, 9)}
    found = search(doc["calibration"]["drafts"][draft]["table"], draft_s, over, 1.0, max_nodes=max(over) - 1)
    return {"c": c, "target_step_ms": step_ms, **{k: found["best"][k] for k in ("chain", "grown", "beam")}}


def tree_vs_chain(lo: float, hi: float) -> str:
    """Which wins end to end, the tree or the chain, by the interval of the tree's speed over the chain's."""
    return which_faster(lo, hi, "the tree", "the chain")


def tree_vs_peer(lo: float, hi: float) -> str:
    """Which wins end to end, the FlashHead tree or a peer, by the interval of the tree's speed over the peer's."""
    return which_faster(lo, hi, "the tree", "transformers' assisted generation")


def peer_target(value_a: float, lo_a: float, hi_a: float, value_d: float, lo_d: float, hi_d: float,
                target: float = PEER_TARGET) -> str:
    """Whether the tree reached ``target`` times the speed of transformers' assisted generation at its best: of the
    constant-K call (``_a``) and the defaults (``_d``), the faster one (the smaller ratio), by its interval."""
    lo, hi = (lo_a, hi_a) if value_a <= value_d else (lo_d, hi_d)
    return reads(lo, hi, f"reaches the {target:g}x target", f"falls short of the {target:g}x target",
                 f"cannot be told from the {target:g}x target at this sample size", at=target, closed="above")


def gpu_trees(tree_speedup: float, chain_speedup: float) -> str:
    """What the model says for the thesis' setting: the tree's modelled speedup against the chain's."""
    if tree_speedup != tree_speedup or chain_speedup != chain_speedup:
        return "cannot be modelled without a GPU document"
    gain = tree_speedup / chain_speedup - 1
    if abs(gain) < 0.02:
        return "gives trees and chains the same speed within 2 %"
    return (f"gives the tree {100 * gain:.0f} % more speed than the chain" if gain > 0
            else f"gives the chain {100 * (chain_speedup / tree_speedup - 1):.0f} % more speed than the tree")


def gate_values(doc: dict, draft: str = "flash") -> dict:
    """A shape chosen per round, replayed on ``draft``'s calibration text
    (:func:`~thesis_studies.trees.shapes.gate_study`): the fixed chain's tokens per forward, and each switch's
    (``stop``, ``fan``) tokens per forward and modelled speed over the chain's, its threshold and shape. NaN where
    the document has no confidences (written before they were recorded)."""
    cal = doc["calibration"]
    d = cal["drafts"][draft]
    k = d["search"]["best"]["chain"]["depth"]
    if "confidence" not in d:
        return {"gate_chain_forward": float("nan"), "gate_fan_nodes": k,
                **{f"gate_{n}_{w}": float("nan") for n in ("stop", "fan") for w in ("forward", "speed", "threshold")}}
    verify = {int(n): float(x) for n, x in cal["verify_s"].items()}  # JSON keys are strings
    g = gate_study(d["ranks"], d["confidence"], k, d["draft_s"], verify, verify[1])
    out = {"gate_chain_forward": g["chain"]["tokens_per_forward"], "gate_fan_nodes": g["k"]}
    for n in ("stop", "fan"):
        out.update({f"gate_{n}_forward": g[n]["tokens_per_forward"] / g["chain"]["tokens_per_forward"],
                    f"gate_{n}_speed": g[n]["speedup"] / g["chain"]["speedup"], f"gate_{n}_threshold": g[n]["threshold"]})
    return out


def gate_verdict(fan_speed: float, stop_speed: float, margin: float = 0.02) -> str:
    """What the replay leaves a tree chosen per round: the best switch to a fan of candidates (``fan_speed``) and to a
    one-token stop (``stop_speed``), each a modelled speed over the fixed chain's."""
    if fan_speed != fan_speed or stop_speed != stop_speed:
        return "cannot be replayed on this document (no draft confidences, or no rounds to replay)"
    if max(fan_speed, stop_speed) < 1 + margin:
        return f"gains under {100 * margin:g} % either way, so a tree chosen per round has little to take here"
    if fan_speed < stop_speed * (1 + margin):
        return ("gains by drafting less where the draft is unsure, which a stop after the first token does without a "
                f"tree: the fan's candidates add under {100 * margin:g} % to it")
    return (f"gains {100 * (fan_speed / stop_speed - 1):.1f} % more with the fan than with the stop: room for a tree "
            "chosen per round")


def glue_values(doc: dict, gpu_doc: dict | None) -> dict:
    """Every number chapter 8 glues, flat (intervals as ``_value``, ``_lo``, ``_hi``)."""
    v, out = tree_values(doc), {}
    for name in ("flash", "dense"):
        x = v[name]
        out.update({f"{name}_tree": x["tree"], f"{name}_chain": x["chain"]})
        for what in ("forward", "speed"):
            out.update({f"{name}_{what}_{e}": x[what][e] for e in ("value", "lo", "hi")})
    for key, mode in (("fastest", v["modes"]["flash_fastest_chain"]), ("assisted", "hf_assisted"),
                      ("defaults", "hf_assisted_defaults")):
        out.update({f"vs_{key}_{e}": v[mode][e] for e in ("value", "lo", "hi")})
    out["fastest_chain"], out["fastest_tree"] = v["modes"]["flash_fastest_chain"], v["modes"]["flash_fastest_tree"]
    out["equal"], out["samples"] = v["equal"], v["samples"]
    peer = [r for r in doc["records"] if r["mode"] == "hf_assisted_defaults"]
    out["peer_equal"], out["peer_samples"] = sum(bool(r["matches_baseline"]) for r in peer), len(peer)
    out["prompts"] = len(doc.get("prompts_used") or {r["question_id"] for r in doc["records"]})
    out["calibration_prompts"] = doc["calibration"]["prompts"]
    flash = doc["calibration"]["drafts"]["flash"]
    best = flash["search"]["best"]
    out.update(p00=flash["table"][0][0], p01=flash["table"][0][1], p02=flash["table"][0][2],
               p_miss=1 - sum(flash["table"][0]), p30=flash["table"][2][0],
               tree_nodes=best["grown"]["nodes"], tree_depth=best["grown"]["depth"],
               tree_widths=" ".join(map(str, best["grown"]["widths"])), chain_k=best["chain"]["depth"],
               model_tree=best["grown"]["expected_emitted"], model_chain=best["chain"]["expected_emitted"],
               model_tree_speedup=best["grown"]["speedup"], model_chain_speedup=best["chain"]["speedup"])
    verify = {int(n): float(x) for n, x in doc["calibration"]["verify_s"].items()}  # JSON keys are strings
    out.update(verify_tree=verify[1 + best["grown"]["nodes"]] / verify[1],
               verify_chain=verify[1 + best["chain"]["depth"]] / verify[1])
    ran = [r for r in doc["shapes"] if r["draft"] == "flash" and r["emitted_per_round"]]
    chain_row = next(r for r in ran if r["label"] == f"k{best['chain']['depth']}")
    deep = max(ran, key=lambda r: r["emitted_per_round"])
    same = [r for r in ran if r["depth"] <= chain_row["depth"] and r["nodes"] > chain_row["nodes"]]
    wide = max(same, key=lambda r: r["emitted_per_round"]) if same else chain_row
    out.update(chain_forward=chain_row["emitted_per_round"], deep_forward=deep["emitted_per_round"],
               deep_label=deep["label"], deep_nodes=deep["nodes"], deep_depth=deep["depth"],
               deep_ratio=deep["emitted_per_round"] / chain_row["emitted_per_round"],
               wide_label=wide["label"], wide_nodes=wide["nodes"],
               wide_ratio=wide["emitted_per_round"] / chain_row["emitted_per_round"])
    gap = statistics.median(r["model_emitted"] / r["emitted_per_round"] for r in ran) - 1
    out["model_vs_run"] = (f"above the measured ones by {100 * gap:.0f} %" if gap > 0.005 else
                           f"below the measured ones by {100 * -gap:.0f} %" if gap < -0.005 else
                           "within half a percent of the measured ones")
    k, emitted = best["chain"]["depth"], []
    for column in (lambda row: row[0], sum):  # the chain; every kept candidate at every depth
        e, path = 1.0, 1.0
        for row in flash["table"][:k]:
            path *= column(row)
            e += path
        emitted.append(e)
    out["wide_bound"] = emitted[1] / emitted[0]
    p0, p1 = flash["table"][0][0], flash["table"][0][1]
    # the depth down to which a chain's next node (p0^d) is worth more than the best sibling anywhere (p1)
    out["branch_depth"] = int(math.log(p1) / math.log(p0)) + 1 if 0 < p1 < p0 < 1 else 0
    out["model_shape"] = ("a chain: no branch is worth the tokens it adds to the verify forward"
                          if max(best["grown"]["widths"]) == 1 else
                          f"a tree of {best['grown']['nodes']} nodes that branches")
    cf = closed_form_rows(doc)
    w3 = cf[(cf["width"] == 3) & (cf["depth"] == 3)].iloc[0]
    out.update(indep_w3d3=float(w3["independent nodes"]), rank_w3d3=float(w3["rank table"]))
    out.update(gate_values(doc))
    adapts = [r.get("threshold_adapts") for r in doc["records"] if r["mode"] == "hf_assisted_defaults"]
    out["threshold"] = ("adapting as it goes (scikit-learn installed)" if adapts and all(adapts)
                        else "fixed at its default (scikit-learn absent, so transformers does not adapt it)")
    out["peer_k"] = doc["peer_k"]
    gpu, nan = gpu_prediction(doc, gpu_doc), float("nan")
    out.update(gpu_tree_speedup=gpu["grown"]["speedup"] if gpu else nan,
               gpu_chain_speedup=gpu["chain"]["speedup"] if gpu else nan,
               gpu_tree_nodes=gpu["grown"]["nodes"] if gpu else 0, gpu_chain_k=gpu["chain"]["depth"] if gpu else 0,
               gpu_c=gpu["c"] if gpu else nan,
               gpu_shape=("no GPU document" if not gpu else "a chain" if max(gpu["grown"]["widths"]) == 1
                          else "a tree that branches"))
    return out


#: glued verdict key -> (function, {parameter: glued key}) (:data:`thesis_lib.analysis.verdicts.RULES`)
RULES = {
    "ch8_trees": {
        "flash_forward_verdict": (forward_verdict, dict(lo="flash_forward_lo", hi="flash_forward_hi")),
        "dense_forward_verdict": (forward_verdict, dict(lo="dense_forward_lo", hi="dense_forward_hi")),
        "flash_speed_verdict": (tree_vs_chain, dict(lo="flash_speed_lo", hi="flash_speed_hi")),
        "dense_speed_verdict": (tree_vs_chain, dict(lo="dense_speed_lo", hi="dense_speed_hi")),
        "fastest_verdict": (tree_vs_chain, dict(lo="vs_fastest_lo", hi="vs_fastest_hi")),
        "assisted_verdict": (tree_vs_peer, dict(lo="vs_assisted_lo", hi="vs_assisted_hi")),
        "defaults_verdict": (tree_vs_peer, dict(lo="vs_defaults_lo", hi="vs_defaults_hi")),
        "peer_target_verdict": (peer_target, dict(value_a="vs_assisted_value", lo_a="vs_assisted_lo",
                                                  hi_a="vs_assisted_hi", value_d="vs_defaults_value",
                                                  lo_d="vs_defaults_lo", hi_d="vs_defaults_hi")),
        "gpu_verdict": (gpu_trees, dict(tree_speedup="gpu_tree_speedup", chain_speedup="gpu_chain_speedup")),
        "gate_verdict": (gate_verdict, dict(fan_speed="gate_fan_speed", stop_speed="gate_stop_speed")),
    },
}
