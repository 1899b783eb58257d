"""The thesis' chapter-4 tables as DataFrames with its rows and column names: ``table_4_N`` of a model-bench document
(4.1-4.4) or a :class:`~thesis_lib.bench.runs.Run` (pooled as in :mod:`~thesis_lib.analysis.pooled`); :data:`TABLES`
is every table ``thesis-lib table`` knows, :mod:`~thesis_lib.analysis.diagnostics`' included.
"""

from __future__ import annotations

import functools

import pandas as pd

from ..bench.modes import parse
from ..bench.runs import Run
from ..errors import ConfigError
from . import diagnostics, uncertainty
from .pooled import LABELS, as_run, per_sample_ratios, quartiles3, samples_of, totals


LOW, HIGH = "95 % low", "95 % high"


def _bounds(ci: dict | None, of: str = "") -> dict:
    """A 95 % interval's columns, named after the column ``of`` (missing values where there is none)."""
    of = f"{of} " if of else ""
    return {of + LOW: ci["lo"] if ci else float("nan"), of + HIGH: ci["hi"] if ci else float("nan")}


def _speedups(run: Run, pairs: list[tuple[str, str, str]], table: str) -> pd.DataFrame:
    rows = []
    for label, a, b in pairs:
        ta, tb = totals(samples_of(run, a, table)), totals(samples_of(run, b, table))
        rows.append({"Comparison": label, "Metric": "Decode Tok/s", "A": ta["decode_tokens_per_s"],
                     "B": tb["decode_tokens_per_s"], "Speedup": tb["decode_tokens_per_s"] / ta["decode_tokens_per_s"],
                     **_bounds(uncertainty.ratio_interval(run, b, a))})
    return pd.DataFrame(rows)


def _latency_rows(stats: dict, labels: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame([{"Mode": label, "Mean latency (ms)": stats[key]["mean_ms"], "P50 (ms)": stats[key]["p50_ms"],
                          "P95 (ms)": stats[key]["p95_ms"], "Tok/s": stats[key]["tokens_per_s"]}
                         for key, label in labels.items()])


def _model_bench_part(doc: dict, part: str, table: str) -> dict:
    if part not in doc:
        raise ConfigError(f"This model-bench result has no {part!r} part (Table {table} needs it); "
                          f"run `thesis-lib model-bench --parts {part}`.")
    return doc[part]["stats"]


def table_4_1(doc: dict) -> pd.DataFrame:
    """Single-step head latency, dense LM head vs FlashHead, from a model-bench document (section 4.3.1)."""
    return _latency_rows(_model_bench_part(doc, "head", "4.1"), {"dense": "Dense LM head", "flashhead": "FlashHead"})


def _mean_speedup(doc: dict, part: str, table: str, comparison: str, metric: str, cols: tuple[str, str]) -> pd.DataFrame:
    st = _model_bench_part(doc, part, table)
    d, f = st["dense"]["mean_ms"], st["flashhead"]["mean_ms"]
    raw = doc[part].get("times_ms")  # a document measured before the raw timings were kept has no interval
    ci = uncertainty.timing_interval(raw["dense"], raw["flashhead"], doc[part]["items"]) if raw else None
    return pd.DataFrame([{"Comparison": comparison, "Metric": metric, cols[0]: d, cols[1]: f, "Speedup": d / f,
                          **_bounds(ci)}])


def table_4_2(doc: dict) -> pd.DataFrame:
    """Head-level speedup (ratio of mean latencies) of Table 4.1."""
    return _mean_speedup(doc, "head", "4.2", "Dense LM head vs. FlashHead", "Single-step mean latency",
                         ("Dense head", "FlashHead"))


def table_4_3(doc: dict) -> pd.DataFrame:
    """Complete single-step decode latency of the dense and FlashHead drafts (section 4.3.2)."""
    return _latency_rows(_model_bench_part(doc, "step", "4.3"), {"dense": "Dense model", "flashhead": "Flash model"})


def table_4_4(doc: dict) -> pd.DataFrame:
    """Model-level speedup (ratio of mean decode-step latencies) of Table 4.3."""
    return _mean_speedup(doc, "step", "4.4", "Dense model vs. Flash model", "Mean decode-step latency", ("Dense", "Flash"))


def table_4_5(run) -> pd.DataFrame:
    """End-to-end speculative decoding with dense and FlashHead draft models (ordinary schedule)."""
    run = as_run(run)
    rows = []
    for mode in ("baseline", "dense_ordinary", "flash_ordinary"):
        t = totals(samples_of(run, mode, "4.5"))
        spec = mode != "baseline"
        rows.append({"Mode": LABELS[mode], "Decode Tok/s": t["decode_tokens_per_s"], "TTFT (ms)": t["ttft_ms"],
                     "Acceptance": t["acceptance"] if spec else None, "Decode total (ms)": 1000 * t["decode_s"],
                     "Draft propose (ms)": 1000 * t["propose_s"] if spec else None,
                     "Base verify (ms)": 1000 * t["verify_s"] if spec else None,
                     "Finalize (ms)": 1000 * t["finalize_s"] if spec else None})
    return pd.DataFrame(rows)


#: The comparisons of Tables 4.6 and 4.10: (row, mode A, mode B); the speedup is B's decode tok/s over A's.
COMPARISONS = {
    "4.6": [("Baseline vs. dense draft", "baseline", "dense_ordinary"),
            ("Baseline vs. FlashHead draft", "baseline", "flash_ordinary"),
            ("Dense draft vs. FlashHead draft", "dense_ordinary", "flash_ordinary")],
    "4.10": [("Base only vs. dense deferred", "baseline", "dense_deferred"),
             ("Base only vs. FlashHead deferred", "baseline", "flash_deferred"),
             ("Dense deferred vs. FlashHead deferred", "dense_deferred", "flash_deferred")],
}


def table_4_6(run) -> pd.DataFrame:
    """Decode-throughput speedups of Table 4.5."""
    return _speedups(as_run(run), COMPARISONS["4.6"], "4.6")


def _profile_modes(run: Run) -> list[str]:
    schedule = None
    for m in map(parse, run.modes()):
        if m.draft == "shared":
            schedule = m.schedule
    if schedule is None or not run.config.get("profile"):
        raise ConfigError(f"Run {run.name!r} is not a profiled run (no dense-shared mode); "
                          "Tables 4.7/4.8 come from `thesis-lib profile`.")
    return [f"{d}_{schedule}" for d in ("dense", "shared", "flash")]


def control(run, label: str) -> pd.DataFrame:
    """Table 4.7's control as a comparison row named ``label``: the dense-shared draft's decode speed over the dense
    draft's in a profiled run, with its paired 95 % interval (1 where the checkpoint has no effect of its own)."""
    run = as_run(run)
    dense, shared, _ = _profile_modes(run)
    return _speedups(run, [(label, dense, shared)], "4.7")


def table_4_7(run) -> pd.DataFrame:
    """Phase-level profile of the dense, dense-shared and FlashHead draft modes (a profiled run), with the 95 %
    interval of the draft propose share (Figure 4.2 has every share's, as error bars; all would not fit the page)."""
    run = as_run(run)
    rows = []
    for mode in _profile_modes(run):
        t = totals(samples_of(run, mode, "4.7"))
        rows.append({"Mode": LABELS[mode], "Decode Tok/s": t["decode_tokens_per_s"],
                     "Decode total (ms)": 1000 * t["decode_s"], "Draft propose share": t["propose_s"] / t["decode_s"],
                     "Base verify share": t["verify_s"] / t["decode_s"], "Finalize share": t["finalize_s"] / t["decode_s"],
                     "Acceptance": t["acceptance"], "Mean emitted": t["mean_emitted"],
                     **_bounds(uncertainty.share_interval(run, mode, "draft_propose"))})  # unnamed: the page's width
    return pd.DataFrame(rows)


def draft_split(run, mode: str) -> dict:
    """A profiled mode's proposal split (prefill, body, head, ...; ms and shares), the head's share of decode
    time and the head-only ceiling (the best gain if the head became free)."""
    run = as_run(run)
    t = totals(samples_of(run, mode, "4.8"))
    ph = t["phases"]
    if "draft_head" not in ph:
        raise ConfigError(f"Run {run.name!r} has no draft body/head split (it was not a profiled run).")
    propose = t["propose_s"]
    out = {"propose_ms": 1000 * propose, "decode_ms": 1000 * t["decode_s"]}
    for name in ("draft_prefill", "draft_body", "draft_head", "draft_materialize", "draft_align", "sync"):
        out[f"{name}_ms"] = 1000 * ph.get(name, 0.0)
    out["body_share_of_propose"] = ph.get("draft_body", 0.0) / propose  # the prompt's prefill is TTFT's
    out["head_share_of_propose"] = ph["draft_head"] / propose
    out["head_share_of_decode"] = ph["draft_head"] / t["decode_s"]
    out["head_only_ceiling"] = t["decode_s"] / (t["decode_s"] - ph["draft_head"])
    # without finalization (the appends the deferred schedule saves, and its alignment): an upper bound on a free
    # head's gain under deferred verification, whose decode is no shorter than this
    rest = t["decode_s"] - t["finalize_s"]
    out["head_only_ceiling_bound"] = rest / (rest - ph["draft_head"])
    out["outside_propose_share"] = 1 - propose / t["decode_s"]
    if "target_forward" in ph:
        out["target_forward_ms"] = 1000 * ph["target_forward"]
    return out


def draft_split_table(run) -> pd.DataFrame:
    """The proposal's body/head split and the head-only ceiling per profiled mode (the evidence of 4.8)."""
    run = as_run(run)
    rows = []
    for mode in _profile_modes(run):
        d = draft_split(run, mode)
        rows.append({"Mode": LABELS[mode], "Propose (ms)": d["propose_ms"], "Draft prefill (ms)": d["draft_prefill_ms"],
                     "Body (ms)": d["draft_body_ms"], "Head (ms)": d["draft_head_ms"],
                     "Materialize (ms)": d["draft_materialize_ms"], "Align (ms)": d["draft_align_ms"],
                     "Sync (ms)": d["sync_ms"], "Body share of propose": d["body_share_of_propose"],
                     "Head share of propose": d["head_share_of_propose"],
                     "Head share of decode": d["head_share_of_decode"], "Head-only ceiling": d["head_only_ceiling"],
                     "Target forward (ms)": d.get("target_forward_ms", float("nan"))})
    return pd.DataFrame(rows)


def table_4_8(run) -> pd.DataFrame:
    """Profiling diagnosis and its evidence, each sentence computed from the profiled run."""
    run = as_run(run)
    dense, _, flash = _profile_modes(run)
    f, d = draft_split(run, flash), draft_split(run, dense)
    t = totals(samples_of(run, flash, "4.8"))
    outside = f["outside_propose_share"]
    rows = [
        ("Base verification and finalization dominate" if outside > 0.5 else "Draft proposal dominates",
         f"In the FlashHead draft mode, {100 * outside:.1f}% of measured decode time is outside draft proposal."),
        ("The head-only ceiling is low" if d["head_only_ceiling"] < 1.1 else "The head-only ceiling is substantial",
         f"The dense draft's head accounts for {100 * d['head_share_of_decode']:.1f}% of decode wall time, so a free "
         f"head would give at most {d['head_only_ceiling']:.3f}x; FlashHead's head takes "
         f"{100 * f['head_share_of_decode']:.1f}%."),
        ("The draft body dominates proposal" if f["body_share_of_propose"] > 0.5 else "The draft head dominates proposal",
         f"The draft transformer body accounts for {100 * f['body_share_of_propose']:.1f}% of FlashHead proposal wall "
         f"time, the head for {100 * f['head_share_of_propose']:.1f}% (dense draft: body "
         f"{100 * d['body_share_of_propose']:.1f}%, head {100 * d['head_share_of_propose']:.1f}%)."),
        ("Acceptance is low" if t["acceptance"] < 0.5 else "Acceptance is high",
         f"Acceptance is {t['acceptance']:.3f} and the mean number of emitted tokens per round is {t['mean_emitted']:.3f}."),
    ]
    return pd.DataFrame(rows, columns=["Diagnosis", "Evidence"])


def table_4_8_evidence(run) -> pd.DataFrame:
    """Table 4.8's evidence as numbers, in the layout of ``data/thesis_reference.json``, each with its 95 %
    interval over the prompts."""
    run = as_run(run)
    flash = _profile_modes(run)[2]
    f = draft_split(run, flash)
    t = totals(samples_of(run, flash, "4.8"))
    share = functools.partial(uncertainty.share_interval, run, flash)
    inside = share("draft_propose")
    outside = {"lo": 1 - inside["hi"], "hi": 1 - inside["lo"]}
    propose = ("draft_propose",)
    rows = [("Base verification and finalization dominate", "FlashHead draft: share of measured time outside draft proposal",
             f["outside_propose_share"], "fraction", outside),
            ("The head-only ceiling is low", "FlashHead draft: proposal head share of decode wall time",
             f["head_share_of_decode"], "fraction", share("draft_head")),
            ("The draft body dominates proposal", "FlashHead draft: draft body share of proposal wall time",
             f["body_share_of_propose"], "fraction", share("draft_body", propose)),
            ("The draft body dominates proposal", "FlashHead draft: proposal head share of proposal wall time",
             f["head_share_of_propose"], "fraction", share("draft_head", propose)),
            ("Acceptance is low", "FlashHead draft: acceptance", t["acceptance"], "fraction",
             share("accepted", "drafted")),
            ("Acceptance is low", "FlashHead draft: mean emitted tokens per round", t["mean_emitted"], "tokens/round",
             share("emitted", "rounds"))]
    return pd.DataFrame([(*r[:4], *_bounds(r[4]).values()) for r in rows],
                        columns=["Diagnosis", "Quantity", "Value", "Unit", LOW, HIGH])


def table_4_9(run) -> pd.DataFrame:
    """End-to-end comparison with deferred verification for the dense and FlashHead drafts."""
    run = as_run(run)
    rows = []
    for mode, label in (("baseline", "Base only"), ("dense_deferred", LABELS["dense_deferred"]),
                        ("flash_deferred", LABELS["flash_deferred"])):
        t = totals(samples_of(run, mode, "4.9"))
        spec = mode != "baseline"
        rows.append({"Mode": label, "Samples": t["samples"], "Decode Tok/s": t["decode_tokens_per_s"],
                     "TTFT (ms)": t["ttft_ms"], "Decode total (ms)": 1000 * t["decode_s"],
                     "Acceptance": t["acceptance"] if spec else None, "Mean emitted": t["mean_emitted"] if spec else None,
                     "Base verify calls": t["verify_calls"], "Base append calls": t["append_calls"]})
    return pd.DataFrame(rows)


def table_4_10(run) -> pd.DataFrame:
    """Decode-throughput speedups with deferred verification."""
    return _speedups(as_run(run), COMPARISONS["4.10"], "4.10")


def per_sample_speedups(run) -> dict[str, float]:
    """Tables 4.6 and 4.10's rows as medians of per-sample B/A ratios (robust to drift), keyed ``"<table>|<row>"``."""
    run = as_run(run)
    return {f"{table}|{label}": quartiles3(per_sample_ratios(run, b, against=a))[1]
            for table, pairs in COMPARISONS.items() for label, a, b in pairs if run.of(a) and run.of(b)}


def table_4_11(run) -> pd.DataFrame:
    """The draft path (all proposal time) under deferred verification."""
    run = as_run(run)
    rows = []
    for mode in ("dense_deferred", "flash_deferred"):
        t = totals(samples_of(run, mode, "4.11"))
        path_ms = 1000 * t["propose_s"]
        rows.append({"Mode": LABELS[mode], "Draft path (ms)": path_ms, "Draft path share": t["propose_s"] / t["decode_s"],
                     "Draft ms/decode tok": path_ms / t["decode_tokens"],
                     "Draft path Tok/s": t["decode_tokens"] / t["propose_s"],
                     **_bounds(uncertainty.share_interval(run, mode, "draft_propose"), "Draft path share")})
    return pd.DataFrame(rows)


def flash_vs_dense_quartiles(run, schedule: str = "deferred") -> tuple[float, float, float]:
    """P25, median and P75 of the per-prompt ratio of the FlashHead draft's decode speed over the dense draft's."""
    run = as_run(run)
    return quartiles3(per_sample_ratios(run, f"flash_{schedule}", against=f"dense_{schedule}"))


def embedl_table(doc: dict) -> pd.DataFrame:
    """This library's FlashHead beside Embedl's on the same assets and states: latency and agreement."""
    lat = doc["latency"]
    return pd.DataFrame([{"Head": label, "Median (ms)": lat[name]["p50_ms"], "Mean (ms)": lat[name]["mean_ms"],
                          "P95 (ms)": lat[name]["p95_ms"], "States": doc["states"]}
                         for name, label in (("ours", "this library's FlashHead"),
                                             ("embedl", f"Embedl's FlashHead (flash-head {doc['version']})"))])


def embedl_verdict(doc: dict) -> str:
    """One sentence on agreement, computed: how many states agree and what every difference is."""
    n, same = doc["states"], doc["same"]
    kinds = {k: doc.get(k, 0) for k in ("ties", "padding", "ranking", "other")}
    if same == n:
        what = "no state differs"
    elif kinds["other"] == 0 and kinds["ranking"] == 0 and kinds["padding"] == 0:
        what = f"all {n - same} differences are exact ties broken differently"
    else:
        what = "the differences are " + ", ".join(f"{v} {k}" for k, v in kinds.items() if v)
    return f"the two heads pick the same token on {same} of {n} states ({100 * same / n:.2f} %); {what}"


def phase_shares(run, modes, suffix: str = "") -> dict[str, dict]:
    """Per mode (labelled): decode time shares of propose, verify, finalize and the rest (Figure 4.2), and under
    ``edges`` the 95 % interval of where each of the first three ends (its share plus those before it)."""
    run = as_run(run)
    out = {}
    phases = ("draft_propose", "target_verify", "finalize_align")
    for m in modes:
        t = totals(samples_of(run, m, "4.7"))
        s = {"draft_propose": t["propose_s"] / t["decode_s"], "target_verify": t["verify_s"] / t["decode_s"],
             "finalize_align": t["finalize_s"] / t["decode_s"]}
        s["other"] = max(0.0, 1 - sum(s.values()))
        edges = {ph: uncertainty.share_interval(run, m, phases[:i + 1]) for i, ph in enumerate(phases)}
        out[LABELS[m] + suffix] = {**s, "edges": {ph: (ci["lo"], ci["hi"]) for ph, ci in edges.items()}}
    return out


#: Every table by the name ``thesis-lib table`` knows it.
TABLES = {"4.5": table_4_5, "4.6": table_4_6, "4.7": table_4_7, "4.8": table_4_8, "4.9": table_4_9,
          "4.10": table_4_10, "4.11": table_4_11, "draft-split": draft_split_table, "ratios": diagnostics.ratio_table,
          "peers": diagnostics.peers_table, "pipelined": diagnostics.pipelined_table,
          "verification": diagnostics.verification_table, "accepted": diagnostics.accepted_lengths}


#: Tables of a profiled run: its speeds carry the instrumentation's overhead, so no headline table.
PROFILE_TABLES = ("4.7", "4.8", "draft-split", "ratios", "verification", "accepted")


def available(run) -> dict[str, pd.DataFrame]:
    """Every table this run has the modes for (only :data:`PROFILE_TABLES` for a profiled run)."""
    run = as_run(run)
    out = {}
    for name, fn in TABLES.items():
        if run.config.get("profile") and name not in PROFILE_TABLES:
            continue
        try:
            out[name] = fn(run)
        except ConfigError:
            continue
    return out
