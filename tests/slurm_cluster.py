"""A one-node Slurm cluster on localhost (:class:`LocalCluster`: MUNGE, ``slurmctld`` and ``slurmd`` from Debian's
``slurm-wlm``, all files in one folder, no accounting, so finished jobs stay visible for ``MinJobAge``): the tests'
scheduler, and a way to try ``sweep run --executor slurm``. :func:`unavailable` says why it cannot start here.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from thesis_lib.errors import ThesisLibError

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
NODE, PARTITION = "localnode", "local"


def unavailable() -> str | None:
    """Why a local cluster cannot start on this machine, or None."""
    missing = [c for c in (*DAEMONS, *CLIENTS) if shutil.which(c) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): Debian's slurm-wlm and munge provide them "
                "(make test installs them when it runs as root)")
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts each job as its user)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return int(pages * size / 2**20 * 0.9)


class LocalCluster:
    """One slurmctld and one slurmd on 127.0.0.1 (use as a context manager, or :meth:`start` / :meth:`stop`)."""

    def __init__(self, folder: str | Path | None = None, cpus: int | None = None, min_job_age: int = 600):
        self.dir = Path(folder or tempfile.mkdtemp(prefix="thesis-slurm-"))
        self.cpus = cpus or os.cpu_count() or 1
        self.min_job_age = min_job_age
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def environment(self) -> dict[str, str]:
        """What a client (sbatch, squeue, ...) needs in its environment to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        d, user = self.dir, getpass.getuser()
        for sub in ("state", "spool", "munge", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        lines = [
            "ClusterName=thesislocal", f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", f"SlurmUser={user}",
            "AuthType=auth/munge", f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "ReturnToService=2", f"MinJobAge={self.min_job_age}", "KillWait=5", "InactiveLimit=0",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_memory_mb()} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                            **self.environment()}, start_new_session=True)

    def _wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ThesisLibError(f"{name} stopped while starting ({self.log_tail(name)})")
            if ready():
                return
            time.sleep(0.2)
        raise ThesisLibError(f"the local Slurm cluster: {what} not ready after {timeout:.0f} s ({self.log_tail()})")

    def log_tail(self, name: str | None = None, lines: int = 5) -> str:
        names = [name] if name else list(self.procs)
        out = []
        for n in names:
            for f in (self.dir / "log" / f"{n}.out", self.dir / "log" / f"{n}.log"):
                if f.is_file():
                    out += [f"{n}: {line}" for line in f.read_text(errors="replace").splitlines()[-lines:]]
        return " | ".join(out) or "no log"

    def sinfo(self) -> str:
        done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True,
                              env={**os.environ, **self.environment()})
        return done.stdout.strip() if done.returncode == 0 else ""

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        why = unavailable()
        if why:
            raise ThesisLibError(why)
        self._write_config()
        m = self.dir / "munge"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={m / 'munge.socket'}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._wait("MUNGE", (m / "munge.socket").exists, timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self.sinfo() != "", timeout)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", NODE])
        self._wait("the node", lambda: self.sinfo() in ("idle", "mixed", "allocated"), timeout)
        return self

    def stop(self) -> None:
        """Cancel every job left, then stop slurmd, slurmctld and MUNGE (in that order)."""
        env = {**os.environ, **self.environment()}
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", f"--partition={PARTITION}"], capture_output=True, env=env)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                left = subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, env=env)
                if left.returncode != 0 or not left.stdout.strip():
                    break
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
