"""The book's heavy runs through a scheduler (``make book EXECUTOR=slurm``): the runs that follow from the parameter
set alone, run as one sweep (:mod:`thesis_lib.sweep`) in the book's own run folders, so the notebooks only read them.
Runs that need a notebook's result (model bench, chapter 6's calibration and what it picks) stay in the notebooks.
"""

from __future__ import annotations

from .. import extensions
from ..errors import ConfigError
from ..sweep import driver, grid, ledger
from . import shared
from .params import ROOT, Params
from .sizing import values_of


def planned_runs(p: Params) -> list:
    """The configurations of the runs that depend on no other result, in the order the chapters need them: the
    thesis' chapters', then the studies' (:data:`thesis_lib.extensions.BOOK_RUNS`)."""
    configs = [shared.main_config(p), shared.profile_config(p), shared.pipelined_config(p), shared.grid_config(p),
               *(run(p) for run in extensions.BOOK_RUNS)]
    return list({c.name: c for c in configs}.values())


def book_sweep(set_name: str, overrides: dict | None = None) -> grid.Sweep:
    """The sweep of a set's planned runs (``overrides`` as for the notebooks), kept in
    ``RUNS_DIR/sweeps/book-<set>-<hash of the run names>``."""
    values = values_of(set_name, overrides, measure=True)  # the plan the notebooks then reuse
    p = Params.from_namespace(values).check()
    if p.rehearsal:
        raise ConfigError("The rehearsal set stands in for GPUs on this machine; build it without EXECUTOR=slurm.")
    configs = planned_runs(p)
    name = f"book-{p.set_name}-{shared.digest(sorted(c.name for c in configs))}"
    return grid.of_runs(name, configs, ROOT / p.runs_dir / "sweeps" / name, workdir=ROOT)


def run_on(set_name: str, executor, *, poll: float = 10.0, retries: int = 0, progress: bool = True,
           overrides: dict | None = None) -> list[ledger.RunState]:
    """Run the planned runs with ``executor``, wait, and return their states (folders relative to the repository,
    where each job starts, as in the notebooks)."""
    return driver.run_sweep(book_sweep(set_name, overrides), executor, retries=retries, poll=poll, progress=progress)
