"""Token trees, read from a ``tree-bench`` document (:mod:`thesis_lib.bench.trees`): the rank table, the shapes the
cost model picks, tokens per target forward by shape, and the timed comparison with its paired intervals; the
sentences that say which wins are computed here from the intervals."""

from __future__ import annotations

import itertools

import pandas as pd

from ..bench.runs import Run
from ..decoding.tree_shapes import independent_nodes
from ..decoding.trees import TreeShape
from .uncertainty import run_interval, speed, which_faster

#: Tokens per target forward the best tree should reach over the best chain's (issue 49's target).
FORWARD_TARGET = 1.25


def _run(doc: dict) -> Run:
    return Run(path=None, config={}, environment={}, samples=doc["records"])


def rank_rows(doc: dict, depths: int = 4) -> pd.DataFrame:
    """Per draft and depth: the probability that the target's token is the draft's rank-r candidate, given the depths
    before were covered (ranks 0, 1, 2 and 3-7 together), what no kept candidate covers, and the starts counted."""
    rows = []
    for name, d in doc["calibration"]["drafts"].items():
        for depth, (row, n) in enumerate(zip(d["table"][:depths], d["trials"]), 1):
            rows.append({"draft": name, "depth": depth, "rank 0": row[0], "rank 1": row[1], "rank 2": row[2],
                         "ranks 3-7": sum(row[3:]), "not among 8": 1 - sum(row), "starts": n})
    return pd.DataFrame(rows)


def _ms(x: float) -> float:
    return 1000 * x


def search_rows(doc: dict) -> pd.DataFrame:
    """Per draft: the model's best chain, beam and grown tree (nodes, depth, widths, expected tokens per round,
    seconds per round, modelled speedup over target-only)."""
    rows = []
    for name, d in doc["calibration"]["drafts"].items():
        for kind, r in d["search"]["best"].items():
            rows.append({"draft": name, "kind": kind, "shape": r["label"], "nodes": r["nodes"], "depth": r["depth"],
                         "widths": " ".join(map(str, r["widths"])), "tokens per round (model)": r["expected_emitted"],
                         "round ms (model)": _ms(r["round_s"]), "speedup (model)": r["speedup"]})
    return pd.DataFrame(rows)


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
    """The timed run's modes by role: each draft's chain at the model's K and its tree, and the fastest FlashHead
    chain measured (chosen on the same data: an optimistic pick)."""
    out = {}
    for name, d in doc["calibration"]["drafts"].items():
        best = d["search"]["best"]
        out[f"{name}_chain"] = f"{name}_deferred@k{best['chain']['depth']}"
        out[f"{name}_tree"] = f"{name}_tree@n{best['grown']['nodes']}"
    run = _run(doc)
    chains = [m for m in doc["modes"] if m.startswith("flash_deferred@")]
    out["flash_fastest_chain"] = max(chains, key=lambda m: _interval(run, m, "baseline", speed_of=True)["value"])
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
    if lo >= target:
        return f"reaches {target:g}x the chain's"
    if hi < target:
        return f"falls short of {target:g}x the chain's"
    return f"cannot be told from {target:g}x the chain's at this sample size"


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
    tree = best["flash_tree"]
    for other in (best["flash_fastest_chain"], "hf_assisted", "hf_assisted_defaults"):
        r = _interval(run, tree, other)
        out[other] = {**r, "verdict": which_faster(r["lo"], r["hi"], "the tree", other)}
    out["equal"] = sum(bool(r["matches_baseline"]) for r in doc["records"])
    out["samples"] = len(doc["records"])
    out["modes"] = best
    return out


def tree_text(doc: dict) -> str:
    """What ``thesis-lib tree-bench`` prints before its JSON line."""
    from .formatting import to_markdown

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
        lines.append(f"{v['modes']['flash_tree']} over {other}: {x['value']:.2f}x [{x['lo']:.2f}, {x['hi']:.2f}] "
                     f"({x['verdict']})")
    lines.append(f"equal to target-only: {v['equal']}/{v['samples']} timed samples")
    return "\n".join(lines)
