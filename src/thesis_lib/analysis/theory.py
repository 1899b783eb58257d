"""The closed-form side of chapter 2: what the dense head costs, FlashHead's work ratio, and the speedup
model of speculative decoding. Plain arithmetic, no models run here (the measured inputs come from runs).

- :func:`param_count` / :func:`head_cost`: parameters of a Qwen2/Qwen3 decoder from its config, and the
  share of one token's matrix work spent in the LM head (V x d multiply-adds against the body's).
- :func:`work_ratio`: FlashHead's scored rows over the dense head's, rho = C/V + p*C_size/V = C/V + p/C
  for equal clusters of V/C tokens (score C centroids, then the p probed clusters' members);
  :func:`best_clusters` is the C that minimises it for a probe count (sqrt(p V)).
- :func:`expected_emitted` and :func:`speedup` (the cost model, :mod:`thesis_lib.decoding.costs`): expected
  tokens per round, and the speedup over target-only decoding E / (K c + v + a) in target steps: c the
  draft/target step-cost ratio, v the verify forward, a the append (1 ordinary, 0 deferred).
- :func:`measured_costs`: those ratios from a run's component costs (medians over its prompts);
  :func:`sweep_speedups`: the model's speedup over K beside a K sweep's measured one (Figure 4.4).
"""

from __future__ import annotations

import math
import statistics

from ..decoding.costs import expected_emitted, speedup
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
    """rho = C/V + p/C: rows FlashHead scores per step over the dense head's V (works on arrays too)."""
    return n_clusters / vocab + n_probes / n_clusters


def best_clusters(n_probes: int, vocab: int) -> float:
    return math.sqrt(n_probes * vocab)


def alpha_from_emitted(mean_emitted: float, k: int) -> float:
    """The per-token acceptance that gives this mean emitted per round under the i.i.d. model (bisection)."""
    target = min(max(mean_emitted, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_emitted(mid, k) < target else (lo, mid)
    return (lo + hi) / 2


def measured_costs(run) -> dict:
    """Step-cost ratios from a run's component costs (medians over its prompts): c (dense and FlashHead
    draft step / target step), v (verify forward of K and K+1 tokens / target step)."""
    costs = [r["component_costs_s"] for r in run.samples if r.get("component_costs_s")]
    if not costs:
        raise ConfigError(f"Run {run.name!r} measured no component costs (it ran with costs off).")
    med = {key: statistics.median(c[key] for c in costs if key in c) for key in costs[0]}
    k = run.config["k"]
    t = med["target_step_s"]
    out = {"k": k, "target_step_ms": 1000 * t, "draft_step_ms": 1000 * med["draft_step_s"],
           "c_dense": med["draft_step_s"] / t, "verify_k": med[f"target_verify_{k}_s"] / t,
           "verify_k1": med[f"target_verify_{k + 1}_s"] / t}
    if "flash_draft_step_s" in med:
        out["flash_draft_step_ms"] = 1000 * med["flash_draft_step_s"]
        out["c_flash"] = med["flash_draft_step_s"] / t
    return out


def sweep_speedups(sweeps: dict, run) -> tuple[dict, dict]:
    """Figure 4.4's data: per deferred mode, measured pooled speedup over target-only at each K of the sweep,
    and the chapter 2 model's (the main run's measured costs, acceptance from its mean emitted per round)."""
    measured, model = {}, {}
    costs = measured_costs(run)
    for m, c in (("dense_deferred", costs["c_dense"]), ("flash_deferred", costs.get("c_flash", costs["c_dense"]))):
        label = LABELS[m]
        measured[label] = {k: totals(r.of(m))["decode_tokens_per_s"] / totals(r.of("baseline"))["decode_tokens_per_s"]
                           for k, r in sorted(sweeps.items())}
        a = alpha_from_emitted(totals(run.of(m))["mean_emitted"], run.config["k"])
        model[label] = {k: float(speedup(a, k, c, costs["verify_k1"], 0.0)) for k in sweeps}
    return measured, model
