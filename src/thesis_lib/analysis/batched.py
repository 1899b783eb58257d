"""The heads at batch B (:mod:`thesis_lib.bench.batched`'s document) as a table with intervals, and where
FlashHead's advantage over the dense head is gone."""

from __future__ import annotations

import pandas as pd

from .uncertainty import timing_interval

#: what the heads' names in a batch document mean on the page
HEAD_NAMES = {"dense": "dense", "flashhead": "FlashHead", "flashhead_shared": "FlashHead, shared rows"}


def batch_rows(doc: dict | None) -> pd.DataFrame:
    """One row per batch size: B, each head's median ms per call, each other head's speed over the base head (the
    ratio of mean times) with its 95 % bootstrap interval over the groups of states (``lo``/``hi`` kept as numbers
    for :func:`advantage_gone`), and the union of the probed clusters over one row's probes. A one-cell table
    where there is no document."""
    if not doc:
        return pd.DataFrame({"batch document": ["none (model-bench --parts batch)"]})
    base = doc["base"]
    rows = []
    for b, part in doc["by_batch"].items():
        row = {"B": int(b)}
        others = [k for k in part["times_ms"] if k != base]
        for k in [base, *others]:
            row[f"{HEAD_NAMES.get(k, k)} ms"] = part["stats"][k]["p50_ms"]
        for k in others:
            ci = timing_interval(part["times_ms"][base], part["times_ms"][k], part["groups"])
            name = HEAD_NAMES.get(k, k)
            row[f"{name} speedup"] = f"{ci['value']:.2f} [{ci['lo']:.2f}, {ci['hi']:.2f}]"
            row[f"{name} value"], row[f"{name} lo"], row[f"{name} hi"] = ci["value"], ci["lo"], ci["hi"]
        row["clusters / one row's"] = part["union"]["over_one_row"]
        rows.append(row)
    return pd.DataFrame(rows)


def shown(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`batch_rows` without the numeric interval columns (the page's table)."""
    return rows[[c for c in rows if not c.endswith((" value", " lo", " hi"))]]


def advantage_gone(rows: pd.DataFrame, head: str = "FlashHead") -> str:
    """Where ``head`` (a name of :data:`HEAD_NAMES`' values) first stops being faster than the dense head: the
    smallest batch whose interval lies below 1, else the smallest whose interval holds 1 ("cannot tell" there),
    else faster at every batch measured."""
    if "B" not in rows or f"{head} lo" not in rows:
        return "not measured"
    rows = rows.sort_values("B")
    below = rows[rows[f"{head} hi"] < 1]
    if len(below):
        return (f"{head} is first slower than the dense head at {_states(int(below['B'].iloc[0]))} per call "
                f"({below[f'{head} value'].iloc[0]:.2f}x)")
    unclear = rows[rows[f"{head} lo"] <= 1]
    if len(unclear):
        return (f"at {_states(int(unclear['B'].iloc[0]))} per call the data first cannot tell whether {head} is "
                f"faster than the dense head")
    return f"{head} stays faster at every batch measured, up to {_states(int(rows['B'].max()))} per call"


def _states(n: int) -> str:
    return "one state" if n == 1 else f"{n} states"
