"""The headline: the thesis' five main ratios beside one build's (the README's results table, the book's first
screen). :data:`FINDINGS` names each ratio and the thesis table row it comes from; :func:`strip` computes them
from a build's main run and model-bench document; :func:`committed` finds those in a folder of run data (the
committed default build's by default); :func:`markdown` writes the table with where the numbers come from;
:func:`same_way` counts the findings that point the way the thesis' do (:func:`cannot_tell` those whose
interval holds 1), and :func:`why_differ` says, from the
measured costs, what sets this machine apart."""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd

from ..bench.runs import load_run
from ..errors import ConfigError
from . import reference, tables, theory, uncertainty

ROOT = Path(__file__).resolve().parents[3]
#: The committed default build's run data (``make book``'s runs on the embedded pair).
COMMITTED = ROOT / "data" / "reference" / "book-cpu-embedded"
#: (finding, thesis table, the table's row): each ratio is that row's ``Speedup``.
FINDINGS = (
    ("FlashHead head over the dense head", "4.2", "Dense LM head vs. FlashHead"),
    ("Whole draft step, FlashHead over dense", "4.4", "Dense model vs. Flash model"),
    ("FlashHead draft over dense draft, ordinary schedule", "4.6", "Dense draft vs. FlashHead draft"),
    ("FlashHead draft over dense draft, deferred verification", "4.10", "Dense deferred vs. FlashHead deferred"),
    ("FlashHead deferred over target-only decoding", "4.10", "Base only vs. FlashHead deferred"),
)

def committed(folder: str | Path | None = None) -> tuple:
    """The main run (``*-bench-*``) and the model-bench document (``*-model-bench-*.json``) of a build's run data
    (default: the committed default build's)."""
    import json

    folder = Path(folder or COMMITTED)
    runs = sorted(glob.glob(str(folder / "*-bench-*" / "summary.json")))
    docs = sorted(glob.glob(str(folder / "*-model-bench-*.json")))
    if not runs or not docs:
        raise ConfigError(f"{folder} holds no main run (*-bench-*) and model-bench document (*-model-bench-*.json).")
    return load_run(Path(runs[0]).parent), json.loads(Path(docs[0]).read_text(encoding="utf-8"))


def strip(run, model_bench: dict) -> pd.DataFrame:
    """One row per finding: the thesis' ratio, this build's with its 95 % interval (over the prompts for the runs,
    over the timed states and contexts for the head and the draft step), and whether it points the thesis' way
    (:func:`~thesis_lib.analysis.uncertainty.direction`)."""
    ours = {"4.2": tables.table_4_2(model_bench), "4.4": tables.table_4_4(model_bench),
            "4.6": tables.table_4_6(run), "4.10": tables.table_4_10(run)}
    rows = []
    for finding, table, row in FINDINGS:
        mine = ours[table].set_index("Comparison").loc[row]
        lo, hi, thesis = float(mine[tables.LOW]), float(mine[tables.HIGH]), reference.value(table, row, "Speedup")
        rows.append({"Finding": f"{finding} (Table {table})", "Thesis": thesis, "This build": float(mine["Speedup"]),
                     "95 % interval": (f"{uncertainty.bound_text(lo)}-{uncertainty.bound_text(hi)}x"
                                       if lo == lo else "not recorded"),
                     "Same direction": uncertainty.direction(thesis, float(mine["Speedup"]), lo, hi)})
    return pd.DataFrame(rows)


def facts(run) -> dict:
    """What a build's main run says about the build: the precision its target ran in (a weight-only format by its
    name, else the dtype), its prompts, new tokens."""
    target = run.environment.get("models", {}).get("target", {})
    return {"build_dtype": target.get("dtype_requested") or target.get("dtype", "?"),
            "build_prompts": len({r["question_id"] for r in run.samples}),
            "build_new_tokens": run.config["max_new_tokens"]}


def markdown(run, model_bench: dict) -> str:
    """The strip as a Markdown table, with a line saying which build, revision, date and machine it shows."""
    from ..bench.environment import measured_when

    df = strip(run, model_bench)
    lines = ["| Finding | Thesis | This build | 95 % interval | Same direction |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['Finding']} | {r['Thesis']:.3f}x | {r['This build']:.2f}x | {r['95 % interval']} | "
              f"{r['Same direction']} |" for _, r in df.iterrows()]
    env, f = run.environment, facts(run)
    models = env.get("models", {})
    lines.append("")
    lines.append(f"This build: the embedded pair ({models.get('target', {}).get('spec', '?').split(':')[-1]} target, "
                 f"{models.get('draft', {}).get('spec', '?').split(':')[-1]} draft) in {f['build_dtype']}, "
                 f"{run.config.get('k')} draft tokens per round, {f['build_prompts']} prompts x "
                 f"{f['build_new_tokens']} new tokens, on {env.get('cpu', 'a CPU')} ({env.get('torch_threads', '?')} "
                 f"threads), {measured_when(env, code_note=False)}. "
                 f"Thesis: {reference.setup()['label'].removeprefix('thesis: ')}. Intervals: a paired bootstrap "
                 f"over the prompts, or over the timed states for the head and the step "
                 f"({uncertainty.RESAMPLES:,} resamples, percentile); *cannot tell*: the interval holds 1.")
    return "\n".join(lines)


def same_way(df: pd.DataFrame) -> int:
    """How many findings point the same way here as in the thesis (the strip's *Same direction* is yes)."""
    return int(df["Same direction"].str.startswith("yes").sum())


def cannot_tell(df: pd.DataFrame) -> int:
    """How many findings' intervals hold 1: this build cannot tell their direction."""
    return int((df["Same direction"] == "cannot tell").sum())


def thesis_draft_cost() -> float:
    """The thesis' FlashHead draft step over its target step: Table 4.3's Flash model mean latency over the time per
    token of its target-only decoding (Table 4.9's Base only)."""
    return (reference.value("4.3", "Flash model", "Mean latency (ms)")
            / (1000 / reference.value("4.9", "Base only", "Decode Tok/s")))


def why_differ(c_here: float, c_thesis: float, verify_here: float, k: int) -> str:
    """What the measured costs say about a speculative round here: the draft step's cost in target steps beside the
    thesis', and whether a verified block of K + 1 tokens costs more than one target step."""
    draft = (f"a FlashHead draft step costs {c_here:.2f} of a target step here, against {c_thesis:.2f} in the thesis"
             if c_here > c_thesis else
             f"a FlashHead draft step costs {c_here:.2f} of a target step here, no more than the thesis' {c_thesis:.2f}")
    block = (f"verifying a block of {k + 1} tokens costs {verify_here:.2f} target steps"
             + (", so a verified block is not free" if verify_here > 1.05 else ", about one step: nearly free"))
    return f"{draft}, and {block}"


def glued(run, df: pd.DataFrame) -> dict:
    """The values the book glues beside the strip ``df`` of ``run``: how many findings point the thesis' way, of
    how many, what the measured costs say (:func:`why_differ`), and the build's :func:`facts`."""
    costs = theory.measured_costs(run)
    why = why_differ(costs.get("c_flash", costs["c_dense"]), thesis_draft_cost(), costs["verify_k1"], costs["k"])
    return {"headline_same_way": same_way(df), "headline_cannot_tell": cannot_tell(df), "headline_total": len(df),
            "headline_why": why, **facts(run)}
