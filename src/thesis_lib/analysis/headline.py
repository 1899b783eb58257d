"""What reproduced: every end-to-end and model-level ratio of the thesis beside one build's, each judged against the
thesis' own value (the README's results table, the introduction's first screen, chapter 5's verdict table).

:data:`FINDINGS` names each ratio and the thesis table row it comes from; :func:`judge` turns numbers into the
table (a pure function: point, interval and the thesis' value in, verdicts out); :func:`findings` collects a
build's numbers from its main run, profiled run and model-bench document; :func:`committed` finds those in a folder
of run data (the committed default build's by default); :func:`markdown` writes the strip with where its numbers
come from; :func:`counted` says how many reproduced, how many more point the same way and which reverse;
:func:`model_gap` puts the loop's cost-model prediction, at this machine's costs and at the thesis' draft cost,
beside both measured speedups."""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd

from ..bench.runs import load_run
from ..decoding.costs import speedup
from ..errors import ConfigError
from . import reference, tables, theory, uncertainty
from .pooled import totals

ROOT = Path(__file__).resolve().parents[3]
#: The committed default build's run data (``make book``'s runs on the embedded pair).
COMMITTED = ROOT / "data" / "reference" / "book-cpu-embedded"
#: The parameter set of the thesis' cost regime (the target read in float32: a draft step at about the thesis'
#: share of a target step) and its committed chapter-4 run data.
REGIME_SET = "cpu-embedded-thesis-regime"
REGIME = ROOT / "data" / "reference" / f"book-{REGIME_SET}"
#: The two settings every build's findings are shown in, as the pages and the README name them.
SETTINGS = {"default": "the default setting", "regime": "the thesis' cost regime"}
#: Their columns in the side-by-side table.
COLUMNS = {"default": "Default setting", "regime": "Thesis' regime"}
#: Table 4.7's control, as a comparison: the dense-shared draft (a FlashHead checkpoint's body, dense head) over
#: the dense draft, in the profiled run; it isolates the checkpoint from the head.
CONTROL = "Dense draft vs. dense shared"
#: (finding, thesis table, the table's row): each ratio is that row's ``Speedup`` (the control's, Table 4.7's
#: Decode Tok/s of its two modes).
FINDINGS = (
    ("FlashHead head over the dense head", "4.2", "Dense LM head vs. FlashHead"),
    ("Whole draft step, FlashHead over dense", "4.4", "Dense model vs. Flash model"),
    ("Dense draft over target-only, ordinary schedule", "4.6", "Baseline vs. dense draft"),
    ("FlashHead draft over target-only, ordinary schedule", "4.6", "Baseline vs. FlashHead draft"),
    ("FlashHead draft over dense draft, ordinary schedule", "4.6", "Dense draft vs. FlashHead draft"),
    ("Dense deferred over target-only decoding", "4.10", "Base only vs. dense deferred"),
    ("FlashHead deferred over target-only decoding", "4.10", "Base only vs. FlashHead deferred"),
    ("FlashHead draft over dense draft, deferred verification", "4.10", "Dense deferred vs. FlashHead deferred"),
    ("Control: dense-shared draft over dense draft, profiled run", "4.7", CONTROL),
)
NAN = float("nan")


def thesis_value(table: str, row: str) -> float:
    """The thesis' ratio of a finding: the row's Speedup, or for the control Table 4.7's two Decode Tok/s, rounded to
    the three decimals the thesis gives its speedups in (the value the page prints is the one its verdict uses)."""
    if row == CONTROL:
        return round(reference.value("4.7", "Dense shared", "Decode Tok/s")
                     / reference.value("4.7", "Dense draft", "Decode Tok/s"), 3)
    return reference.value(table, row, "Speedup")


def judge(ours: dict[str, tuple[float, float, float]], per_sample: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per finding from this build's numbers, ``ours["<table>|<row>"] = (ratio, low, high)`` (NaN bounds
    where no interval was recorded; a finding missing from ``ours`` was not measured): the thesis' value, this
    build's, its interval, the verdict against the thesis' value (*reproduced*: inside the interval; *larger* /
    *smaller*: the interval entirely above / below it; :func:`~thesis_lib.analysis.uncertainty.against_thesis`)
    and, separately, whether the direction agrees (*yes* / *no* by the interval's side of 1, *cannot tell* when it
    holds 1; :func:`~thesis_lib.analysis.uncertainty.direction`). ``per_sample`` adds the per-sample median."""
    rows = []
    for finding, table, row in FINDINGS:
        key, thesis = f"{table}|{row}", thesis_value(table, row)
        mine, lo, hi = ours.get(key, (None, NAN, NAN))
        measured, bounded = mine is not None, lo == lo and hi == hi
        out = {"Finding": f"{finding} (Table {table})", "Key": key, "Thesis": thesis,
               "This build": mine if measured else NAN, "95 % low": lo, "95 % high": hi,
               "Against the thesis": (uncertainty.against_thesis(lo, hi, thesis) if bounded
                                      else "no interval" if measured else "not measured"),
               "Same direction": uncertainty.direction(thesis, mine, lo, hi) if measured else "not measured"}
        if per_sample is not None:
            out["Per-sample median"] = per_sample.get(key, NAN)
        rows.append(out)
    return pd.DataFrame(rows)


def findings(run, profiled, model_bench: dict, *, per_sample: bool = False) -> pd.DataFrame:
    """:func:`judge` on a build: Tables 4.2/4.4 from the model-bench document (intervals over the timed states and
    contexts), 4.6/4.10 from the main run and the control from the profiled run (paired bootstrap over prompts)."""
    ours = {}
    parts = [("4.2", tables.table_4_2(model_bench)), ("4.4", tables.table_4_4(model_bench)),
             ("4.6", tables.table_4_6(run)), ("4.10", tables.table_4_10(run)), ("4.7", tables.control(profiled, CONTROL))]
    for table, df in parts:
        for _, r in df.iterrows():
            ours[f"{table}|{r['Comparison']}"] = (float(r["Speedup"]), float(r[tables.LOW]), float(r[tables.HIGH]))
    return judge(ours, tables.per_sample_speedups(run) if per_sample else None)


def _found(folder: Path, set_name: str | None) -> tuple[str, str, str]:
    """The paths :func:`committed` reads, or a ``ConfigError`` saying which kind is missing."""
    prefix = f"{glob.escape(set_name)}-" if set_name else "*-"
    runs = sorted(glob.glob(str(folder / f"{prefix}bench-*" / "summary.json")))
    profiles = sorted(glob.glob(str(folder / f"{prefix}profile-*" / "summary.json")))
    docs = sorted(glob.glob(str(folder / f"{prefix}model-bench-*.json")))
    if not runs or not profiles or not docs:
        raise ConfigError(f"{folder} holds no main run ({prefix}bench-*), profiled run ({prefix}profile-*) and "
                          f"model-bench document ({prefix}model-bench-*.json).")
    return runs[0], profiles[0], docs[0]


def committed(folder: str | Path | None = None, set_name: str | None = None) -> tuple:
    """The main run (``*-bench-*``), the profiled run (``*-profile-*``) and the model-bench document
    (``*-model-bench-*.json``) of a build's run data (default: the committed default build's); with ``set_name``,
    only that parameter set's (``<set>-bench-*``, ...: a folder that holds several sets' runs)."""
    import json

    run, profile, doc = _found(Path(folder or COMMITTED), set_name)
    return (load_run(Path(run).parent), load_run(Path(profile).parent), json.loads(Path(doc).read_text(encoding="utf-8")))


def regime_folder(runs_dir: str | Path | None = None) -> tuple[Path, str]:
    """Where the thesis' cost regime's chapter-4 runs are: ``runs_dir`` where a build of its set left its main run,
    profiled run and model-bench document there (:func:`committed`; the first of each by name), else the committed
    folder; and a phrase saying which."""
    if runs_dir is not None:
        try:
            _found(Path(runs_dir), REGIME_SET)
            return Path(runs_dir), f"measured by this machine's build of {REGIME_SET}"
        except ConfigError:
            pass
    return REGIME, f"read from its committed run data (no build of {REGIME_SET} here)"


def regime_beside(set_name: str, runs_dir: str | Path, own: tuple, own_curve: list) -> tuple[tuple, list, str]:
    """The thesis' cost regime beside a build of ``set_name``: its main run, profiled run and model-bench document,
    the runs of its curve (the main run first) and a phrase saying where they come from. A build of the regime's
    own set is its own regime (``own``, ``own_curve``: this build's runs, never older ones in the same folder);
    any other build reads :func:`regime_folder`'s."""
    if set_name == REGIME_SET:
        return own, [own[0], *own_curve], "this build"
    folder, said = regime_folder(runs_dir)
    return committed(folder, REGIME_SET), curve_runs(folder), said


def curve_runs(folder: str | Path) -> list:
    """The thesis' cost regime's main run and its runs with the target in other precisions (``<set>-curve-*``,
    :func:`thesis_lib.book.shared.curve_run`) in ``folder``: the points of the curve the thesis implies."""
    others = sorted(glob.glob(str(Path(folder) / f"{glob.escape(REGIME_SET)}-curve-*" / "summary.json")))
    return [committed(folder, REGIME_SET)[0], *(load_run(Path(f).parent) for f in others)]


def regime_points(runs) -> pd.DataFrame:
    """The curve the thesis implies, one row per run of the same pair with the target at another precision:
    :func:`model_gap`'s measured draft step ``c`` (interval ``c_lo``-``c_hi``), block ``verify``, acceptance
    ``alpha``, speedup of FlashHead deferred over target-only decoding (``lo``-``hi``) and the cost model's
    prediction at the run's costs (``model``), with the target's precision, K and both decode rates; sorted by ``c``."""
    rows = []
    for run in runs:
        g = model_gap(run)
        rows.append({"precision": facts(run)["build_dtype"], "k": g["gap_k"], "c": g["gap_c"], "c_lo": g["gap_c_lo"],
                     "c_hi": g["gap_c_hi"], "verify": g["gap_verify"], "alpha": g["gap_alpha"],
                     "speedup": g["gap_measured"], "lo": g["gap_measured_lo"], "hi": g["gap_measured_hi"],
                     "base_tok_s": totals(run.of("baseline"))["decode_tokens_per_s"],
                     "flash_tok_s": totals(run.of("flash_deferred"))["decode_tokens_per_s"], "model": g["gap_model_here"]})
    return pd.DataFrame(rows).sort_values("c").reset_index(drop=True)


def regime_speed(points: pd.DataFrame, precision: str) -> str:
    """The regime's absolute decode rates (target-only, FlashHead deferred) with the target in ``precision`` beside
    those of the precision whose FlashHead deferred decodes fastest on its curve (:func:`regime_points`, every point
    measured on one machine), as a sentence."""
    regime, best = points[points["precision"] == precision].iloc[0], points.iloc[points["flash_tok_s"].idxmax()]
    return (f"on its machine the regime decodes at {regime['base_tok_s']:.1f} tokens/s target-only and "
            f"{regime['flash_tok_s']:.1f} with FlashHead deferred; the fastest of the {len(points)} target precisions "
            f"measured there, {best['precision']}, at {best['base_tok_s']:.1f} and {best['flash_tok_s']:.1f}")


def round_said(shape: pd.DataFrame, k: int, thesis_c: float) -> str:
    """What :func:`~.theory.round_shape` says of the thesis' round (its first row) beside a run's (its last row), with
    ``k`` draft steps a round at the thesis' isolated draft step ``thesis_c`` (Table 4.3), as a sentence."""
    th, run = shape.iloc[0], shape.iloc[-1]
    same = uncertainty.reads(run["95 % low"], run["95 % high"], "more than", "less than", "as much as", at=th["Round"])
    return (f"a FlashHead deferred round of the thesis cost {th['Round']:.2f} steps of its target-only decoding, of "
            f"which the draft path took {th['Draft path']:.2f}, {th['Draft path'] / (k * thesis_c):.1f} times its {k} "
            f"isolated draft steps ({k * thesis_c:.2f} steps), and the verification and the rest "
            f"{th['The rest']:.2f}; the regime run's round costs {run['Round']:.2f} steps ({run['95 % low']:.2f} to "
            f"{run['95 % high']:.2f}), {same} the thesis', split into a draft path of {run['Draft path']:.2f} and "
            f"{run['The rest']:.2f} for the rest, and brings {run['Tokens per round']:.2f} tokens against the thesis' "
            f"{th['Tokens per round']:.2f}")


def side_by_side(default: pd.DataFrame, regime: pd.DataFrame, columns: dict | None = None) -> pd.DataFrame:
    """Two settings' findings (:func:`judge`, the same rows) in one table: the thesis' value, then each setting's
    ratio, interval and verdict against the thesis (columns named by ``columns``, default :data:`COLUMNS`)."""
    out = {"Finding": default["Finding"], "Thesis": default["Thesis"]}
    for key, df in (("default", default), ("regime", regime)):
        shown, label = strip(df), (columns or COLUMNS)[key]
        out[label] = shown["This build"]
        out[f"{label}: 95 % interval"] = shown["95 % interval"]
        out[f"{label}: against the thesis"] = shown["Against the thesis"]
    return pd.DataFrame(out)


def strip(df: pd.DataFrame) -> pd.DataFrame:
    """The findings ``df`` (:func:`judge`) as the page shows them: the interval as one text column."""
    interval = [f"{uncertainty.bound_text(lo, at)}-{uncertainty.bound_text(hi, at)}x" if lo == lo else "not recorded"
                for lo, hi, at in zip(df["95 % low"], df["95 % high"], df["Thesis"])]
    return pd.DataFrame({"Finding": df["Finding"], "Thesis": df["Thesis"], "This build": df["This build"],
                         "95 % interval": interval, "Against the thesis": df["Against the thesis"],
                         "Same direction": df["Same direction"]})


def facts(run) -> dict:
    """What a build's main run says about the build: the precision its target ran in (a weight-only format by its
    name, else the dtype), its draft's, its prompts, new tokens."""
    models = run.environment.get("models", {})
    target, draft = models.get("target", {}), models.get("draft", {})
    return {"build_dtype": target.get("dtype_requested") or target.get("dtype", "?"),
            "build_draft_dtype": draft.get("dtype_requested") or draft.get("dtype", "?"),
            "build_prompts": len({r["question_id"] for r in run.samples}),
            "build_new_tokens": run.config["max_new_tokens"]}


def cpu_kind(env: dict) -> str | None:
    """The vector extensions a run's CPU ran it with: torch's recorded CPU capability (AVX512, AVX2), else, for runs
    recorded before it was, the kernel path their models' loading named (its AVX-512 path on an AVX-512 CPU; its AVX2
    path also for int8 products on an AVX-512 CPU without VNNI, which such a run cannot tell apart), else None."""
    if env.get("cpu_capability"):
        return str(env["cpu_capability"]).replace("AVX512", "AVX-512")
    kernels = " ".join(str(m.get("cpu_kernels", "")) for m in env.get("models", {}).values())
    return "AVX-512" if "AVX-512" in kernels else "AVX2" if "AVX2 kernel" in kernels else None


def machine_said(env: dict) -> str:
    """A run's machine in words: its CPU, the vector extensions it ran with (:func:`cpu_kind`) and its threads."""
    kind = cpu_kind(env)
    return f"{env.get('cpu', 'a CPU')} ({kind + ', ' if kind else ''}{env.get('torch_threads', '?')} threads)"


def markdown_settings(runs_dir: str | Path | None = None) -> str:
    """The README's results: every finding in the default setting (the committed default build) and in the thesis'
    cost regime (:func:`regime_folder`) in one table, then each setting's count, cost-model account and build line
    (:func:`markdown`'s), and the regime's absolute speed beside its curve's fastest precision (:func:`regime_speed`)."""
    folder, where = regime_folder(runs_dir)
    settings = {"default": committed(), "regime": committed(folder, REGIME_SET)}
    both = side_by_side(findings(*settings["default"]), findings(*settings["regime"]))
    cols = list(COLUMNS.values())
    lines = ["| Finding | Thesis | " + " | ".join(f"{c} | 95 % interval | Against the thesis" for c in cols) + " |",
             "| --- | ---: | " + " | ".join("---: | ---: | ---" for _ in cols) + " |"]
    lines += [f"| {r['Finding']} | {r['Thesis']:.3f}x | " + " | ".join(
        f"{r[c]:.2f}x | {r[f'{c}: 95 % interval']} | {r[f'{c}: against the thesis']}" for c in cols) + " |"
        for _, r in both.iterrows()]
    parts = ["\n".join(lines)]
    for key, data in settings.items():
        f = facts(data[0])
        parts.append(f"**In {SETTINGS[key]}** (the target in {f['build_dtype']}, the draft in {f['build_draft_dtype']}"
                     + (f"; {where}" if key == "regime" else "") + "): "
                     + markdown(*data, timing=key == "default", table=False))
    said = regime_speed(regime_points(curve_runs(folder)), facts(settings["regime"][0])["build_dtype"])
    parts.append(said[0].upper() + said[1:] + ".")
    return "\n\n".join(parts)


def markdown(run, profiled, model_bench: dict, timing: bool = True, table: bool = True) -> str:
    """The strip as a Markdown table (unless not ``table``), the count (:func:`counted`), the cost model's account
    (:func:`why_said`), what the speedups time (:func:`timing_said`, unless not ``timing``) and a line saying which
    build, revision, date and machine it shows."""
    from ..bench.environment import measured_when

    df = findings(run, profiled, model_bench)
    shown = strip(df)
    lines = ["| Finding | Thesis | This build | 95 % interval | Against the thesis | Same direction |",
             "| --- | ---: | ---: | ---: | --- | --- |"]
    lines += [f"| {r['Finding']} | {r['Thesis']:.3f}x | {r['This build']:.2f}x | {r['95 % interval']} | "
              f"{r['Against the thesis']} | {r['Same direction']} |" for _, r in shown.iterrows()]
    lines = lines + [""] if table else []
    env, f = run.environment, facts(run)
    models = env.get("models", {})
    said = counted(df)["headline_count"]
    lines += [said[0].upper() + said[1:] + ".", "", why_said(model_gap(run)), ""]
    lines += [timing_said(run), ""] if timing else []
    lines.append(f"This build: the embedded pair ({models.get('target', {}).get('spec', '?').split(':')[-1]} target "
                 f"in {f['build_dtype']}, {models.get('draft', {}).get('spec', '?').split(':')[-1]} draft in "
                 f"{f['build_draft_dtype']}), {run.config.get('k')} draft tokens per round, {f['build_prompts']} "
                 f"prompts x {f['build_new_tokens']} new tokens, on {machine_said(env)}, "
                 f"{measured_when(env, code_note=False)}. "
                 f"Thesis: {reference.setup()['label'].removeprefix('thesis: ')}. Intervals: a paired bootstrap "
                 f"over the prompts, or over the timed states for the head and the step "
                 f"({uncertainty.RESAMPLES:,} resamples, expanded percentile). *Reproduced*: the thesis' value lies inside "
                 f"the interval; *larger* / *smaller*: the interval lies above / below it; *cannot tell*: the "
                 f"interval holds 1.")
    return "\n".join(lines)


def timing_said(run) -> str:
    """What the speedups time, as the thesis does (decode throughput: the tokens after the first over the time after
    both models' prompt prefills, which TTFT holds), with FlashHead deferred's TTFT and its end-to-end speed (every
    token over TTFT plus decode, pooled) beside target-only decoding's."""
    base, flash = totals(run.of("baseline")), totals(run.of("flash_deferred"))
    return (f"Speedups are of decode throughput, as in the thesis: the tokens after the first over the time after the "
            f"prompt's prefill, by the target and, in the speculative modes, by the draft (time to first token: "
            f"{flash['ttft_ms']:.0f} ms for FlashHead deferred, {base['ttft_ms']:.0f} ms for target-only decoding). "
            f"Counted from each request's start, FlashHead deferred runs at {flash['e2e_tokens_per_s'] / base['e2e_tokens_per_s']:.2f}x "
            f"target-only decoding at this length ({run.config.get('max_new_tokens')} new tokens).")


def _name(finding: str) -> str:
    return finding[0].lower() + finding[1:]


def counted(df: pd.DataFrame) -> dict:
    """How many of the findings ``df`` (:func:`judge`) reproduced, how many more point the thesis' way, which
    reverse (the interval on the other side of 1) and for how many the interval holds 1; and the sentence that
    says so (``headline_count``)."""
    reproduced = int((df["Against the thesis"] == "reproduced").sum())
    same = df["Same direction"].str.startswith("yes") & (df["Against the thesis"] != "reproduced")
    reversed_ = df[df["Same direction"].str.startswith("no")]
    cannot = int((df["Same direction"] == "cannot tell").sum())
    said = f"{reproduced} of {len(df)} of the thesis' values reproduced here (each inside this build's 95 % interval)"
    if same.any():
        said += (f"; {int(same.sum())} more point the thesis' way but differ in size ("
                 + ", ".join(f"{n} {w} here" for w, n in ((w, int((same & (df['Against the thesis'] == w)).sum()))
                                                         for w in ("smaller", "larger")) if n) + ")")
    if len(reversed_):
        said += "; reversed here: " + "; ".join(
            f"{_name(r['Finding'])}, {r['This build']:.2f}x against the thesis' {r['Thesis']:.3f}x"
            for _, r in reversed_.iterrows())
    if cannot:
        said += f"; for {cannot} the interval holds 1, so this build cannot tell their direction"
    return {"headline_reproduced": reproduced, "headline_same_way": int(same.sum()), "headline_reversed": len(reversed_),
            "headline_cannot_tell": cannot, "headline_total": len(df), "headline_count": said}


def model_gap(run) -> dict:
    """The loop's cost model (:func:`~thesis_lib.decoding.costs.speedup`) for FlashHead deferred at the run's K,
    with the run's own acceptance (per token, from its mean emitted per round): its prediction at this machine's
    measured costs (draft step and verified block of K + 1, in target steps), at the thesis' draft cost
    (:func:`~thesis_lib.analysis.reference.draft_cost`) with this machine's block, and at the thesis' draft cost
    with a block verified for the cost of one step; beside this build's measured speedup (with its interval) and
    the thesis'. ``gap_said`` says which side of the measured interval the prediction here falls."""
    costs, ci_costs = theory.measured_costs(run), theory.cost_intervals(run)
    c_name = "c_flash" if "c_flash" in costs else "c_dense"
    k, c = costs["k"], costs[c_name]
    alpha = theory.alpha_from_emitted(totals(run.of("flash_deferred"))["mean_emitted"], k)
    ci = uncertainty.ratio_interval(run, "flash_deferred", "baseline")
    c_thesis = reference.draft_cost("flash")
    out = {"gap_alpha": alpha, "gap_c": c, "gap_c_lo": ci_costs[f"{c_name}_lo"], "gap_c_hi": ci_costs[f"{c_name}_hi"],
           "gap_verify": costs["verify_k1"], "gap_verify_lo": ci_costs["verify_k1_lo"],
           "gap_verify_hi": ci_costs["verify_k1_hi"], "gap_k": k, "gap_c_thesis": c_thesis,
           "gap_model_here": float(speedup(alpha, k, c, costs["verify_k1"])),
           "gap_model_thesis_c": float(speedup(alpha, k, c_thesis, costs["verify_k1"])),
           "gap_model_thesis": float(speedup(alpha, k, c_thesis, 1.0)),
           "gap_measured": ci["ratio"], "gap_measured_lo": ci["lo"], "gap_measured_hi": ci["hi"],
           "gap_thesis": thesis_value("4.10", "Base only vs. FlashHead deferred")}
    out["gap_said"] = gap_said(out["gap_model_here"], ci["lo"], ci["hi"])
    return out


def why_said(gap: dict) -> str:
    """:func:`model_gap` as the README's one paragraph: the prediction at this machine's costs beside the measured
    speedup, then at the thesis' draft cost, beside the thesis' measured speedup."""
    return (f"Why: with this build's acceptance ({gap['gap_alpha']:.2f} per token, K = {gap['gap_k']}), the loop's "
            f"cost model predicts {gap['gap_model_here']:.2f}x for FlashHead deferred over target-only decoding at "
            f"this machine's costs (a FlashHead draft step at {gap['gap_c']:.2f} of a target step, "
            f"{gap['gap_c_lo']:.2f}-{gap['gap_c_hi']:.2f}, a verified block of {gap['gap_k'] + 1} at "
            f"{gap['gap_verify']:.2f} steps, {gap['gap_verify_lo']:.2f}-{gap['gap_verify_hi']:.2f}), {gap['gap_said']} (measured "
            f"{gap['gap_measured']:.2f}x, {gap['gap_measured_lo']:.2f}-{gap['gap_measured_hi']:.2f}x). At the thesis' "
            f"draft cost ({gap['gap_c_thesis']:.3f} of a target step) it predicts {gap['gap_model_thesis_c']:.2f}x with "
            f"this machine's block and {gap['gap_model_thesis']:.2f}x with a block that costs one step; the thesis "
            f"measured {gap['gap_thesis']:.3f}x.")


def gap_said(model_here: float, lo: float, hi: float) -> str:
    """Whether the loop does what its measured costs allow: the cost model's prediction inside the measured
    interval (it does), above it (time the model leaves out, outside the draft steps and the verify forward, costs
    the loop), or below it (the loop does better than its costs predict)."""
    return uncertainty.reads(  # the interval against the prediction: above it, the prediction lies below it
        lo, hi, "below the measured interval: the loop does better than its measured costs predict",
        "above the measured interval: besides these costs, time the model leaves out (outside the draft steps and the "
        "verify forward) costs the loop",
        "inside the measured interval: the loop does what its costs allow, and the gap to the thesis is these costs",
        at=model_here)


def glued(run, df: pd.DataFrame) -> dict:
    """The values the book glues beside the findings ``df`` of ``run``: the counts and their sentence
    (:func:`counted`), the cost model's account of the gap (:func:`model_gap`) and the build's :func:`facts`."""
    return {**counted(df), **model_gap(run), **facts(run)}
