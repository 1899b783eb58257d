"""The Slurm executor: one batch job per run, a readable script (``jobs/<run>.sbatch``, no pickled Python) running
``thesis-lib sweep job HOME RUN``. The node needs the project and its virtual environment at the same path; the
submitting shell's environment (``THESIS_LIB_CACHE``, ``HF_HOME``) reaches the job through ``sbatch``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from . import ledger
from .grid import job_command

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")
#: Slurm's job states in this project's words (``squeue``/``scontrol`` ``JobState``).
STATES = {**dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                           "SUSPENDED", "STOPPED"), ledger.QUEUED),
          **dict.fromkeys(("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"), ledger.RUNNING),
          "COMPLETED": ledger.DONE, "CANCELLED": ledger.CANCELLED, "TIMEOUT": ledger.TIMEOUT,
          "DEADLINE": ledger.TIMEOUT}
#: What a job's allocation is on a GPU node unless told: cores and memory for a 32B AWQ target and its draft.
GPU_CPUS, GPU_MEM = 8, "64G"


def gpus_of(cfg) -> int:
    """GPUs a run uses: its distinct CUDA devices (target and draft on ``cuda:0`` and ``cuda:1``: 2)."""
    devices = {cfg.device, cfg.draft_device or cfg.device}
    return len({d for d in devices if str(d).startswith("cuda")})


@dataclass
class Resources:
    """What each job asks Slurm for; None leaves the choice to the run's devices or the cluster's defaults."""

    partition: str | None = None
    #: GPUs per job (None: the run's CUDA devices, :func:`gpus_of`)
    gpus: int | None = None
    #: cores per job (None: 8 for a GPU job, else the run's ``threads`` or 2)
    cpus: int | None = None
    #: memory per job, Slurm's syntax (None: 64G for a GPU job, else the cluster's default)
    mem: str | None = None
    time: str = "04:00:00"
    account: str | None = None
    #: further ``sbatch`` options, as given (e.g. ``--constraint=h100``)
    extra: list[str] = field(default_factory=list)

    def __post_init__(self):
        for name, value in [*((n, getattr(self, n)) for n in ("partition", "mem", "time", "account")),
                            *(("sbatch-arg", v) for v in self.extra)]:
            if value is not None and not str(value).isprintable():
                raise ConfigError(f"--{name} holds a control character ({value!r}); it would become a line of the "
                                  "batch script.")

    def options(self, cfg) -> list[str]:
        gpus = gpus_of(cfg) if self.gpus is None else self.gpus
        cpus = self.cpus or (GPU_CPUS if gpus else (cfg.threads or 2))
        mem = self.mem or (GPU_MEM if gpus else None)
        opts = [f"--time={self.time}", f"--cpus-per-task={cpus}", "--ntasks=1", "--nodes=1"]
        opts += [f"--gres=gpu:{gpus}"] if gpus else []
        opts += [f"--mem={mem}"] if mem else []
        opts += [f"--partition={self.partition}"] if self.partition else []
        opts += [f"--account={self.account}"] if self.account else []
        return opts + list(self.extra)


def check_commands() -> None:
    """Slurm's client commands are on PATH (else a clear error before anything is written)."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise ConfigError(f"Slurm's {', '.join(missing)} not found: run this where Slurm's client commands are "
                          "installed (a cluster's login node), or use --executor local.")


def _call(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check)


class SlurmExecutor:
    """Submits each run as a batch job and reports Slurm's view of the jobs."""

    name = "slurm"

    def __init__(self, resources: Resources | None = None, python: str | None = None, workdir: Path | None = None):
        self.resources = resources or Resources()
        self.python = python or sys.executable
        self.workdir = Path(workdir or Path.cwd()).resolve()

    def check(self) -> None:
        check_commands()

    def script(self, sweep, run: str) -> str:
        """The batch script of one run (written to ``jobs/<run>.sbatch``)."""
        home = sweep.home.resolve()
        opts = [f"--job-name={sweep.name}:{run}", f"--output={home / ledger.LOGS / run}-%j.log",
                f"--chdir={self.workdir}", *self.resources.options(sweep.config(run))]
        job = job_command(home, run, self.python)
        return "\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in opts), "set -euo pipefail",
                          f'echo "thesis-lib: job $SLURM_JOB_ID on $(hostname): run {run} of sweep {sweep.name}"',
                          "exec " + shlex.join(job), ""])

    def submit(self, sweep, runs: list[str]) -> dict[str, str]:
        """Submit one job per run; ``{run: job id}`` (each written to the ledger as it is accepted)."""
        odd = [str(p) for p in (sweep.home.resolve(), self.workdir, Path(self.python)) if any(c.isspace() for c in str(p))]
        if odd:
            raise ConfigError(f"A batch script's #SBATCH lines cannot hold paths with spaces: {', '.join(odd)}; "
                              "move the sweep (--out) or the project to a path without them.")
        (sweep.home / ledger.LOGS).mkdir(parents=True, exist_ok=True)
        out = {}
        for run in runs:
            path = sweep.home / "jobs" / f"{run}.sbatch"
            path.write_text(self.script(sweep, run), encoding="utf-8")
            done = _call(["sbatch", "--parsable", str(path)], check=False)
            if done.returncode != 0:
                raise ConfigError(f"sbatch refused the job of {run}: {done.stderr.strip() or done.stdout.strip()}")
            job_id = done.stdout.strip().split(";")[0]
            ledger.submitted(sweep.home, run, self.name, job_id, ledger.log_path(sweep.home, run, job_id))
            out[run] = job_id
        return out

    def query(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """Slurm's view of these jobs, ``{job id: (state, detail)}``; jobs Slurm has forgotten are left out."""
        wanted, out = set(job_ids), {}
        listed = _call(["squeue", "--noheader", "--me", "--format=%i|%T|%r"], check=False)
        if listed.returncode != 0:  # the controller did not answer: nothing is known, nothing is concluded
            why = (listed.stderr.strip() or f"squeue exit status {listed.returncode}").splitlines()[-1]
            return {j: (ledger.UNKNOWN, f"Slurm did not answer ({why})") for j in job_ids}
        for line in listed.stdout.splitlines():
            job_id, state, reason = (line.split("|") + ["", ""])[:3]
            if job_id in wanted:
                ours = STATES.get(state, ledger.FAILED)
                reason = "" if reason in ("None", "") else reason
                detail = f"Slurm: {reason or 'no reason given'}" if ours in ledger.ACTIVE else f"Slurm: {state} {reason}"
                out[job_id] = (ours, "" if ours in ledger.ACTIVE and not reason else detail.strip())
        for job_id in wanted - set(out):
            shown = _call(["scontrol", "show", "job", "--oneliner", job_id], check=False)
            fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
            if shown.returncode == 0 and "JobState" in fields:
                state = fields["JobState"]
                detail = f"Slurm: {state}, exit code {fields.get('ExitCode', '?')}"
                if fields.get("Reason", "None") != "None":
                    detail += f", {fields['Reason']}"
                out[job_id] = (STATES.get(state, ledger.FAILED), detail)
            elif "invalid job id" not in shown.stderr.lower():  # not "gone": the question failed
                out[job_id] = (ledger.UNKNOWN, f"scontrol did not answer ({shown.stderr.strip() or shown.returncode})")
        return out

    def cancel(self, job_id: str) -> None:
        done = _call(["scancel", str(job_id)], check=False)
        if done.returncode != 0:
            raise ConfigError(f"scancel {job_id}: {done.stderr.strip() or done.returncode}")

