"""Commands around the book: ``book`` (the chapter notebooks through papermill, then the Jupyter Book) and
``explore`` (the live explorer on localhost)."""

from __future__ import annotations

import json
import sys
import time

from ..errors import ConfigError
from . import options


def cmd_book(args) -> int:
    from ..book import browser, build, execute, params, sizing

    t0, started = time.perf_counter(), time.time()
    if args.budget is not None and args.budget <= 0:
        raise ConfigError(f"--budget must be > 0 minutes (got {args.budget:g}).")
    if args.retries < 0 or args.poll <= 0:
        raise ConfigError("--retries must be >= 0 and --poll > 0.")
    overrides = {"BUDGET_MINUTES": args.budget} if args.budget is not None else {}
    sizing.check_set({**params.load_parameters(args.params), **overrides})  # before the planner times anything
    # sizes left to the planner are chosen once, here: the scheduled runs and the notebooks then share them
    values = sizing.values_of(args.params, overrides, measure=True, replan=args.recompute)
    planned = bool(sizing.sized_keys(params.load_parameters(args.params)))
    overrides.update({k: values[k] for k in sizing.SIZED} if planned else {})
    if args.executor == "slurm":
        from ..book import scheduled
        from ..sweep import driver, ledger

        states = scheduled.run_on(args.params, options.make_executor(args, workdir=params.ROOT), poll=args.poll,
                                  retries=args.retries, overrides=overrides)
        if any(s.state != ledger.DONE for s in states):
            print(driver.report(states))
            print("The book's runs did not all finish; run the same command again to resubmit them (finished runs "
                  "are kept). No notebook was run.", file=sys.stderr)
            return 1
    fates = execute.execute(args.params, recompute=args.recompute, progress=True, overrides=overrides)
    report = execute.execution_report(args.params)
    t1 = time.perf_counter()
    html = build.build(args.params, recompute=False, progress=True, overrides=overrides)
    t2 = time.perf_counter()
    print(f"\n{'notebook':<16}{'':>10}{'seconds':>9}{'peak memory':>13}")
    for r in report:
        peak = f"{r['peak_rss_gib']:.1f} GiB" if r["peak_rss_gib"] is not None else "-"
        print(f"{r['notebook']:<16}{r['fate']:>10}{r['seconds']:>9.0f}{peak:>13}")
    print(f"notebooks: {', '.join(f'{k} {v}' for k, v in fates.items())} ({t1 - t0:.0f} s); "
          f"book built in {t2 - t1:.0f} s")
    if args.check:
        report = browser.check(html, html.parent.parent.parent / "screenshots")
        bad = [p for p, e in report["pages"].items() if not e["ok"]]
        print("browser check: " + ("all pages ok" if not bad else f"problems on {', '.join(bad)}"))
        if bad:
            return 1
    if planned and args.executor == "local" and all(v == "executed" for v in fates.values()):
        # a whole build's costs, per notebook, can size later builds
        costs = sizing.record_build(values, t2 - t0, started, [r for r in report if r["fate"] == "executed"])
        if costs:
            print(f"build costs recorded in {costs.relative_to(params.ROOT)}")
    print(f"open {html / 'index.html'}")
    print(json.dumps({"parameter_set": args.params, "notebooks": fates, "execute_s": round(t1 - t0, 1),
                      "build_s": round(t2 - t1, 1), "per_notebook": report,
                      "html": str(html.relative_to(params.ROOT))}))
    return 0


def cmd_explore(args) -> int:
    from ..book import live

    return live.serve(args.params, port=args.port)


def _params(p) -> None:
    p.add_argument("--params", default="cpu-embedded", help="parameter set (params/<name>.yaml) or a YAML file")


def add_parsers(sub) -> None:
    p = sub.add_parser("book", help="run the chapter notebooks (papermill) and build the Jupyter Book")
    _params(p)
    p.add_argument("--recompute", action="store_true", help="re-execute notebooks even if nothing changed")
    p.add_argument("--check", action="store_true", help="then check the pages in headless Chromium")
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                   help="the build's time budget where the set leaves sizes to the planner (its BUDGET_MINUTES)")
    options.executor(p, local_help="local: the notebooks run the benchmarks themselves (default); slurm: the "
                     "runs that follow from the parameters go to Slurm first, one job each, then the notebooks run",
                     subprocess=False)
    p.add_argument("--retries", type=int, default=0, help="slurm: resubmit a failed run this often (default 0)")
    p.set_defaults(func=cmd_book)

    p = sub.add_parser("explore", help="the live explorer (K, probes, prompt, mode) as a web app on localhost (Voila)")
    _params(p)
    p.add_argument("--port", type=int, default=8866, help="the port on 127.0.0.1 (default 8866)")
    p.set_defaults(func=cmd_explore)
