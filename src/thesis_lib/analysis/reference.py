"""The thesis' own numbers (Tables 4.1 to 4.11) and its section list as transcribed into
``data/thesis_reference.json``.

:func:`sections` (number -> title), :func:`thesis_table` (one table as a DataFrame), :func:`values` (every number as a record), :func:`beside` (the
thesis' rows interleaved with ours), :func:`draft_cost` (the thesis' draft step over its
target step, defined once).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

from ..errors import ConfigError

#: The data file, inside the package's repository (``data/`` beside ``src/``) or installed with the package.
_CANDIDATES = (Path(__file__).resolve().parents[3] / "data" / "thesis_reference.json",
               Path(__file__).resolve().parents[1] / "data" / "thesis_reference.json")

TABLE_IDS = ("4.1", "4.2", "4.3", "4.4", "4.5", "4.6", "4.7", "4.8", "4.9", "4.10", "4.11")


@lru_cache(maxsize=1)
def document() -> dict:
    for path in _CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    raise ConfigError("The thesis' numbers (data/thesis_reference.json) are not found beside the package.")


def setup() -> dict:
    """The thesis' target, draft, hardware and prompts, as the thesis states them."""
    return dict(document()["setup"])


def sections() -> dict[str, str]:
    """The thesis' sections 2.1 to 5.3, number -> title, in the thesis' order."""
    return dict(document()["sections"])


def table_info(table: str) -> dict:
    tables = document()["tables"]
    if table not in tables:
        raise ConfigError(f"The thesis has no Table {table}; it has {', '.join(tables)}.")
    return tables[table]


def thesis_table(table: str) -> pd.DataFrame:
    """One of the thesis' tables, in the column layout of :mod:`thesis_lib.analysis.tables` (missing values are NaN)."""
    info = table_info(table)
    names = [info["index"]] + [c[0] for c in info["columns"]]
    for row in info["rows"]:
        if len(row) != len(names):
            raise ConfigError(f"Table {table} row {row[0]!r} has {len(row)} cells, its header {len(names)}.")
    return pd.DataFrame(info["rows"], columns=names)


def values() -> pd.DataFrame:
    """Every number of every table: one record per (table, row, column) with its unit."""
    out = []
    for table in TABLE_IDS:
        info = table_info(table)
        for row in info["rows"]:
            label, cells = row[0], row[1:]
            for (column, unit), value in zip(info["columns"], cells):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.append({"table": table, "row": label, "column": column,
                                "unit": row[-1] if unit == "as unit column" else unit, "value": value})
    return pd.DataFrame(out)


def value(table: str, row: str, column: str) -> float:
    """One thesis number; a clear error if the table has no such cell."""
    df = values()
    hit = df[(df.table == table) & (df.row == row) & (df.column == column)]
    if len(hit) != 1:
        raise ConfigError(f"Table {table} has {len(hit)} cells at row {row!r}, column {column!r}.")
    return float(hit.value.iloc[0])


#: The endings of the columns of a measured value's 95 % interval, which the thesis' tables do not have.
INTERVAL = ("95 % low", "95 % high")


def beside(ours: pd.DataFrame, table: str, *, ours_label: str = "this run", thesis_label: str = "thesis") -> pd.DataFrame:
    """The thesis' rows and ours (the thesis' columns, as :mod:`thesis_lib.analysis.tables` makes them, then
    ours alone may add interval columns, named to end as :data:`INTERVAL`) interleaved, thesis first, with a ``Source``
    column; :func:`sources` is its caption."""
    theirs = thesis_table(table)
    index = theirs.columns[0]
    extra = [c for c in ours.columns if str(c).endswith(INTERVAL)]
    if [c for c in ours.columns if c not in extra] != list(theirs.columns):
        raise ConfigError(f"Table {table}: our columns {list(ours.columns)} differ from the thesis' {list(theirs.columns)}.")
    keys = [index] + (["Quantity"] if "Quantity" in theirs.columns else [])
    rest = [c for c in theirs.columns if c not in keys] + extra
    rows = []
    for key in dict.fromkeys([*theirs[keys].itertuples(index=False), *ours[keys].itertuples(index=False)]):
        for label, df in ((thesis_label, theirs), (ours_label, ours)):
            hit = (df[keys] == pd.Series(tuple(key), index=keys)).all(axis=1)
            for _, r in df[hit].iterrows():
                rows.append({**{k: r[k] for k in keys}, "Source": label, **{c: r.get(c) for c in rest}})
    return pd.DataFrame(rows)


def sources(ours: str) -> str:
    """Caption for a :func:`beside` table; ``ours`` names this run's models and hardware
    (e.g. :func:`thesis_lib.book.provenance.source_label`)."""
    thesis = setup()["label"].removeprefix("thesis: ")
    m = re.fullmatch(r"this run \(([^,)]*)(?:, ([^)]*))?\): (.*)", ours)
    ours = f"{m[3]} (parameter set {m[1]}{', ' + m[2] if m[2] else ''})" if m else ours
    return f"thesis = {thesis}, as printed in the thesis; this run = {ours}"


def draft_cost(draft: str = "flash") -> float:
    """The thesis' draft step over its target step, the one definition every chapter uses: Table 4.3's mean step
    latency of its ``flash`` or ``dense`` 0.6B draft over the time per token of its target-only decoding in the
    deferred-verification experiment (Table 4.9's Base only, its largest sample: 560)."""
    row = {"flash": "Flash model", "dense": "Dense model"}
    if draft not in row:
        raise ConfigError(f"The thesis timed the steps of a 'flash' and a 'dense' draft, not {draft!r}.")
    return value("4.3", row[draft], "Mean latency (ms)") / (1000 / value("4.9", "Base only", "Decode Tok/s"))
