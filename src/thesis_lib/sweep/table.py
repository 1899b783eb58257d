"""A finished sweep as one table (:func:`summary`): per run and mode, its grid values, speed, acceptance and
whether it was lossless, and the jobs that ran it."""

from __future__ import annotations

import pandas as pd

from ..bench.runs import load_run
from . import ledger
from .grid import Sweep, open_sweep


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
