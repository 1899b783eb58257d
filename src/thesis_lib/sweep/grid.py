"""A sweep: benchmark runs and the folder it lives in. :func:`from_grid` expands a base configuration and a grid
(``{"k": [2, 4]}``) into a run per point (``k2``); :func:`of_runs` takes given configurations. Its home holds
``sweep.json``, ``jobs/<run>.json`` (what :func:`run_job` executes), the :mod:`~thesis_lib.sweep.ledger` and, for a
grid, the run folders; the same command resumes a sweep, a new grid needs a new name.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..bench import protocol
from ..bench.runs import CONFIG, SUMMARY, load_run
from ..models.cache import write_json
from ..errors import ConfigError

SWEEP, JOBS = "sweep.json", "jobs"
#: Parameters a grid cannot vary: where a run goes is the sweep's to say.
FIXED = ("name", "out")


@dataclass
class Sweep:
    """Runs to execute as one unit, with their grid points (empty for runs that are no grid)."""

    name: str
    home: Path
    configs: list[protocol.BenchConfig]
    points: dict[str, dict] = field(default_factory=dict)
    base: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    #: the folder the runs' relative paths start from (the book's runs: the repository); None: they are absolute
    workdir: str | None = None

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.configs]

    def config(self, run: str) -> protocol.BenchConfig:
        for c in self.configs:
            if c.name == run:
                return c
        raise ConfigError(f"The sweep {self.name} has no run {run!r}; its runs: {', '.join(self.names)}.")

    def check(self) -> None:
        """Every run's cheap checks (models known, K and probes in range, prompts selected); no weights load."""
        for c in self.configs:
            try:
                c.check()
            except ConfigError as exc:
                raise ConfigError(f"Run {c.name} of the sweep {self.name}: {exc}") from None

    def path(self, run: str) -> Path:
        """A run's folder, wherever this process runs."""
        return Path(self.workdir or ".") / self.config(run).path

    def is_done(self, run: str) -> bool:
        """The run folder holds a summary of this very configuration."""
        cfg, path = self.config(run), self.path(run)
        if not (path / SUMMARY).is_file():
            return False
        stored = protocol.BenchConfig.from_dict(json.loads((path / CONFIG).read_text(encoding="utf-8"))).to_dict()
        return stored == json.loads(json.dumps(cfg.to_dict()))

    def document(self) -> dict:
        doc = {"name": self.name, "base": self.base, "grid": self.grid,
               "runs": [{"name": c.name, "point": self.points.get(c.name, {})} for c in self.configs]}
        if self.workdir:
            doc["workdir"] = self.workdir
        return doc

    def save(self) -> str:
        """Write ``sweep.json`` and the job files: ``"new"``, or ``"resumed"`` if saved before; another sweep's
        home is refused."""
        doc, file = self.document(), self.home / SWEEP
        if file.is_file():
            stored = json.loads(file.read_text(encoding="utf-8"))
            jobs = {c.name: _read_job(self.home, c.name) for c in self.configs}
            same = stored == json.loads(json.dumps(doc)) and all(
                jobs[c.name] == json.loads(json.dumps(c.to_dict())) for c in self.configs)
            if not same:
                raise ConfigError(f"{self.home} holds another sweep (other runs or parameters); nothing was changed. "
                                  "Choose another name, or run the same grid to resume it.")
            return "resumed"
        (self.home / JOBS).mkdir(parents=True, exist_ok=True)
        for c in self.configs:
            write_json(self.home / JOBS / f"{c.name}.json", c.to_dict())
        write_json(file, doc)
        return "new"


def _read_job(home: Path, run: str) -> dict | None:
    file = home / JOBS / f"{run}.json"
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None


def _label(value) -> str:
    if isinstance(value, (list, tuple)):
        return "+".join(_label(v) for v in value)
    text = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.+]+", "_", text).strip("_") or "x"


def run_name(point: dict) -> str:
    """A grid point's run folder name: ``k4-probes8``; a model spec ``tiny:target`` reads ``target-tiny_target``."""
    return "-".join(f"{key}{_label(v)}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                    else f"{key}-{_label(v)}" for key, v in point.items())


def check_name(name: str) -> None:
    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
        raise ConfigError(f"A sweep's name is a plain folder name of letters, digits and . _ + - (got {name!r}).")


def from_grid(name: str, base: dict, grid: dict, out: str | Path = "runs/sweeps") -> Sweep:
    """The sweep ``out/name`` of every point of ``grid`` over ``base``, in the grid's order; run folders are
    absolute, so it can be resumed from any folder."""
    check_name(name)
    known = {f.name for f in fields(protocol.BenchConfig)}
    for doc, what in ((base, "base"), (grid, "grid")):
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(f"Unknown benchmark parameter(s) in the {what}: {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known - set(FIXED)))}.")
        fixed = [k for k in FIXED if k in doc]
        if fixed:
            raise ConfigError(f"The {what} may not set {', '.join(fixed)}: the sweep names its runs and their folder.")
    if not grid:
        raise ConfigError("The grid is empty: give at least one parameter and its values (e.g. k=2,4).")
    bad = [k for k, v in grid.items() if not isinstance(v, (list, tuple)) or not v]
    if bad:
        raise ConfigError(f"Each grid parameter needs a non-empty list of values ({', '.join(bad)} has none).")
    home = Path(out).resolve() / name
    configs, points = [], {}
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values))
        run = run_name(point)
        if run in points:
            raise ConfigError(f"Two grid points share the run name {run}; give distinct values.")
        configs.append(protocol.BenchConfig(**{**base, **point, "name": run, "out": str(home)}))
        points[run] = point
    return Sweep(name, home, configs, points, dict(base), {k: list(v) for k, v in grid.items()})


def of_runs(name: str, configs: list[protocol.BenchConfig], home: str | Path, workdir: str | Path | None = None) -> Sweep:
    """A sweep of given configurations (each keeps its own name and folder, relative ones from ``workdir``), kept
    in ``home``."""
    check_name(name)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ConfigError("Two runs of the sweep share a name.")
    return Sweep(name, Path(home), list(configs), workdir=None if workdir is None else str(Path(workdir).resolve()))


def open_sweep(home: str | Path) -> Sweep:
    """A saved sweep read back from its home (to resume it, watch it, or tabulate it)."""
    home = Path(home)
    file = home / SWEEP
    if not file.is_file():
        raise ConfigError(f"{home} is not a sweep (no {SWEEP}).")
    doc = json.loads(file.read_text(encoding="utf-8"))
    configs = [protocol.BenchConfig.from_dict(_read_job(home, r["name"])) for r in doc["runs"]]
    points = {r["name"]: r["point"] for r in doc["runs"] if r["point"]}
    return Sweep(doc["name"], home, configs, points, doc.get("base", {}), doc.get("grid", {}), doc.get("workdir"))


@contextlib.contextmanager
def working_folder(sweep: Sweep):
    """In the folder the sweep's relative run paths start from (for Python 3.10, which has no ``contextlib.chdir``)."""
    before = os.getcwd()
    os.chdir(sweep.workdir or before)
    try:
        yield
    finally:
        os.chdir(before)


def job_command(home: str | Path, run: str, python: str) -> list[str]:
    """The command a job runs (``thesis-lib sweep job HOME RUN``): :func:`run_job` in a process of its own."""
    return [python, "-m", "thesis_lib.cli", "sweep", "job", str(home), run]


def run_job(home: str | Path, run: str, *, progress: bool = True):
    """One job: execute the run, resuming a half-done folder (finished samples kept); a finished run is not redone."""
    sweep = open_sweep(home)
    cfg = sweep.config(run)
    with working_folder(sweep):
        if sweep.is_done(run):
            return load_run(cfg.path)
        return protocol.run(cfg, resume=cfg.path.exists(), progress=progress)
