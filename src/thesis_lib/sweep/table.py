"""A finished sweep as one table (:func:`summary`), and two sweeps of one grid (e.g. Slurm and local) compared by
what their runs generated, which does not depend on where or how fast they ran (:func:`compare`).
"""

from __future__ import annotations

import pandas as pd

from ..bench.runs import load_run
from . import ledger
from .grid import Sweep, open_sweep

#: A sample's fields that say what was generated (not when, where or how fast).
CONTENT = ("iteration", "question_id", "mode", "k", "tokens", "new_tokens", "first_emit", "stopped_by", "drafted",
           "accepted", "rounds", "emitted", "verify_calls", "append_calls", "matches_baseline", "accepted_per_round")


def summary(sweep: Sweep | str, executor=None) -> pd.DataFrame:
    """Per run and mode: grid values, decode tok/s, speedup, acceptance, tokens per round, lossless count and the
    jobs; runs not done get one row with their state (``unknown`` without ``executor``)."""
    sweep = open_sweep(sweep) if not isinstance(sweep, Sweep) else sweep
    rows = []
    for state in ledger.states(sweep, executor):
        point = sweep.points.get(state.run, {})
        if state.state != ledger.DONE:
            rows.append({"run": state.run, **point, "mode": None, "state": state.state})
            continue
        run = load_run(sweep.path(state.run))
        envs = [run.environment, *run.environment.get("resumed", [])]  # a resumed run: every job that worked on it
        job = ",".join(str(e["scheduler"]["job_id"]) for e in envs if e.get("scheduler")) or state.job_id
        for mode, s in (run.summary or {}).items():
            rows.append({"run": state.run, **point, "mode": mode,
                         "decode tok/s": s["decode_tokens_per_s"], "speedup": s["speedup_vs_baseline"],
                         "acceptance": s["acceptance"], "tokens/round": s["mean_emitted"],
                         "lossless": None if s["matches_baseline"] is None else f"{s['matches_baseline']}/{s['samples']}",
                         "state": state.state, "job": job})
    return pd.DataFrame(rows)


def content(run) -> list[dict]:
    """A run's samples reduced to what they generated, in a fixed order."""
    rows = [{k: r.get(k) for k in CONTENT} for r in run.samples]
    return sorted(rows, key=lambda r: (r["iteration"] or 0, str(r["question_id"]), r["mode"]))


def compare(a: Sweep | str, b: Sweep | str) -> dict[str, list[str]]:
    """Per run name of ``a``: what differs from ``b``'s run of that name ([] where they generated the same)."""
    a = open_sweep(a) if not isinstance(a, Sweep) else a
    b = open_sweep(b) if not isinstance(b, Sweep) else b
    out = {}
    for name in a.names:
        if name not in b.names:
            out[name] = [f"{b.name} has no run {name}"]
            continue
        ra, rb = load_run(a.path(name)), load_run(b.path(name))
        ca, cb = content(ra), content(rb)
        diffs = [] if len(ca) == len(cb) else [f"{len(ca)} samples against {len(cb)}"]
        for x, y in zip(ca, cb):
            fields = [k for k in CONTENT if x[k] != y[k]]
            if fields:
                diffs.append(f"{x['question_id']} {x['mode']}: {', '.join(fields)} differ")
        out[name] = diffs
    return out
