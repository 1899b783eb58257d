"""The local executor: a sweep's runs one after another on this machine, in this process (sharing a loaded model
pair where they agree on it) or, with ``isolate=True``, each as ``thesis-lib sweep job`` with its log in ``logs/``.
A failed run is recorded and the next goes on; Ctrl-C records the run as cancelled and stops the sweep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

from ..bench import protocol
from ..errors import ConfigError
from ..models import loading
from . import ledger
from .grid import job_command, working_folder


class LocalExecutor:
    """Runs each submitted run at once, in order; its jobs have ended when :meth:`submit` returns."""

    name = "local"

    def __init__(self, isolate: bool = False, progress: bool = True):
        self.isolate, self.progress = isolate, progress
        self._pairs: dict = {}

    def check(self) -> None:
        """Nothing to check: this machine is the executor."""

    def _job_id(self, sweep) -> str:
        """``local-<pid>-<n>``: the process that runs it, and the ledger's line number."""
        return f"local-{os.getpid()}-{len(ledger.entries(sweep.home)) + 1}"

    def _loaded(self, cfg):
        key = (cfg.target, cfg.draft, cfg.device, cfg.draft_device, cfg.dtype, cfg.draft_dtype, cfg.pack)
        if key not in self._pairs:
            self._pairs.clear()  # one pair in memory at a time
            self._pairs[key] = loading.load_pair(cfg.target, cfg.draft, device=cfg.device,
                                                 draft_device=cfg.draft_device, dtype=cfg.dtype, pack=cfg.pack,
                                                 draft_dtype=cfg.draft_dtype,
                                                 progress=self.progress)
        return self._pairs[key]

    def submit(self, sweep, runs: list[str]) -> dict[str, str]:
        out = {}
        for run in runs:
            job_id = self._job_id(sweep)
            log = ledger.log_path(sweep.home, run, job_id) if self.isolate else None
            ledger.submitted(sweep.home, run, self.name, job_id, log)
            out[run] = job_id
            try:
                state, detail = self._run_subprocess(sweep, run, log) if self.isolate else self._run_here(sweep, run)
            except KeyboardInterrupt:
                ledger.ended(sweep.home, run, job_id, ledger.CANCELLED, "interrupted (Ctrl-C)")
                raise
            ledger.ended(sweep.home, run, job_id, state, detail)
        return out

    def _run_here(self, sweep, run: str) -> tuple[str, str]:
        cfg = sweep.config(run)
        try:
            if sweep.is_done(run):
                return ledger.DONE, ""
            with working_folder(sweep):
                protocol.run(cfg, resume=cfg.path.exists(), progress=self.progress, loaded=self._loaded(cfg))
            return ledger.DONE, ""
        except Exception as exc:  # noqa: BLE001 - recorded, reported with the sweep, and the next run goes on
            traceback.print_exc()
            return ledger.FAILED, f"{type(exc).__name__}: {exc}"

    def _run_subprocess(self, sweep, run: str, log) -> tuple[str, str]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as f:
            code = subprocess.call(job_command(sweep.home, run, sys.executable), stdout=f, stderr=subprocess.STDOUT)
        return (ledger.DONE, "") if code == 0 else (ledger.FAILED, f"exit status {code}")

    def cancel(self, job_id: str) -> None:
        raise ConfigError("A local sweep runs in its own shell: stop it there with Ctrl-C (its run is recorded as "
                          "cancelled, and finished runs are kept).")

    def query(self, job_ids: list[str]) -> dict[str, tuple[str, str]]:
        """A local job with no recorded end is running while its process (another shell's sweep) lives, else failed."""
        out = {}
        for job_id in job_ids:
            pid = job_id.split("-")[1] if job_id.count("-") == 2 else ""
            alive = pid.isdigit() and int(pid) != os.getpid() and Path(f"/proc/{pid}").exists()
            out[job_id] = (ledger.RUNNING, "") if alive else (ledger.FAILED, "interrupted: its process ended first")
        return out

