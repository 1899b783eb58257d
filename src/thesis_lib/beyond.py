"""The "Beyond the thesis" chapter's shared results (issue 6), obtained like chapter 4's: run folders and JSON
documents under ``RUNS_DIR`` named by a hash of their parameters, computed once, reused after.

- :func:`calibration`: held-out prompts (the project's prompts the benchmark does not measure, first
  ``CALIBRATION_PER_CATEGORY`` per category), the target's greedy output on them, and the draft's hidden
  states teacher-forced on that output. Everything that is *tuned* is tuned here: the adaptive-probe margin
  and the co-design setting; the benchmark prompts only judge.
- :func:`margin_curve` / :func:`tuned_margin`: adaptive probing over margins (mean probes, agreement,
  acceptance) and the cheapest margin whose agreement stays within ``MARGIN_TOLERANCE`` of the fixed
  default's.
- :func:`codesign_sweep`: clusters (``CODESIGN_CLUSTER_SIZES``) x probes -> per-token acceptance, agreement, head
  latency and the cost model's best K and decode tok/s, with the Pareto front; the frequency-truncated head at
  the same candidate counts beside it.
- :func:`beyond_run`: every new mode against the thesis-style draft in one interleaved benchmark run.
- :func:`k_sweep_runs`: the FlashHead deferred draft at fixed K per ``BEYOND_K_SWEEP`` on the same prompts, for
  the best fixed K per prompt category; :func:`codesign_run`: the co-designed setting end to end.
- :func:`lookahead` / :func:`policy_simulation`: the draft's lookahead on the calibration outputs and every
  block-length policy walked over it (:mod:`thesis_lib.lookahead`): fixed K, the confidence stop over
  ``STOP_BELOW_GRID`` (tuned here), the clairvoyant bounds; :func:`confidence_run`: the tuned confidence stop
  end to end beside the thesis-style draft; :func:`run_lookahead` / :func:`walk_check`: the walk repeated on
  that run's own prompts and set against what it measured.
"""

from __future__ import annotations

import statistics

import torch

from . import adaptive, codesign, protocol, tables
from .bench import _median as median
from .book import Params, _named, cached_document, obtain, pair

#: The new modes of the chapter (all deferred: the thesis' best schedule on every machine it measured).
BEYOND_MODES = ("baseline", "flash_deferred", "adaflash_deferred", "freq_deferred", "ngram_deferred",
                "hybrid_deferred", "flash_deferred_hk", "flash_deferred_ck", "sample_dense", "sample_flash")
#: Agreement an adaptive margin may lose against the fixed default, on the calibration states.
MARGIN_TOLERANCE = 0.005


def _calibration_cfg(p: Params):
    return p.bench(freq_calibration=p.calibration_per_category, freq_tokens_generated=p.max_new_tokens)


def calibration_prompts(p: Params):
    return _calibration_cfg(p).calibration_prompts()


def _target_outputs(p: Params) -> dict:
    """The target's greedy output on the calibration prompts (cached JSON)."""
    from .decoding import greedy_generate
    from .prompts import encode, prompt_text
    from .state import ModelState

    prompts = calibration_prompts(p)
    key = {"target": p.target, "prompts": [q.question_id for q in prompts], "max_new_tokens": p.max_new_tokens,
           "dtype": p.dtype}

    def compute():
        from tqdm.auto import tqdm

        target, _, _ = pair(p)
        state = ModelState(target.model, vocab_limit=target.vocab_limit)
        rows = []
        for q in tqdm(prompts, desc="target on calibration prompts", disable=not p.progress):
            ids = encode(target.tokenizer, prompt_text(q), chat=True)
            gen = greedy_generate(state, ids, max_new_tokens=p.max_new_tokens, eos_ids=target.eos_ids)
            rows.append({"question_id": q.question_id, "category": q.category, "prompt_ids": ids, "tokens": gen.tokens})
        return {"sequences": rows}

    return cached_document(p, "calibration", key, compute)


def calibration(p: Params) -> dict:
    """Teacher-forced draft states on the calibration prompts: ``states`` [N, D], ``targets`` [N] (the target's
    tokens), ``dense`` [N] (the dense draft head's tokens), ``categories`` per row, and the sequences."""
    doc = _target_outputs(p)
    _, draft, _ = pair(p)
    seqs = [(s["prompt_ids"], s["tokens"]) for s in doc["sequences"]]
    states, targets, owner = codesign.teacher_forced(draft.model, seqs, vocab_limit=draft.vocab_limit,
                                                     progress=p.progress)
    from .heads import DenseGreedyHead

    dense_head = DenseGreedyHead.from_model(draft.model, draft.vocab_limit)
    with torch.inference_mode():
        dense = torch.cat([dense_head(states[i:i + 256]) for i in range(0, states.shape[0], 256)]).cpu()
    cats = [doc["sequences"][i]["category"] for i in owner]
    return {"states": states, "targets": targets, "dense": dense, "categories": cats, "sequences": doc["sequences"]}


def margin_curve(p: Params, cal: dict | None = None) -> dict:
    """Adaptive probing over ``ADAPTIVE_MARGINS`` on the calibration states, with the fixed default beside it:
    mean probes, agreement with the dense head, per-token acceptance, head latency (cached JSON)."""
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "margins": list(p.adaptive_margins), "min_probes": p.adaptive_min_probes, "probes": p.probes,
           "clusters": p.clusters, "assets": p.assets}

    def compute():
        c = cal or calibration(p)
        _, _, head = pair(p)
        fixed = codesign.head_quality(head, c["states"], c["targets"], c["dense"])
        rows = [{"margin": None, "mean_probes": float(head.n_probes), **fixed,
                 "head_ms": codesign.head_ms(head, c["states"])}]
        for m in p.adaptive_margins:
            a = adaptive.AdaptiveFlashHead(head, margin=m, min_probes=p.adaptive_min_probes, max_probes=head.n_probes)
            q = codesign.head_quality(a, c["states"], c["targets"], c["dense"])
            mean = a.mean_probes
            rows.append({"margin": m, "mean_probes": mean, **q, "head_ms": codesign.head_ms(a, c["states"])})
        return {"rows": rows, "n_probes": head.n_probes, "n_clusters": head.n_clusters, "states": int(c["states"].shape[0])}

    return cached_document(p, "margins", key, compute)


def tuned_margin(curve: dict) -> float:
    """The margin with the fewest mean probes whose agreement is within MARGIN_TOLERANCE of the fixed default."""
    fixed = curve["rows"][0]
    ok = [r for r in curve["rows"][1:] if r["agreement"] >= fixed["agreement"] - MARGIN_TOLERANCE]
    if not ok:
        return max(r["margin"] for r in curve["rows"][1:])
    return min(ok, key=lambda r: r["mean_probes"])["margin"]


def codesign_sweep(p: Params, cal: dict | None = None) -> dict:
    """The co-design sweep (cached JSON): FlashHead at each cluster size x probe count, and the
    frequency-truncated head at the same candidate counts; cost-model predictions from costs measured here."""
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "sizes": list(p.codesign_cluster_sizes), "k_max": p.k_max, "kmeans_iterations": p.kmeans_iterations,
           "dtype": p.dtype}

    def compute():
        from . import rivals
        from .flashhead import flashhead_for
        from .heads import DenseGreedyHead
        from .models import output_rows
        from .state import ModelState

        c = cal or calibration(p)
        target, draft, default = pair(p)
        rows_v = output_rows(draft.model)
        heads = {}
        for b in p.codesign_cluster_sizes:
            n_c = rows_v // b
            heads[n_c] = default if n_c == default.n_clusters else flashhead_for(
                draft, n_clusters=n_c, iterations=p.kmeans_iterations, path=p.flash_path, progress=p.progress)
        probes = {n_c: sorted({max(1, n_c // d) for d in (256, 128, 64, 32, 16, 8)}
                              | ({default.n_probes} if n_c == default.n_clusters else set())) for n_c in heads}
        ids = c["sequences"][0]["prompt_ids"]
        dense_head = DenseGreedyHead.from_model(draft.model, draft.vocab_limit)
        costs = codesign.step_costs(ModelState(target.model, vocab_limit=target.vocab_limit), draft.model, ids,
                                    dense_head, k_max=p.k_max, vocab_limit=draft.vocab_limit)
        rows = codesign.sweep(heads, probes, c["states"], c["targets"], c["dense"], costs, k_max=p.k_max,
                              progress=p.progress)
        dense_q = codesign.head_quality(dense_head, c["states"], c["targets"], c["dense"])
        dense_pred = codesign.predict(dense_q["alpha"], costs["dense_head_ms"], costs, k_max=p.k_max)
        counts, corpus = protocol.token_counts(_calibration_cfg(p), draft, progress=p.progress)
        specials = default.special_ids.tolist()
        freq = []
        for n in sorted({r["candidates"] - len(specials) for r in rows}):
            h = rivals.frequency_head(draft, counts, n, specials)
            q = codesign.head_quality(h, c["states"], c["targets"], c["dense"])
            ms = codesign.head_ms(h, c["states"])
            pred = codesign.predict(q["alpha"], ms, costs, k_max=p.k_max)
            freq.append({"candidates": h.candidates_per_step(), **q, "head_ms": ms, "k": pred["k"],
                         "tokens_per_s": pred["tokens_per_s"], "speedup": pred["speedup"]})
        return {"rows": rows, "front": codesign.pareto(rows), "freq": freq, "costs": costs,
                "dense": {**dense_q, "head_ms": costs["dense_head_ms"], **{k: dense_pred[k] for k in ("k", "tokens_per_s", "speedup")}},
                "default": {"clusters": default.n_clusters, "probes": default.n_probes},
                "corpus": corpus, "states": int(c["states"].shape[0])}

    return cached_document(p, "codesign", key, compute)


def best_codesign(doc: dict) -> dict:
    """The setting with the highest predicted decode tok/s."""
    return max(doc["rows"], key=lambda r: r["tokens_per_s"])


def lookahead(p: Params) -> dict:
    """The FlashHead draft's greedy lookahead (``k_max`` tokens, with its head's probabilities) and the lookup's
    proposal at every position of the target's output on the calibration prompts (cached JSON; see
    :mod:`thesis_lib.lookahead`)."""
    doc = _target_outputs(p)
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "depth": p.k_max, "probes": p.probes, "clusters": p.clusters, "assets": p.assets, "dtype": p.dtype}

    def compute():
        seqs = [(s["prompt_ids"], s["tokens"]) for s in doc["sequences"]]
        return {"rows": _lookahead_rows(p, seqs, [{"category": s["category"]} for s in doc["sequences"]]),
                "depth": p.k_max}

    return cached_document(p, "lookahead", key, compute)


def _lookahead_rows(p: Params, seqs: list, labels: list[dict]) -> list[dict]:
    """The FlashHead draft's lookahead (depth ``k_max``) over ``(prompt_ids, target tokens)``, each row
    labelled."""
    from . import lookahead as la

    _, draft, head = pair(p)
    rows = la.draft_lookahead(draft.model, head, seqs, depth=p.k_max, vocab_limit=draft.vocab_limit,
                              progress=p.progress)
    return [{**row, **label} for row, label in zip(rows, labels)]


#: The confidence run's modes: the thesis-style draft at the main K beside the two confidence-stopped drafts.
CONFIDENCE_MODES = ("baseline", "flash_deferred", "flash_deferred_sk", "hybrid_deferred_sk")


def policy_simulation(p: Params, look: dict | None = None, doc: dict | None = None) -> dict:
    """Block-length policies walked over the calibration lookahead with the co-design sweep's measured costs
    (the FlashHead draft at its default setting): fixed K = 1..``k_max``, the confidence threshold over
    ``stop_below_grid`` (alone and with the free lookup), and the clairvoyant oracle (alone, with the lookup,
    with a free head, with a free draft). Speedups are over the modelled target-only time. The tuned
    threshold (``tuned_stop_below``) is the grid's best without the lookup."""
    from . import lookahead as la

    look = look or lookahead(p)
    doc = doc or codesign_sweep(p)
    costs = doc["costs"]
    rows, verify = look["rows"], costs["verify_ms"]
    step = costs["body_ms"] + default_row(doc)["head_ms"]
    target_ms = sum(len(r["target"]) - 1 for r in rows) * la.verify_cost(verify)(1)

    def entry(res: dict, **kw) -> dict:
        out = {**kw, "speedup": target_ms / res["ms"]}
        if "rounds" in res and res["rounds"]:
            out.update(mean_block=res["drafted"] / res["rounds"], accepted_share=res["accepted"] / res["drafted"])
        return out

    fixed = [entry(la.simulate(rows, la.fixed_policy(k), step_ms=step, verify_ms=verify), k=k)
             for k in range(1, p.k_max + 1)]
    thresholds = [entry(la.simulate(rows, la.threshold_policy(t, p.k_max), step_ms=step, verify_ms=verify,
                                    lookup=lookup), stop_below=t, lookup=lookup)
                  for lookup in (False, True) for t in p.stop_below_grid]
    oracles = {name: entry(la.oracle(rows, step_ms=s, verify_ms=verify, k_max=p.k_max, lookup=lk))
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


def run_lookahead(p: Params, run) -> dict:
    """The same lookahead on a finished run's prompts and its baseline's greedy outputs (cached JSON): to check
    the walk against what the run measured, never to tune anything."""
    from .prompts import encode, load_prompts, prompt_text

    qs = {q.question_id: q for q in load_prompts(run.config["prompt_file"])}
    base = [r for r in run.of("baseline") if r["iteration"] == 0]
    key = {"run": run.name, "depth": p.k_max, "outputs": [r["tokens"] for r in base]}

    def compute():
        target, _, _ = pair(p)
        seqs = [(encode(target.tokenizer, prompt_text(qs[r["question_id"]], run.config.get("turns", 1)),
                        chat=run.config.get("chat", True)), r["tokens"]) for r in base]
        labels = [{"question_id": r["question_id"], "category": r["category"]} for r in base]
        return {"rows": _lookahead_rows(p, seqs, labels), "depth": p.k_max, "run": run.name}

    return cached_document(p, "run-lookahead", key, compute)


def walk_check(sim: dict, look: dict, run, stop_below: float):
    """Table 6.9: the walk against the measured run, per mode on the run's own prompts: rounds, drafted and
    accepted tokens, seconds drafting and verifying, and the speedup ratio to the thesis-style mode, modelled
    and measured."""
    import pandas as pd

    from . import lookahead as la

    cap = int(look["depth"])
    policies = {"flash_deferred": (la.fixed_policy(run.config["k"]), False),
                "flash_deferred_sk": (la.threshold_policy(stop_below, cap), False),
                "hybrid_deferred_sk": (la.threshold_policy(stop_below, cap), True)}
    verify = sim["verify_ms"]
    modelled = {m: la.simulate(look["rows"], pol, step_ms=sim["step_ms"], verify_ms=verify, lookup=lk)
                for m, (pol, lk) in policies.items()}
    pooled = mode_table(run).set_index("Mode")["Speedup (pooled)"]
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
                     "vs thesis-style, measured": float(pooled[LABELS[m]] / pooled[LABELS["flash_deferred"]])})
    return pd.DataFrame(rows)


def best_mode(table, modes) -> str:
    """Of ``modes``, the one with the highest pooled speedup in a :func:`mode_table`."""
    pooled = table.set_index("Mode")["Speedup (pooled)"]
    return max(modes, key=lambda m: float(pooled[LABELS[m]]))


def walk_pair(table, column: str, mode: str) -> tuple[float, float]:
    """(modelled, measured) of a "model / run" column of :func:`walk_check`'s table, for one mode."""
    model, run = table.set_index("Mode")[column][LABELS[mode]].split(" / ")
    return float(model), float(run)


def _phase(records, name: str) -> float:
    """Seconds a phase of the decoding loop took, summed over records."""
    return sum((r.get("phase_s") or {}).get(name, 0.0) for r in records)


def confidence_run(p: Params, stop_below: float):
    """The confidence-stopped drafts (FlashHead, and the unpadded lookup + FlashHead hybrid) beside the
    thesis-style FlashHead deferred draft at the main K and the baseline, one interleaved run."""
    cfg = p.bench(modes=CONFIDENCE_MODES, stop_below=stop_below, k_max=p.k_max, costs=False)
    return obtain(_named(cfg, p.set_name, "confidence"), p)


def beyond_run(p: Params, margin: float):
    """Every new mode of the chapter beside the thesis-style FlashHead deferred draft, one interleaved run."""
    cfg = p.bench(modes=tuple(p.beyond_modes), adaptive_margin=margin, adaptive_min_probes=p.adaptive_min_probes,
                  freq_calibration=p.calibration_per_category, freq_tokens_generated=p.max_new_tokens,
                  k_max=p.k_max, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p)
    return obtain(_named(cfg, p.set_name, "beyond"), p)


def k_sweep_runs(p: Params) -> dict:
    """Baseline and the FlashHead deferred draft at each K of ``BEYOND_K_SWEEP`` on the beyond run's prompts."""
    out = {}
    for k in p.beyond_k_sweep:
        cfg = p.bench(k=k, modes=("baseline", "flash_deferred"), costs=False)
        out[k] = obtain(_named(cfg, p.set_name, f"beyond-k{k}"), p)
    return out


def codesign_run(p: Params, setting: dict):
    """The co-designed FlashHead (clusters, probes, K from the sweep) end to end, beside the baseline."""
    cfg = p.bench(k=int(setting["k"]), modes=("baseline", "flash_deferred"), clusters=int(setting["clusters"]),
                  probes=int(setting["probes"]), costs=False)
    return obtain(_named(cfg, p.set_name, "codesign"), p)


def per_category_speedups(runs: dict[str, object], mode_of: dict[str, str]) -> "object":
    """Pooled decode speedup over the same run's baseline, per prompt category and overall, for each labelled
    (run, mode); a DataFrame with a row per label."""
    import pandas as pd

    rows = []
    for label, run in runs.items():
        mode = mode_of[label]
        recs = run.of(mode)
        base = {(r["iteration"], r["question_id"]): r for r in run.of("baseline")}
        row = {"Setting": label}
        for cat in sorted({r["category"] for r in recs}) + ["all"]:
            rs = [r for r in recs if cat == "all" or r["category"] == cat]
            bs = [base[(r["iteration"], r["question_id"])] for r in rs]
            t = tables.totals(rs)["decode_tokens_per_s"]
            b = tables.totals(bs)["decode_tokens_per_s"]
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
    """Per mode: pooled decode tok/s, pooled and per-sample-median speedup over its baseline (greedy or
    sampling), acceptance, mean emitted per round, and what the mode counted (probes, lookups, K)."""
    import pandas as pd

    from .bench import baseline_of

    rows = []
    for m in modes or run.modes():
        rs = run.of(m)
        base_mode = baseline_of(m)
        base = {(r["iteration"], r["question_id"]): r for r in run.of(base_mode)}
        t = tables.totals(rs)
        b = tables.totals([base[(r["iteration"], r["question_id"])] for r in rs])
        per = [r["decode_tokens_per_s"] / base[(r["iteration"], r["question_id"])]["decode_tokens_per_s"] for r in rs
               if r["decode_tokens_per_s"] and base[(r["iteration"], r["question_id"])]["decode_tokens_per_s"]]
        drafted = [d for r in rs for d in r.get("drafted_per_round", [])]
        lookups = [r.get("lookup_rounds", r.get("lookup_matched")) for r in rs]  # hybrid / prompt lookup only
        row = {"Mode": LABELS.get(m, m), "Against": LABELS[base_mode], "Decode Tok/s": t["decode_tokens_per_s"],
               "Speedup (pooled)": t["decode_tokens_per_s"] / b["decode_tokens_per_s"] if m != base_mode else 1.0,
               "Speedup (median per sample)": median(per) if m != base_mode else 1.0,
               "Acceptance": t["acceptance"], "Mean emitted": t["mean_emitted"],
               "Mean K": statistics.fmean(drafted) if drafted else None,
               "Mean probes": median(r.get("mean_probes") for r in rs),
               "Lookup rounds": sum(lookups) / sum(r["rounds"] for r in rs) if None not in lookups else None}
        rows.append(row)
    return pd.DataFrame(rows)


def best_fixed_k(sweep: dict, run, mode: str = "flash_deferred") -> tuple[dict, dict]:
    """Per category and overall, the fixed K with the highest pooled speedup of ``mode`` over the same run's
    baseline, among the sweep's runs and the main run (at its own K). Returns ({category: K}, {category: speedup})."""
    runs = {**{k: r for k, r in sweep.items()}, run.config["k"]: run}
    table = per_category_speedups({k: r for k, r in runs.items()}, {k: mode for k in runs})
    table = table.set_index("Setting")
    best_k = {c: int(table[c].astype(float).idxmax()) for c in table.columns}
    best = {c: float(table[c].max()) for c in table.columns}
    return best_k, best


def sampling_check(p: Params) -> tuple[dict, str]:
    """The sampling check's result and where it comes from: the saved output of ``thesis-lib sampling-check``
    named by ``SAMPLING_CHECK_FILE``, or (without one) the check run here at ``SAMPLING_DELTA``."""
    import json

    from . import distcheck
    from .book import ROOT

    if p.sampling_check_file and (ROOT / p.sampling_check_file).is_file():
        check = json.loads((ROOT / p.sampling_check_file).read_text(encoding="utf-8"))
        return check, f"`thesis-lib sampling-check --delta {check['delta']}` ({p.sampling_check_file})"
    pair_ = distcheck.tiny_pair()
    rows = [distcheck.run_case(pair_, c, d, s, delta=p.sampling_delta) for c in range(len(distcheck.CASES))
            for d in ("dense", "flash") for s in ("ordinary", "deferred")]
    check = {"delta": p.sampling_delta, "alpha": 1e-3, "power": 0.99, "configurations": rows,
             "negative_control": distcheck.run_always_accept(pair_, delta=p.sampling_delta)}
    check["ok"] = all(r["ok"] for r in rows) and not check["negative_control"]["ok"]
    return check, f"this notebook, delta = {p.sampling_delta}"


def _warp(sampler: dict) -> str:
    return (f"T={sampler['temperature']}" + (f", top-k {sampler['top_k']}" if sampler.get("top_k") else "")
            + (f", top-p {sampler['top_p']}" if sampler.get("top_p") else ""))


def sampling_table(check: dict):
    """Table 6.1: one row per configuration of the sampling check."""
    import pandas as pd

    return pd.DataFrame([{"Draft": r["draft"], "Schedule": r["schedule"], "Warp": _warp(r["sampler"]),
                          "Tokens": r["tokens"], "K": r["k"], "Draws": r["draws"], "Cells": r["cells"],
                          "Max |z|": r["max_abs_z"], "Critical z": r["critical_z"], "Power": r["power"],
                          "Acceptance": r["acceptance"], "Verdict": "ok" if r["ok"] else "FAIL"}
                         for r in check["configurations"]])


def margin_table(curve: dict):
    """Table 6.3: adaptive probing over margins, the fixed default first."""
    import pandas as pd

    return pd.DataFrame([{"Margin": "fixed" if r["margin"] is None else r["margin"], "Mean probes": r["mean_probes"],
                          "Agreement with dense": r["agreement"], "Per-token acceptance": r["alpha"],
                          "Head (ms)": r["head_ms"]} for r in curve["rows"]])


def default_row(doc: dict) -> dict | None:
    """The co-design sweep's row of the default FlashHead setting."""
    d = doc["default"]
    return next((r for r in doc["rows"] if r["clusters"] == d["clusters"] and r["probes"] == d["probes"]), None)


def nearest_freq(doc: dict, row: dict | None) -> dict | None:
    """The truncated head nearest to ``row``'s candidate count (specials it already ranks are not added twice,
    so exact equality is rare)."""
    if row is None or not doc["freq"]:
        return None
    return min(doc["freq"], key=lambda f: abs(f["candidates"] - row["candidates"]))


def codesign_table(doc: dict):
    """Table 6.4: FlashHead at every (C, p), the truncated heads, the dense head."""
    import pandas as pd

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


def category_table(p: Params, run, sweep: dict, co, conf=None):
    """Table 6.6: per category, the FlashHead draft at each fixed K, the adaptive-K modes, the lookup drafters,
    the co-designed FlashHead and (with the confidence run ``conf``) the confidence-stopped drafts, plus a last
    row with the best fixed K of each column. Returns the table and :func:`best_fixed_k`'s ({category: K},
    {category: speedup})."""
    import pandas as pd

    fixed = {f"FlashHead, K = {k}": r for k, r in sorted({**sweep, p.k: run}.items())}
    others = {"FlashHead, K heuristic": (run, "flash_deferred_hk"), "FlashHead, K cost model": (run, "flash_deferred_ck"),
              "Prompt lookup": (run, "ngram_deferred"), "Prompt lookup + FlashHead": (run, "hybrid_deferred"),
              "Co-designed FlashHead": (co, "flash_deferred")}
    if conf is not None:
        others.update({CONFIDENCE_ROWS["flash_deferred_sk"]: (conf, "flash_deferred_sk"),
                       CONFIDENCE_ROWS["hybrid_deferred_sk"]: (conf, "hybrid_deferred_sk")})
    table = per_category_speedups({**fixed, **{k: r for k, (r, _) in others.items()}},
                                  {**{k: "flash_deferred" for k in fixed}, **{k: m for k, (_, m) in others.items()}})
    best_k, best = best_fixed_k(sweep, run)
    table = pd.concat([table, pd.DataFrame([{"Setting": BEST_FIXED_ROW, **best}])], ignore_index=True)
    return table, best_k, best


BEST_FIXED_ROW = "best fixed K (per column)"
CONFIDENCE_ROWS = {"flash_deferred_sk": "FlashHead, confidence stop", "hybrid_deferred_sk": "Prompt lookup + FlashHead, confidence stop"}


def policy_table(sim: dict):
    """Table 6.7: the simulated block-length policies on the calibration prompts: the best fixed K, the tuned
    confidence threshold (alone and with the free lookup), and the clairvoyant bounds; speedup over the
    modelled target-only time and the ratio to the best fixed K (every threshold is in Figure 6.4)."""
    import pandas as pd

    best, tau = sim["best_fixed"]["speedup"], sim["tuned_stop_below"]
    rows = [{"Policy": f"fixed K = {sim['best_fixed']['k']} (the best fixed K)", **_sim_cols(sim["best_fixed"], best)}]
    for key, name in (("tuned", "confidence stop"), ("tuned_lookup", "confidence stop + free lookup")):
        rows.append({"Policy": f"{name}, tau = {tau:g} (tuned)", **_sim_cols(sim[key], best)})
    for key, name in (("oracle", "clairvoyant K (bound)"), ("oracle_lookup", "clairvoyant K + free lookup (bound)"),
                      ("oracle_free_head", "clairvoyant K, head free (bound)"),
                      ("oracle_free_draft", "clairvoyant K, draft free (bound)")):
        rows.append({"Policy": name, **_sim_cols(sim["oracles"][key], best)})
    return pd.DataFrame(rows)


def oracle_ratio(sim: dict, look: dict, k: int) -> float:
    """On another lookahead (a run's prompts): the clairvoyant bound over fixed K = ``k``, at the same costs."""
    from . import lookahead as la

    kw = dict(step_ms=sim["step_ms"], verify_ms=sim["verify_ms"])
    return (la.simulate(look["rows"], la.fixed_policy(k), **kw)["ms"]
            / la.oracle(look["rows"], k_max=int(look["depth"]), **kw)["ms"])


def _sim_cols(r: dict, best: float) -> dict:
    return {"Modelled speedup": r["speedup"], "vs best fixed K": r["speedup"] / best,
            "Mean block": r.get("mean_block"), "Accepted share": r.get("accepted_share")}


def verdict_table(category: "object", modes: "object", best_fixed_all: float):
    """Table 6.10: every adaptive or co-designed configuration's overall speedup and its ratio to the
    thesis-style configuration at its best fixed K, best first."""
    import pandas as pd

    rows = category[~category.Setting.str.startswith("FlashHead, K =") & (category.Setting != BEST_FIXED_ROW)]
    speed = rows.set_index("Setting")["all"]
    pooled = modes.set_index("Mode")["Speedup (pooled)"]
    speed = pd.concat([speed, pd.Series({"FlashHead, adaptive probes": float(pooled[LABELS["adaflash_deferred"]]),
                                         "Frequency-truncated head": float(pooled[LABELS["freq_deferred"]])})])
    ratio = (speed / best_fixed_all).sort_values(ascending=False)
    return pd.DataFrame({"Configuration": ratio.index, "Speedup over target-only": speed[ratio.index].values,
                         "vs thesis-style (best fixed K)": ratio.values})


def draft_share(run, mode: str) -> float:
    """The draft proposal's share of a mode's decode time."""
    t = tables.totals(run.of(mode))
    return t["propose_s"] / t["decode_s"]


def head_share(run, mode: str, head_ms: float) -> float:
    """The draft head's share of a mode's decode time: drafted tokens x one head call / decode time."""
    rs = run.of(mode)
    drafted = sum(r.get("drafted", 0) for r in rs)
    return drafted * head_ms / 1000 / sum(r["decode_s"] for r in rs)


__all__ = ["BEYOND_MODES", "CONFIDENCE_MODES", "lookahead", "policy_simulation", "confidence_run", "run_lookahead", "walk_check", "walk_pair", "best_mode", "oracle_ratio", "calibration", "margin_curve", "tuned_margin", "codesign_sweep", "best_codesign",
           "beyond_run", "k_sweep_runs", "codesign_run", "per_category_speedups", "mode_table", "best_fixed_k",
           "sampling_check", "sampling_table", "policy_table", "CONFIDENCE_ROWS", "margin_table", "default_row", "nearest_freq", "codesign_table",
           "category_table", "verdict_table", "draft_share", "head_share"]
