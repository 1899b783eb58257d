"""The book's heavy runs through a scheduler (``make book EXECUTOR=slurm``): planned from the parameters, run as
one sweep before the notebooks, which then find them done and only read them.

:func:`planned_runs` lists the run folders whose configuration follows from the parameter set alone: the main
run, the profiled run, the K sweep with the static explorer's grid (one run) and chapter 6's K sweep. The rest (the draft's
model bench, chapter 6's calibration and the runs whose settings it picks) depend on a result computed in a
notebook, so they stay in the notebooks, where the book is built. :func:`run_on` runs the planned ones as a
sweep (:mod:`thesis_lib.sweep`) kept in ``RUNS_DIR/sweeps/book-<set>-<hash of the run names>``; its run folders
are the book's own (``RUNS_DIR/<set>-<kind>-<hash>``), so a finished one is never redone, and the notebooks reuse
them exactly as if they had run them.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..sweep import driver, grid, ledger
from . import experiments, shared
from .execute import set_label
from .params import ROOT, Params, load_parameters


def planned_runs(p: Params) -> list:
    """The configurations of the book's runs that depend on no other result, in the order the chapters need them."""
    configs = [shared.main_config(p), shared.profile_config(p), shared.grid_config(p), experiments.k_sweep_config(p)]
    return list({c.name: c for c in configs}.values())


def book_sweep(set_name: str, overrides: dict | None = None) -> grid.Sweep:
    """The sweep of a parameter set's planned runs (``overrides``: parameters changed, as for the notebooks)."""
    values = {**load_parameters(set_name), **(overrides or {})}
    values.setdefault("SET_NAME", set_label(set_name))
    p = Params.from_namespace(values).check()
    if p.rehearsal:
        raise ConfigError("The rehearsal set stands in for GPUs on this machine; build it without EXECUTOR=slurm.")
    configs = planned_runs(p)
    name = f"book-{p.set_name}-{shared.digest(sorted(c.name for c in configs))}"
    return grid.of_runs(name, configs, ROOT / p.runs_dir / "sweeps" / name, workdir=ROOT)


def run_on(set_name: str, executor, *, poll: float = 10.0, retries: int = 0, progress: bool = True,
           overrides: dict | None = None) -> list[ledger.RunState]:
    """Run the book's planned runs with ``executor`` and wait for them; the runs' states. Their folders are
    relative to the repository, as in the notebooks (and each job starts there)."""
    return driver.run_sweep(book_sweep(set_name, overrides), executor, retries=retries, poll=poll, progress=progress)
