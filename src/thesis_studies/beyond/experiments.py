"""The "Beyond the thesis" chapter's experiments, cached like chapter 4's (:mod:`~thesis_lib.book.shared`); the
tables and verdict are :mod:`thesis_studies.beyond.tables`'s. Whatever is tuned is tuned on held-out calibration
prompts (``CALIBRATION_PER_CATEGORY`` per category, none of them benchmarked); the benchmark prompts only judge.
On those: :func:`calibration`, :func:`margin_curve`, :func:`codesign_sweep`, :func:`lookahead`; end to end:
:func:`beyond_run`, :func:`k_sweep_runs`, :func:`codesign_run`, :func:`confidence_run`; and :func:`sampling_check`.
"""

from __future__ import annotations

import json


from thesis_studies.beyond import codesign
from thesis_studies.sampling import distcheck
from thesis_studies.beyond import lookahead as la
from thesis_studies.beyond.heads import token_counts
from thesis_lib.bench.environment import measured_when
from thesis_lib.bench.modes import variant
from thesis_lib.bench.timing import head_ms
from thesis_lib.bench.prompts import encode, load_prompts, prompt_text
from thesis_lib.decoding.greedy import greedy_generate
from thesis_lib.decoding.state import ModelState
from thesis_studies.beyond.adaptive import AdaptiveFlashHead
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.for_model import flashhead_for
from thesis_studies.beyond.truncated import frequency_head
from thesis_lib.models.loading import output_rows
from thesis_lib.book.params import ROOT, Params
from thesis_lib.book.shared import cached_document, named, obtain, pair


def _calibration_cfg(p: Params):
    return p.bench(freq_calibration=p.calibration_per_category, freq_tokens_generated=p.max_new_tokens)


def calibration_prompts(p: Params):
    return _calibration_cfg(p).calibration_prompts()


def _target_outputs(p: Params) -> dict:
    """The target's greedy output on the calibration prompts (cached JSON)."""
    prompts = calibration_prompts(p)
    key = {"target": p.target, "prompts": [q.question_id for q in prompts], "max_new_tokens": p.max_new_tokens,
           "dtype": p.dtype}

    def compute():
        from thesis_lib.progress import tqdm

        target, _, _ = pair(p)
        state = ModelState(target.model, vocab_limit=target.vocab_limit)
        rows = []
        for q in tqdm(prompts, desc="target on calibration prompts", disable=not p.progress):
            ids = encode(target.tokenizer, prompt_text(q), chat=True, thinking=p.thinking)
            gen = greedy_generate(state, ids, max_new_tokens=p.max_new_tokens, eos_ids=target.eos_ids)
            rows.append({"question_id": q.question_id, "category": q.category, "prompt_ids": ids, "tokens": gen.tokens})
        return {"sequences": rows}

    return cached_document(p, "calibration", key, compute)


def calibration(p: Params) -> dict:
    """Teacher-forced draft states on the calibration prompts: ``states`` [N, D], the target's and the dense draft
    head's tokens ``targets`` and ``dense`` [N], ``categories`` per row, and the ``sequences``."""
    doc = _target_outputs(p)
    _, draft, _ = pair(p)
    seqs = [(s["prompt_ids"], s["tokens"]) for s in doc["sequences"]]
    states, targets, owner = codesign.teacher_forced(draft.model, seqs, vocab_limit=draft.vocab_limit,
                                                     progress=p.progress)
    dense_head = DenseGreedyHead.from_model(draft.model, draft.vocab_limit)
    dense = codesign.head_tokens(dense_head, states)
    cats = [doc["sequences"][i]["category"] for i in owner]
    return {"states": states, "targets": targets, "dense": dense, "categories": cats, "sequences": doc["sequences"]}


def margin_curve(p: Params, cal: dict | None = None) -> dict:
    """Adaptive probing over ``ADAPTIVE_MARGINS`` beside the fixed default, on the calibration states (cached JSON):
    mean probes, agreement, acceptance, head latency, for :func:`thesis_studies.beyond.tables.tuned_margin`."""
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "margins": list(p.adaptive_margins), "min_probes": p.adaptive_min_probes, "probes": p.probes,
           "clusters": p.clusters, "assets": p.assets}

    def compute():
        c = cal or calibration(p)
        _, _, head = pair(p)
        fixed = codesign.head_quality(head, c["states"], c["targets"], c["dense"])
        rows = [{"margin": None, "mean_probes": float(head.n_probes), **fixed,
                 "head_ms": head_ms(head, c["states"])}]
        for m in p.adaptive_margins:
            a = AdaptiveFlashHead(head, margin=m, min_probes=p.adaptive_min_probes, max_probes=head.n_probes)
            q = codesign.head_quality(a, c["states"], c["targets"], c["dense"])
            mean = a.mean_probes
            rows.append({"margin": m, "mean_probes": mean, **q, "head_ms": head_ms(a, c["states"])})
        return {"rows": rows, "n_probes": head.n_probes, "n_clusters": head.n_clusters, "states": int(c["states"].shape[0])}

    return cached_document(p, "margins", key, compute)


def codesign_sweep(p: Params, cal: dict | None = None) -> dict:
    """The co-design sweep (cached JSON): FlashHead at each cluster size x probe count and the frequency-truncated
    head at the same candidate counts, with cost-model predictions from step costs measured here."""
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "sizes": list(p.codesign_cluster_sizes), "k_max": p.k_max, "kmeans_iterations": p.kmeans_iterations,
           "dtype": p.dtype}

    def compute():
        c = cal or calibration(p)
        target, draft, default = pair(p)
        rows_v = output_rows(draft.model)
        ids = c["sequences"][0]["prompt_ids"]
        dense_head = DenseGreedyHead.from_model(draft.model, draft.vocab_limit)
        costs = codesign.step_costs(ModelState(target.model, vocab_limit=target.vocab_limit), draft.model, ids,
                                    dense_head, k_max=p.k_max, vocab_limit=draft.vocab_limit)
        weight = draft.model.get_output_embeddings().weight.detach()  # one dense copy for every head built here
        rows = []
        for b in p.codesign_cluster_sizes:  # one FlashHead at a time: each holds a copy of the head's rows
            n_c = rows_v // b
            head = default if n_c == default.n_clusters else flashhead_for(
                draft, n_clusters=n_c, iterations=p.kmeans_iterations, path=p.flash_path, progress=p.progress,
                weight=weight)
            probes = sorted({max(1, n_c // d) for d in (256, 128, 64, 32, 16, 8)}
                            | ({default.n_probes} if n_c == default.n_clusters else set()))
            rows += codesign.sweep({n_c: head}, {n_c: probes}, c["states"], c["targets"], c["dense"], costs,
                                   k_max=p.k_max, progress=p.progress)
            del head
        dense_q = codesign.head_quality(dense_head, c["states"], c["targets"], c["dense"])
        dense_pred = codesign.predict(dense_q["alpha"], costs["dense_head_ms"], costs, k_max=p.k_max)
        counts, corpus = token_counts(_calibration_cfg(p), draft, progress=p.progress)
        specials = default.special_ids.tolist()
        freq = []
        for n in sorted({r["candidates"] - len(specials) for r in rows}):
            h = frequency_head(draft, counts, n, specials, weight=weight)
            q = codesign.head_quality(h, c["states"], c["targets"], c["dense"])
            ms = head_ms(h, c["states"])
            pred = codesign.predict(q["alpha"], ms, costs, k_max=p.k_max)
            freq.append({"candidates": h.candidates_per_step(), **q, "head_ms": ms, "k": pred["k"],
                         "tokens_per_s": pred["tokens_per_s"], "speedup": pred["speedup"]})
        return {"rows": rows, "front": codesign.pareto(rows), "freq": freq, "costs": costs,
                "dense": {**dense_q, "head_ms": costs["dense_head_ms"], **{k: dense_pred[k] for k in ("k", "tokens_per_s", "speedup")}},
                "default": {"clusters": default.n_clusters, "probes": default.n_probes},
                "corpus": corpus, "states": int(c["states"].shape[0])}

    return cached_document(p, "codesign", key, compute)


def lookahead(p: Params) -> dict:
    """The FlashHead draft's greedy lookahead (``k_max`` tokens with its head's probabilities) and the lookup's
    proposal at each position of the target's calibration outputs, cached (:mod:`thesis_studies.beyond.lookahead`)."""
    doc = _target_outputs(p)
    key = {"draft": p.draft, "target": p.target, "cal": p.calibration_per_category, "n": p.max_new_tokens,
           "depth": p.k_max, "probes": p.probes, "clusters": p.clusters, "assets": p.assets, "dtype": p.dtype}

    def compute():
        seqs = [(s["prompt_ids"], s["tokens"]) for s in doc["sequences"]]
        return {"rows": _lookahead_rows(p, seqs, [{"category": s["category"]} for s in doc["sequences"]]),
                "depth": p.k_max}

    return cached_document(p, "lookahead", key, compute)


def _lookahead_rows(p: Params, seqs: list, labels: list[dict]) -> list[dict]:
    """The FlashHead draft's lookahead (depth ``k_max``) over ``(prompt_ids, target tokens)``, each row labelled."""
    _, draft, head = pair(p)
    rows = la.draft_lookahead(draft.model, head, seqs, depth=p.k_max, vocab_limit=draft.vocab_limit,
                              progress=p.progress)
    return [{**row, **label} for row, label in zip(rows, labels)]


#: The confidence run's modes: the thesis-style draft at the main K beside the two confidence-stopped drafts.
CONFIDENCE_MODES = ("baseline", "flash_deferred", "flash_deferred_sk", "hybrid_deferred_sk")


def run_lookahead(p: Params, run) -> dict:
    """The same lookahead on a finished run's prompts and baseline outputs (cached JSON): to check, never tune."""
    qs = {q.question_id: q for q in load_prompts(run.config["prompt_file"])}
    base = [r for r in run.of("baseline") if r["iteration"] == 0]
    key = {"run": run.name, "depth": p.k_max, "outputs": [r["tokens"] for r in base]}

    def compute():
        target, _, _ = pair(p)
        seqs = [(encode(target.tokenizer, prompt_text(qs[r["question_id"]], run.config.get("turns", 1)),
                        chat=run.config.get("chat", True), thinking=run.config.get("thinking")), r["tokens"])
                for r in base]
        labels = [{"question_id": r["question_id"], "category": r["category"]} for r in base]
        return {"rows": _lookahead_rows(p, seqs, labels), "depth": p.k_max, "run": run.name}

    return cached_document(p, "run-lookahead", key, compute)


def confidence_run(p: Params, stop_below: float):
    """The confidence-stopped FlashHead and lookup + FlashHead drafts beside FlashHead deferred, one run."""
    cfg = p.bench(modes=CONFIDENCE_MODES, stop_below=stop_below, k_max=p.k_max, costs=False)
    return obtain(named(cfg, p.set_name, "confidence"), p)


def beyond_run(p: Params, margin: float):
    """Every new mode beside FlashHead deferred, one run (no component costs: predictions use the sweep's)."""
    cfg = p.bench(modes=tuple(p.beyond_modes), adaptive_margin=margin, adaptive_min_probes=p.adaptive_min_probes,
                  freq_calibration=p.calibration_per_category, freq_tokens_generated=p.max_new_tokens,
                  k_max=p.k_max, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, costs=False)
    return obtain(named(cfg, p.set_name, "beyond"), p)


def k_sweep_config(p: Params):
    """Baseline and FlashHead deferred at each K of ``BEYOND_K_SWEEP`` (one run on the beyond run's prompts)."""
    cfg = p.bench(modes=("baseline", *(variant("flash_deferred", k) for k in p.beyond_k_sweep)), costs=False)
    return named(cfg, p.set_name, "beyond-ks")


def k_sweep_runs(p: Params) -> dict:
    """``K -> `` the K sweep's run seen as a run of baseline and the FlashHead deferred draft at that K."""
    run = obtain(k_sweep_config(p), p)
    return {k: run.view({"baseline": "baseline", "flash_deferred": variant("flash_deferred", k)}, k=k)
            for k in p.beyond_k_sweep}


def codesign_run(p: Params, setting: dict):
    """The co-designed FlashHead (clusters, probes, K from the sweep) end to end beside the baseline; another cluster
    count than the configured head's uses this library's clustering (assets hold one clustering only)."""
    _, _, head = pair(p)
    clusters = int(setting["clusters"])
    cfg = p.bench(k=int(setting["k"]), modes=("baseline", "flash_deferred"), clusters=clusters,
                  probes=int(setting["probes"]), costs=False,
                  assets=p.assets if clusters == head.n_clusters else None)
    return obtain(named(cfg, p.set_name, "codesign"), p)


def sampling_check(p: Params) -> tuple[dict, str]:
    """The sampling check's result and its source: the saved ``thesis-lib studies sampling-check`` output
    ``SAMPLING_CHECK_FILE`` names, else the check run here at ``SAMPLING_DELTA``."""
    if p.sampling_check_file and (ROOT / p.sampling_check_file).is_file():
        check = json.loads((ROOT / p.sampling_check_file).read_text(encoding="utf-8"))
        return check, (f"`thesis-lib sampling-check --delta {check['delta']}` ({p.sampling_check_file}, "
                       f"{measured_when(check.get('measured') or {})})")
    check = distcheck.run_all(distcheck.tiny_pair(), delta=p.sampling_delta)
    return check, f"this notebook, delta = {p.sampling_delta}"
