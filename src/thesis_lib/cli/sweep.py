"""``thesis-lib sweep run|status|table|cancel|job``: a grid of benchmark runs, in order here or one Slurm job each
(:mod:`thesis_lib.sweep`); resumable, failures reported with their logs and resubmitted."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import options

SWEEP_KEYS = ("name", "params", "set", "grid", "out")


def _yaml_value(text: str):
    import yaml

    return yaml.safe_load(text)


def sweep_from_args(args):
    """The sweep a ``thesis-lib sweep run`` command line (and its ``--file``) describes."""
    import yaml

    from ..book.params import Params
    from ..book.sizing import values_of
    from ..sweep import grid

    spec = {}
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise ConfigError(f"No sweep file {args.file}.")
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        unknown = sorted(set(spec) - set(SWEEP_KEYS))
        if unknown:
            raise ConfigError(f"{path.name}: unknown key(s) {', '.join(unknown)}; a sweep file has name, params, "
                              "set, grid and out.")
    name = args.name or spec.get("name")
    if not name:
        raise ConfigError("Name the sweep (--name, or name: in the sweep file): its runs go to a folder of that name.")
    base = {}
    params = args.params or spec.get("params")
    if params:
        base = Params.from_namespace(values_of(params)).check().bench().to_dict()
        del base["name"], base["out"]
    base.update(spec.get("set") or {})
    base.update({k: _yaml_value(v) for k, v in options.assignments(args.set, "--set")})
    values = dict(spec.get("grid") or {})
    for key, text in options.assignments(args.grid, "--grid"):
        parsed = _yaml_value(text) if text.startswith("[") else [_yaml_value(v) for v in text.split(",") if v.strip()]
        values[key] = parsed
    return grid.from_grid(name, base, values, args.out or spec.get("out") or "runs/sweeps")


def _summary(sweep):
    from ..sweep import driver, table

    return table.summary(sweep, driver.executor_of(sweep))


def _print_sweep_end(sweep, states) -> int:
    from ..analysis import formatting
    from ..sweep import driver, ledger

    bad = [s for s in states if s.state != ledger.DONE]
    df = _summary(sweep)
    print(formatting.to_markdown(df) if len(df) else "(no finished runs)")
    print(f"sweep folder: {sweep.home}")
    if bad:
        print(driver.report(states) or "\n".join(s.describe() for s in bad))
        print("Not finished: run the same command again to resubmit them (finished runs are kept).")
        return 1
    return 0


def cmd_sweep_run(args) -> int:
    from ..sweep import driver

    if args.retries < 0 or args.poll <= 0:
        raise ConfigError("--retries must be >= 0 and --poll > 0.")
    sweep = sweep_from_args(args)
    states = driver.run_sweep(sweep, options.make_executor(args), wait=not args.no_wait, retries=args.retries,
                              poll=args.poll)
    if args.no_wait:
        print(f"submitted; watch with: thesis-lib sweep status {sweep.home}")
        return 0
    return _print_sweep_end(sweep, states)


def cmd_sweep_status(args) -> int:
    from ..sweep import driver, grid, ledger

    sweep = grid.open_sweep(args.home)
    executor = driver.executor_of(sweep)
    states = driver.watch(sweep, executor, poll=args.poll) if args.wait else ledger.states(sweep, executor)
    for s in states:
        print(s.describe())
    print(", ".join(f"{k} {v}" for k, v in ledger.counts(states).items() if v))
    tail = driver.report(states)
    if tail:
        print(tail)
    return 0


def cmd_sweep_table(args) -> int:
    from ..analysis import formatting
    from ..sweep import grid

    df = _summary(grid.open_sweep(args.home))
    print(df.to_csv(index=False) if args.format == "csv" else formatting.to_markdown(df) if args.format == "markdown"
          else df.to_string(index=False))
    return 0


def cmd_sweep_cancel(args) -> int:
    from ..sweep import driver, grid, ledger

    sweep = grid.open_sweep(args.home)
    executor = driver.executor_of(sweep)
    active = [s for s in ledger.states(sweep, executor) if s.state in ledger.ACTIVE]
    for s in active:
        executor.cancel(s.job_id)
        print(f"cancelled job {s.job_id} ({s.run})")
    if not active:
        print("no job of this sweep is queued or running")
    return 0


def cmd_sweep_job(args) -> int:
    from ..sweep import grid

    run = grid.run_job(args.home, args.run)
    print(f"run folder {run.path}: {len(run.samples)} samples")
    return 0


def add_parsers(sub) -> None:
    sweep = sub.add_parser("sweep", help="parameter sweeps: a grid of benchmark runs, locally or on Slurm")
    ssub = sweep.add_subparsers(dest="sweep_command", required=True)
    p = ssub.add_parser("run", help="run (or resume) a sweep: one benchmark run per grid point",
                        description="A grid over benchmark parameters, one run folder per point, run in order here "
                        "or as one Slurm job each. Running the same sweep again resumes it: finished runs are kept.")
    p.add_argument("--file", default=None, help=f"a YAML sweep file (keys: {', '.join(SWEEP_KEYS)})")
    p.add_argument("--name", default=None, help="the sweep's name: its folder under --out")
    p.add_argument("--params", default=None, help="base: this parameter set's main-run configuration (e.g. smoke)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark parameter of every run (YAML value), e.g. --set per_category=1")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a parameter and its values, e.g. --grid k=2,4,6 --grid probes=8,64 (or a YAML list)")
    p.add_argument("--out", default=None, help="where sweeps live (default: runs/sweeps)")
    options.executor(p)
    p.add_argument("--retries", type=int, default=0, help="resubmit a failed or cancelled run this often (default 0)")
    p.add_argument("--no-wait", action="store_true", help="submit and return (watch with: thesis-lib sweep status)")
    p.set_defaults(func=cmd_sweep_run)
    for name, helptext, func in (("status", "each run's state, job and (for failures) log", cmd_sweep_status),
                                 ("table", "a sweep's runs as one table (a row per run and mode)", cmd_sweep_table),
                                 ("cancel", "cancel a sweep's queued and running jobs (finished runs are kept)",
                                  cmd_sweep_cancel),
                                 ("job", "one run of a sweep (what each job executes)", cmd_sweep_job)):
        p = ssub.add_parser(name, help=helptext)
        p.add_argument("home", help="the sweep's folder")
        if name == "status":
            p.add_argument("--wait", action="store_true", help="wait until no run is queued or running")
            p.add_argument("--poll", type=float, default=10.0, help="seconds between looks at the queue (default 10)")
        elif name == "table":
            p.add_argument("--format", default="text", choices=["text", "markdown", "csv"], help="(default: text)")
        elif name == "job":
            p.add_argument("run", help="the run's name")
        p.set_defaults(func=func)
