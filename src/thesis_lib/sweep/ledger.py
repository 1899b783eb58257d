"""Which job ran which run of a sweep (the append-only ``ledger.jsonl``: ``submitted`` lines, and ``ended`` lines as
soon as an end is seen, since a scheduler forgets finished jobs), and each run's state (:func:`states`): **done**
when its folder holds its configuration's summary, whatever the ledger says; else its latest job's **queued**,
**running**, **failed**, **cancelled**, **timeout** or **unknown**; **todo** without a job.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..bench.runs import append_json_line

LEDGER, LOGS = "ledger.jsonl", "logs"
DONE, QUEUED, RUNNING, FAILED, CANCELLED, TIMEOUT, TODO = ("done", "queued", "running", "failed", "cancelled",
                                                          "timeout", "todo")
#: A job whose state could not be learnt now: waited for, never resubmitted nor written down as ended.
UNKNOWN = "unknown"
ACTIVE = (QUEUED, RUNNING, UNKNOWN)
ENDED_BADLY = (FAILED, CANCELLED, TIMEOUT)


@dataclass
class RunState:
    """One run of a sweep: its state, its latest job and that job's log."""

    run: str
    state: str
    job_id: str | None = None
    log: Path | None = None
    detail: str = ""

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the job's log ("" where there is none)."""
        if self.log is None or not self.log.is_file():
            return ""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def describe(self) -> str:
        job = f" (job {self.job_id})" if self.job_id else ""
        detail = f": {self.detail}" if self.detail else ""
        log = f"; log {self.log}" if self.log and self.state in ENDED_BADLY else ""
        return f"{self.run}: {self.state}{job}{detail}{log}"


def log_path(home: Path, run: str, job_id: str) -> Path:
    return home / LOGS / f"{run}-{job_id}.log"


def submitted(home: Path, run: str, executor: str, job_id: str, log: Path | None) -> None:
    append_json_line(home / LEDGER, {"event": "submitted", "run": run, "executor": executor, "job_id": str(job_id),
                   "log": None if log is None else str(log.relative_to(home)),
                   "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def ended(home: Path, run: str, job_id: str, state: str, detail: str = "") -> None:
    append_json_line(home / LEDGER, {"event": "ended", "run": run, "job_id": str(job_id), "state": state, "detail": detail,
                   "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def entries(home: Path) -> list[dict]:
    """The ledger's lines; a torn one (a crash while writing) is skipped, so one bad line cannot lock a sweep."""
    file = home / LEDGER
    if not file.is_file():
        return []
    out = []
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "event" in doc and "run" in doc:
            out.append(doc)
    return out


def jobs(home: Path) -> dict[str, dict]:
    """Each run's latest job: its ``submitted`` line, with ``state``/``detail`` added where it has ended."""
    latest: dict[str, dict] = {}
    for e in entries(home):
        if e["event"] == "submitted":
            latest[e["run"]] = dict(e)
        elif e["event"] == "ended" and e["run"] in latest and latest[e["run"]]["job_id"] == e["job_id"]:
            latest[e["run"]].update(state=e["state"], detail=e.get("detail", ""))
    return latest


def states(sweep, executor=None) -> list[RunState]:
    """Every run's state in the sweep's order; jobs the ledger has no end for are asked of
    ``executor.query(job_ids) -> {job_id: (state, detail)}`` and their ends written down (``unknown`` without one)."""
    home = sweep.home
    latest = jobs(home)
    open_ids = [j["job_id"] for j in latest.values() if "state" not in j]
    if executor is None:
        seen = {j: (UNKNOWN, "not asked") for j in open_ids}
    else:
        seen = executor.query(open_ids) if open_ids else {}
    out = []
    for run in sweep.names:
        job = latest.get(run)
        log = home / job["log"] if job and job.get("log") else None
        if sweep.is_done(run):  # after the scheduler's view: a job that ended just now has written its summary
            out.append(RunState(run, DONE, job and job["job_id"], log))
            continue
        if job is None:
            out.append(RunState(run, TODO))
            continue
        state, detail = job.get("state"), job.get("detail", "")
        learnt = state is None
        if learnt:
            state, detail = seen.get(job["job_id"], (FAILED, "the scheduler no longer knows this job"))
        if state == DONE:  # the job ended well but left no summary of this configuration
            state, detail = FAILED, detail or "the job ended without writing the run's summary"
        if learnt and state not in ACTIVE:
            ended(home, run, job["job_id"], state, detail)
        out.append(RunState(run, state, job["job_id"], log, detail))
    return out


def counts(run_states: list[RunState]) -> dict[str, int]:
    out = {s: 0 for s in (QUEUED, RUNNING, UNKNOWN, DONE, FAILED, CANCELLED, TIMEOUT, TODO)}
    for r in run_states:
        out[r.state] += 1
    return out
