"""Running a sweep to its end (:func:`run_sweep`): submit what is not done, :func:`watch` with a progress bar and
each state change, :func:`report` what failed with its log's end, and resubmit it (``retries``).
"""

from __future__ import annotations

import contextlib
import time

from ..errors import ConfigError
from ..progress import note, tqdm
from . import ledger
from .grid import Sweep


def _label(c: dict) -> str:
    return (f"queued {c['queued']} · running {c['running']} · done {c['done']}"
            + "".join(f" · {s} {c[s]}" for s in (ledger.UNKNOWN, *ledger.ENDED_BADLY) if c[s]))


def executor_of(sweep):
    """The executor that ran a saved sweep's jobs (to ask it about them): Slurm's if any job went there."""
    from . import local, slurm

    kinds = {e.get("executor") for e in ledger.entries(sweep.home) if e["event"] == "submitted"}
    if "slurm" in kinds:
        slurm.check_commands()
        return slurm.SlurmExecutor(workdir=sweep.workdir)
    return local.LocalExecutor()


@contextlib.contextmanager
def locked(sweep: Sweep):
    """One submitter at a time per sweep (two ``sweep run`` commands at once would submit the same runs)."""
    import fcntl

    sweep.home.mkdir(parents=True, exist_ok=True)
    with open(sweep.home / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"Another command is submitting the sweep {sweep.name} now; nothing was changed. "
                              "Watch it with: thesis-lib sweep status " + str(sweep.home)) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def watch(sweep: Sweep, executor, *, poll: float = 10.0, progress: bool = True) -> list[ledger.RunState]:
    """Wait until none of the sweep's runs is queued or running; returns their states."""
    seen: dict[str, tuple] = {}
    with tqdm(total=len(sweep.names), desc=f"sweep {sweep.name}", unit="run", disable=not progress) as bar:
        while True:
            states = ledger.states(sweep, executor)
            changed = [s for s in states if seen.get(s.run) != (s.state, s.job_id)]
            if progress and changed:
                bar.clear()  # each change on a line of its own above the bar
                for s in changed:
                    if s.run in seen or s.state != ledger.TODO:
                        note(s.describe())
            seen.update({s.run: (s.state, s.job_id) for s in changed})
            c = ledger.counts(states)
            bar.n = c[ledger.DONE]
            bar.set_postfix_str(_label(c))
            bar.refresh()
            if not any(c[a] for a in ledger.ACTIVE):
                return states
            time.sleep(poll)


def report(states: list[ledger.RunState], log_lines: int = 15) -> str:
    """The failed, cancelled and timed-out runs, each with the end of its log."""
    parts = []
    for s in states:
        if s.state in ledger.ENDED_BADLY:
            tail = s.log_tail(log_lines)
            parts.append(s.describe() + ("\n    " + tail.replace("\n", "\n    ") if tail else ""))
    return "\n".join(parts)


def run_sweep(sweep: Sweep, executor, *, wait: bool = True, retries: int = 0, poll: float = 10.0,
              progress: bool = True) -> list[ledger.RunState]:
    """Save (or resume) the sweep, submit its runs neither done nor active and, with ``wait``, watch them to their
    end, resubmitting failures up to ``retries`` times (their jobs keep the samples written); the runs' states."""
    sweep.check()
    executor.check()
    with locked(sweep):
        action = sweep.save()
        states = ledger.states(sweep, executor)
        todo = [s.run for s in states if s.state not in (ledger.DONE, *ledger.ACTIVE)]
        c = ledger.counts(states)
        note(f"sweep {sweep.name} ({action}, {len(sweep.names)} runs in {sweep.home}): {c[ledger.DONE]} done, "
             f"{sum(c[a] for a in ledger.ACTIVE)} queued or running, {len(todo)} to submit via {executor.name}")
        executor.submit(sweep, todo)
    if not wait:
        return ledger.states(sweep, executor)
    for attempt in range(retries + 1):
        states = watch(sweep, executor, poll=poll, progress=progress)
        bad = [s.run for s in states if s.state in ledger.ENDED_BADLY]
        if not bad:
            break
        note("did not finish:\n" + report(states))
        if attempt < retries:
            note(f"resubmitting {', '.join(bad)} (retry {attempt + 1} of {retries}; finished samples are kept)")
            with locked(sweep):
                executor.submit(sweep, bad)
    return states
