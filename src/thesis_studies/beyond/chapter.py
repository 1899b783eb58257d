"""Chapter 6's glued values, section by section: each function takes a section's documents, runs and tables (from
:mod:`.experiments` and :mod:`.tables`) and returns the values its page glues, name -> value, so that the notebook
shows the tables and figures and glues what these return."""

from __future__ import annotations

from thesis_studies.beyond import tables as t


def sampling_values(check: dict, table, source: str) -> dict:
    """The sampling check's delta (%), fewest draws and lowest power, whether every configuration passes, and its
    negative control's largest |z| and verdict."""
    nc = check["negative_control"]
    return {"sampling_delta": 100 * check["delta"], "sampling_min_draws": int(table.Draws.min()),
            "sampling_min_power": float(table.Power.min()), "sampling_control_z": nc["max_abs_z"],
            "sampling_all_ok": "all pass" if all(r["ok"] for r in check["configurations"]) else "SOME FAIL",
            "sampling_control_ok": "rejected" if not nc["ok"] else "NOT rejected", "sampling_source": source}


def margin_values(cal: dict, curve: dict, margin: float, min_probes: int) -> dict:
    """The tuned margin beside the fixed probe count (the curve's first row) on the calibration states."""
    chosen, fixed = next(r for r in curve["rows"] if r["margin"] == margin), curve["rows"][0]
    return {"margin": margin, "min_probes": min_probes, "calibration_states": int(cal["states"].shape[0]),
            "calibration_prompts": len(cal["sequences"]), "margin_mean_probes": chosen["mean_probes"],
            "fixed_probes": int(fixed["mean_probes"]), "margin_agreement": 100 * chosen["agreement"],
            "fixed_agreement": 100 * fixed["agreement"], "margin_head_ms": chosen["head_ms"],
            "fixed_head_ms": fixed["head_ms"]}


def codesign_values(cd: dict, best: dict) -> dict:
    """The co-design sweep's best setting beside the default one and the truncated head nearest to it in candidates
    (rarely equal: specials are not counted twice); nan where the sweep has either."""
    none = dict.fromkeys(("alpha", "agreement", "head_ms", "tokens_per_s"), float("nan"))
    d = t.default_row(cd) or none
    f = min(cd["freq"], key=lambda r: abs(r["candidates"] - d["candidates"])) if d is not none and cd["freq"] else none
    return {"best_c": int(best["clusters"]), "best_p": int(best["probes"]), "best_k": int(best["k"]),
            "best_pred": best["tokens_per_s"], "default_pred": d["tokens_per_s"], "default_c": cd["default"]["clusters"],
            "default_p": cd["default"]["probes"], "best_vs_default_pred": best["tokens_per_s"] / d["tokens_per_s"],
            "body_ms": cd["costs"]["body_ms"], "target_step_ms": cd["costs"]["target_step_ms"],
            "freq_alpha": 100 * f["alpha"], "freq_agreement": 100 * f["agreement"], "freq_head_ms": f["head_ms"],
            "flash_alpha": 100 * d["alpha"], "flash_agreement": 100 * d["agreement"], "flash_head_ms_cd": d["head_ms"],
            "freq_corpus": f"{cd['corpus']['tokens']:,} tokens ({cd['corpus']['distinct']:,} distinct)"}


def run_values(run, greedy_table, sampling_table) -> dict:
    """The end-to-end run's: pooled speedups of each draft, sampling's, acceptances, the adaptive head's mean probes
    and the median-per-sample speedups, and whether every greedy sample equals target-only output."""
    pooled, sampled = t.column(greedy_table, "Speedup (pooled)"), t.column(sampling_table, "Speedup (pooled)")
    out = {key: pooled(m) for key, m in (
        ("sp_flash", "flash_deferred"), ("sp_adaflash", "adaflash_deferred"), ("sp_freq", "freq_deferred"),
        ("sp_ngram", "ngram_deferred"), ("sp_hybrid", "hybrid_deferred"), ("sp_hk", "flash_deferred_hk"),
        ("sp_ck", "flash_deferred_ck"))}
    median = t.column(greedy_table, "Speedup (median per sample)")
    lossless = all(r["matches_baseline"] for r in run.samples if not r["mode"].startswith("sample_"))
    return {**out, "sp_sample_dense": sampled("sample_dense"), "sp_sample_flash": sampled("sample_flash"),
            "sample_acc_flash": t.column(sampling_table, "Acceptance")("sample_flash"),
            "greedy_acc_flash": t.column(greedy_table, "Acceptance")("flash_deferred"),
            "ada_probes_run": t.column(greedy_table, "Mean probes")("adaflash_deferred"),
            "sp_hybrid_med": median("hybrid_deferred"), "sp_flash_med": median("flash_deferred"),
            "lossless": "every greedy sample equals target-only greedy output" if lossless else "A GREEDY SAMPLE DIFFERS"}


def policy_values(sim: dict, tau: float, conf, conf_table, best_side: str) -> dict:
    """The block-length policies modelled on the lookahead (the tuned threshold and the oracles beside the best fixed
    K, the confidence bins) and the confidence-stopped run's speedups."""
    best, lo, mid, hi = sim["best_fixed"], *sim["reliability"]
    sp = t.column(conf_table, "Speedup (pooled)")
    return {"conf_run": conf.name, "tau": tau, "sim_best_fixed_k": int(best["k"]), "sim_best_fixed": best["speedup"],
            "sim_tau_ratio": sim["tuned"]["speedup"] / best["speedup"],
            "sim_tau_lookup_ratio": sim["tuned_lookup"]["speedup"] / best["speedup"],
            "sim_tau_block": sim["tuned"]["mean_block"], "sim_fixed_block": best["mean_block"],
            **{f"rel_{name}_{key}": 100 * b[field] for name, b in (("hi", hi), ("mid", mid), ("lo", lo))
               for key, field in (("share", "share"), ("acc", "accepted"))},
            "draft_step_ms": sim["step_ms"],
            **{f"sim_{key}_ratio": sim["oracles"][key]["speedup"] / best["speedup"]
               for key in ("oracle", "oracle_lookup", "oracle_free_head", "oracle_free_draft")},
            "sp_conf_flash": sp("flash_deferred_sk"), "sp_conf_hybrid": sp("hybrid_deferred_sk"),
            "sp_conf_thesis": sp("flash_deferred"), "conf_side_ratio": sp(best_side) / sp("flash_deferred"),
            "conf_side_best": t.LABELS[best_side]}


def walk_values(walk, sim: dict, run_look: dict, conf, k: int) -> dict:
    """The policies walked on the confidence run's own lookahead against what the run measured."""
    column = {key: t.column(walk, col) for key, col in (("model", "vs thesis-style, modelled"),
                                                        ("run", "vs thesis-style, measured"))}
    out = {f"walk_{tag}_{w}": column[w](m) for tag, m in (("sk", "flash_deferred_sk"), ("hy", "hybrid_deferred_sk"))
           for w in ("model", "run")}
    parted = t.walk_parted(walk)
    out.update(walk_modes=parted["modes"], **{f"walk_gap_{key}": parted[key] for key in ("rounds", "drafted", "accepted")})
    for key, col in (("draft", "Draft s (model / run)"), ("verify", "Verify s (model / run)")):
        for tag, m in (("hy", "hybrid_deferred_sk"), ("sk", "flash_deferred_sk"), ("fl", "flash_deferred")):
            model_run = walk.set_index("Mode")[col][t.LABELS[m]].split(" / ")
            out[f"walk_{tag}_{key}_model"], out[f"walk_{tag}_{key}_run"] = map(float, model_run)
    same = all(r["matches_baseline"] for r in conf.samples)
    return {**out, "bench_oracle_ratio": t.oracle_ratio(sim, run_look, k, conf.config["max_new_tokens"]),
            "conf_lossless": "every sample equals target-only greedy output" if same else "A SAMPLE DIFFERS"}


def verdict_values(verdict, split: dict) -> dict:
    """The winning configuration against the best fixed K (with its interval), and the FlashHead draft's head and
    proposal as shares of decode time (chapter 4's Table 4.8) with the speedup a free head would give."""
    top = verdict.iloc[0]
    ratio = float(top["vs thesis-style (best fixed K)"])
    return {"winner": top["Configuration"], "winner_ratio": ratio, "winner_gain": 100 * (ratio - 1),
            "winner_lo": float(top["vs best fixed K 95 % low"]), "winner_hi": float(top["vs best fixed K 95 % high"]),
            "flash_head_share": 100 * split["head_share_of_decode"], "head_ceiling": split["head_only_ceiling"],
            "head_ceiling_bound": split["head_only_ceiling_bound"],
            "draft_share": 100 * (1 - split["outside_propose_share"])}
