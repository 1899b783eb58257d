"""Chapter 2's closed-form arithmetic: the dense head's cost (:func:`head_cost`), FlashHead's work ratio
(:func:`work_ratio`), and the speedup model E / (K c + v + a) in target steps (:mod:`thesis_lib.decoding.costs`;
a = 1 ordinary, 0 deferred), fed by :func:`measured_costs` and set beside a K sweep by :func:`sweep_speedups`.
"""

from __future__ import annotations

import math

from ..bench.modes import parse
from ..decoding.costs import expected_emitted, round_cost, speedup
from ..errors import ConfigError
from .pooled import LABELS, totals

def param_count(cfg: dict) -> dict:
    """Parameters of a Qwen2/Qwen3 decoder: embedding, body (layers + final norm) and head (0 extra when
    tied). Qwen2 has q/k/v biases; Qwen3 has per-head q/k norms instead."""
    d, v, L, i = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // h
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    if cfg.get("model_type", "qwen2") == "qwen2":
        attn += h * hd + 2 * kv * hd  # biases
    else:
        attn += 2 * hd  # q_norm, k_norm
    layer = attn + 3 * d * i + 2 * d
    body = L * layer + d
    head = 0 if cfg.get("tie_word_embeddings") else v * d
    return {"embedding": v * d, "body": body, "head_extra": head, "total": v * d + body + head,
            "head_matrix": v * d}


def head_cost(cfg: dict) -> dict:
    """The dense head's size and its share of one decode step's matrix work (multiply-adds per token:
    body weights once each, plus V x d for the head; attention over the cache left out)."""
    n = param_count(cfg)
    head = n["head_matrix"]
    return {"vocab": cfg["vocab_size"], "hidden": cfg["hidden_size"], "head_params": head,
            "total_params": n["total"], "head_share_of_params": head / n["total"],
            "head_share_of_step_work": head / (head + n["body"])}


def head_cost_table(configs: dict[str, dict]):
    """One row per model: vocabulary, hidden size, head parameters and the head's two shares."""
    import pandas as pd

    rows = []
    for name, cfg in configs.items():
        c = head_cost(cfg)
        rows.append({"Model": name, "Vocabulary V": c["vocab"], "Hidden d": c["hidden"],
                     "Head V x d (M)": c["head_params"] / 1e6, "Parameters (M)": c["total_params"] / 1e6,
                     "Head share of parameters": c["head_share_of_params"],
                     "Head share of step work": c["head_share_of_step_work"]})
    return pd.DataFrame(rows)


def work_ratio(n_clusters, n_probes, vocab: int):
    """rho = C/V + p/C: rows FlashHead scores per step (C centroids, then p clusters of V/C) over the dense head's
    V; works on arrays too."""
    return n_clusters / vocab + n_probes / n_clusters


def best_clusters(n_probes: int, vocab: int) -> float:
    """The C that minimises :func:`work_ratio` for a probe count: sqrt(p V)."""
    return math.sqrt(n_probes * vocab)


def alpha_from_emitted(mean_emitted: float, k: int) -> float:
    """The per-token acceptance that gives this mean emitted per round under the i.i.d. model (bisection)."""
    target = min(max(mean_emitted, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_emitted(mid, k) < target else (lo, mid)
    return (lo + hi) / 2


def cost_cells(run) -> tuple[list[str], list]:
    """A run's component costs (:func:`~thesis_lib.bench.execute.component_costs`, timed once per prompt and
    iteration at the prompt's context and carried by every mode's sample) as bootstrap cells: the cost names every
    timing has, and per prompt an array [iterations, names] of seconds."""
    import numpy as np

    units: dict = {}
    for r in run.samples:
        if r.get("component_costs_s"):
            units.setdefault(r["question_id"], {}).setdefault(r.get("iteration", 0), r["component_costs_s"])
    if not units:
        raise ConfigError(f"Run {run.name!r} measured no component costs (it ran with costs off).")
    timings = [c for by_it in units.values() for c in by_it.values()]
    names = [k for k in timings[0] if all(k in c for c in timings)]
    return names, [np.array([[c[k] for k in names] for c in by_it.values()], float) for by_it in units.values()]


def _ratio_parts(k: int) -> dict[str, str]:
    """The cost model's ratios to a target step, each by the component cost it divides by the step's."""
    return {"c_dense": "draft_step_s", "c_flash": "flash_draft_step_s", "verify_k": f"target_verify_{k}_s",
            "verify_k1": f"target_verify_{k + 1}_s"}


def measured_costs(run) -> dict:
    """From a run's component costs, pooled over its prompts (:func:`cost_cells`; each a mean over prompts): c
    (dense, FlashHead draft step / target step), v (verify K, K+1 / step)."""
    import numpy as np

    names, cells = cost_cells(run)
    mean = dict(zip(names, np.concatenate(cells).mean(axis=0)))
    k = run.config["k"]
    t = float(mean["target_step_s"])
    out = {"k": k, "target_step_ms": 1000 * t, "draft_step_ms": 1000 * float(mean["draft_step_s"])}
    if "flash_draft_step_s" in mean:
        out["flash_draft_step_ms"] = 1000 * float(mean["flash_draft_step_s"])
    out.update({name: float(mean[part]) / t for name, part in _ratio_parts(k).items() if part in mean})
    return out


def cost_intervals(run) -> dict:
    """The 95 % intervals of :func:`measured_costs`' ratios (``<name>_lo``, ``<name>_hi``), by the bootstrap over
    prompts of the same pooled statistic."""
    from .uncertainty import bootstrap

    names, cells = cost_cells(run)
    t = names.index("target_step_s")
    out = {}
    for name, part in _ratio_parts(run.config["k"]).items():
        if part in names:
            i = names.index(part)
            ci = bootstrap(cells, lambda v, i=i: v[i] / v[t])
            out[f"{name}_lo"], out[f"{name}_hi"] = ci["lo"], ci["hi"]
    return out


def sweep_intervals(sweeps: dict) -> dict:
    """Per deferred mode (labelled) and K, the 95 % interval ``(lo, hi)`` of the sweep's speedup over its
    target-only baseline."""
    from .uncertainty import ratio_interval

    out = {}
    for m in ("dense_deferred", "flash_deferred"):
        out[LABELS[m]] = {}
        for k, r in sorted(sweeps.items()):
            ci = ratio_interval(r, m, "baseline")
            out[LABELS[m]][k] = (ci["lo"], ci["hi"])
    return out


def sweep_speedups(sweeps: dict, run) -> tuple[dict, dict]:
    """Figure 4.4: per deferred mode and K, the sweep's pooled speedup and the model's at the main run's costs."""
    measured, model = {}, {}
    costs = measured_costs(run)
    for m, c in (("dense_deferred", costs["c_dense"]), ("flash_deferred", costs.get("c_flash", costs["c_dense"]))):
        label = LABELS[m]
        measured[label] = {k: totals(r.of(m))["decode_tokens_per_s"] / totals(r.of("baseline"))["decode_tokens_per_s"]
                           for k, r in sorted(sweeps.items())}
        a = alpha_from_emitted(totals(run.of(m))["mean_emitted"], run.config["k"])
        model[label] = {k: float(speedup(a, k, c, costs["verify_k1"], 0.0)) for k in sweeps}
    return measured, model


def attribution(run, mode: str, thesis_emitted: float, thesis_c: float) -> "pd.DataFrame":
    """What separates ``mode``'s measured speedup over target-only decoding from the thesis', one cause at a time:
    the cost model E / (K c + v + a) at this run's round (tokens per round E, draft step c and verified block v in
    target steps; a = 1 in the ordinary schedule), then with the thesis' tokens per round, then also its draft cost,
    then also a block that costs one step. Each row's prediction beside the one before shows what that cause is
    worth at this run's K."""
    import pandas as pd

    costs = measured_costs(run)
    k, v = costs["k"], costs["verify_k1"]
    parsed = parse(mode)
    c = costs["c_flash" if parsed.draft == "flash" else "c_dense"]
    append = 1.0 if parsed.schedule == "ordinary" else 0.0
    e = totals(run.of(mode))["mean_emitted"]
    steps = (("this run's round", e, c, v), ("with the thesis' tokens per round", thesis_emitted, c, v),
             ("and the thesis' draft cost", thesis_emitted, thesis_c, v),
             ("and a block that costs one step", thesis_emitted, thesis_c, 1.0))
    return pd.DataFrame([{"Model input": name, "Tokens per round": ee, "Draft step (target steps)": cc,
                          f"Block of {k + 1} (target steps)": vv, "Predicted speedup": ee / round_cost(k, cc, vv, append)}
                         for name, ee, cc, vv in steps])


def round_shape(runs: dict, draft: str = "flash") -> "pd.DataFrame":
    """The deferred round of the ``draft`` draft in steps of target-only decoding: the thesis' (its Table 4.9's tokens
    per round and decode rates, Table 4.11's draft path share) and each run's of ``runs`` (label -> run), with the
    round's 95 % interval over prompts. Tokens per round E, the draft path's part of the round (all proposal time),
    the rest (the target's verification, the finalisation) and the round; E over the round is the speedup over
    target-only decoding, so a gap to the thesis' speedup splits into the tokens and the round's parts."""
    import pandas as pd

    from . import reference
    from .uncertainty import run_interval

    mode, row = f"{draft}_deferred", LABELS[f"{draft}_deferred"]
    e = reference.value("4.9", row, "Mean emitted")
    steps = e * reference.value("4.9", "Base only", "Decode Tok/s") / reference.value("4.9", row, "Decode Tok/s")
    share = reference.value("4.11", row, "Draft path share")
    rows = [{"Source": "Thesis (Tables 4.9, 4.11)", "Tokens per round": e, "Draft path": share * steps,
             "The rest": (1 - share) * steps, "Round": steps, "95 % low": float("nan"), "95 % high": float("nan")}]
    for label, run in runs.items():
        ci = run_interval(run, (mode, "baseline"), lambda s: s[mode]["decode_s"] / s[mode]["rounds"]
                          * s["baseline"]["tokens"] / s["baseline"]["decode_s"])  # seconds a round over a step
        t = totals(run.of(mode))
        path = ci["value"] * t["propose_s"] / t["decode_s"]
        rows.append({"Source": label, "Tokens per round": t["mean_emitted"], "Draft path": path,
                     "The rest": ci["value"] - path, "Round": ci["value"], "95 % low": ci["lo"], "95 % high": ci["hi"]})
    return pd.DataFrame(rows)
