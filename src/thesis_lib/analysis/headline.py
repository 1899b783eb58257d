"""The headline: the thesis' five main ratios beside one build's (the README's results table, the book's first
screen). :data:`FINDINGS` names each ratio and the thesis table row it comes from; :func:`strip` computes them
from a build's main run and model-bench document; :func:`committed` finds those in a folder of run data (the
committed default build's by default); :func:`markdown` writes the table with where the numbers come from."""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd

from ..bench.runs import load_run
from ..errors import ConfigError
from . import reference, tables

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
    """One row per finding: the thesis' ratio and this build's."""
    ours = {"4.2": tables.table_4_2(model_bench), "4.4": tables.table_4_4(model_bench),
            "4.6": tables.table_4_6(run), "4.10": tables.table_4_10(run)}
    rows = []
    for finding, table, row in FINDINGS:
        mine = ours[table].set_index("Comparison").loc[row, "Speedup"]
        rows.append({"Finding": f"{finding} (Table {table})", "Thesis": reference.value(table, row, "Speedup"),
                     "This build": float(mine)})
    return pd.DataFrame(rows)


def markdown(run, model_bench: dict) -> str:
    """The strip as a Markdown table, with a line saying which build, revision, date and machine it shows."""
    from ..bench.environment import measured_when

    df = strip(run, model_bench)
    lines = ["| Finding | Thesis | This build |", "| --- | ---: | ---: |"]
    lines += [f"| {r.Finding} | {r.Thesis:.3f}x | {r._3:.2f}x |" for r in df.itertuples()]
    env = run.environment
    models = env.get("models", {})
    target = models.get("target", {})
    when = measured_when(env).replace("; the library's code has changed since", "")
    lines.append("")
    lines.append(f"This build: the embedded pair ({target.get('spec', '?').split(':')[-1]} target, "
                 f"{models.get('draft', {}).get('spec', '?').split(':')[-1]} draft) in {target.get('dtype', '?')}, "
                 f"{run.config.get('k')} draft tokens per round, {len({r['question_id'] for r in run.samples})} prompts x "
                 f"{run.config.get('max_new_tokens')} new tokens, on {env.get('cpu', 'a CPU')} ({env.get('torch_threads', '?')} "
                 f"threads), {when}. Thesis: {reference.setup()['label'].removeprefix('thesis: ')}.")
    return "\n".join(lines)
