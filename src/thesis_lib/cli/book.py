"""Commands around the book: ``book`` (the chapter notebooks through papermill, then the Jupyter Book),
``explore`` (the live explorer on localhost) and ``gpu-check`` (the GPU acceptance run at the thesis' shapes,
optionally with the rehearsal book on the device)."""

from __future__ import annotations

import json
import sys
import time

from ..errors import ConfigError
from . import options


def cmd_book(args) -> int:
    from ..book import browser, build, execute, params

    from ..book import sizing

    t0, started = time.perf_counter(), time.time()
    if args.budget is not None and args.budget <= 0:
        raise ConfigError(f"--budget must be > 0 minutes (got {args.budget:g}).")
    if args.retries < 0 or args.poll <= 0:
        raise ConfigError("--retries must be >= 0 and --poll > 0.")
    overrides = {"BUDGET_MINUTES": args.budget} if args.budget is not None else {}
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


def cmd_gpu_check(args) -> int:
    from ..bench import gpucheck

    if not (args.device == "cpu" or args.device.startswith("cuda")):
        raise ConfigError(f"--device must be cpu or cuda[:N] (got {args.device!r}).")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {args.device}: this torch sees no CUDA device (torch {torch.__version__}, "
                              f"CUDA {torch.version.cuda}); run with --device cpu to rehearse.")
    for name in ("target_layers", "draft_layers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1.")
    out_path = options.new_out_path(args)
    doc = gpucheck.run(args.device, quick=args.quick, target_layers=args.target_layers,
                       draft_layers=args.draft_layers)
    print(gpucheck.text(doc))
    if args.book:
        doc["book"] = _rehearsal_book_on(args.device)
        print(f"  rehearsal book on {args.device}: " + ", ".join(f"{r['notebook']} {r['seconds']:.0f} s"
                                                                  for r in doc["book"]["notebooks"]))
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


def _rehearsal_book_on(device: str) -> dict:
    """Execute every chapter notebook of the rehearsal set (tiny stand-in models) with target and draft on
    ``device`` itself, not on virtual GPUs: the book's GPU code path on a real device (notebooks only; the HTML
    step does not depend on the device)."""
    from ..book import execute

    t0 = time.perf_counter()
    runs = f"runs/gpu-check-book-{time.strftime('%Y%m%d-%H%M%S')}"
    fates = execute.execute("rehearsal", recompute=True, overrides={"DEVICE": device, "DRAFT_DEVICE": device,
                                                                     "RUNS_DIR": runs}, progress=True)
    report = execute.execution_report("rehearsal")
    return {"set": "rehearsal", "device": device, "runs_dir": runs, "fates": fates, "notebooks": report,
            "seconds": round(time.perf_counter() - t0, 1)}


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

    p = sub.add_parser("gpu-check", help="the GPU acceptance run: head, draft step and verify cost at the thesis' "
                       "shapes with random weights",
                       description="Dense head vs FlashHead at 64..593 probes (eager, compiled, CUDA graphs), the "
                       "heads at batch 1..32, a Qwen3-0.6B draft step, the verify cost of blocks of 1..13 tokens on "
                       "a Qwen3-32B-shaped bf16 stack and, on a GPU, of 1..16 on the whole 64-layer target in 4-bit "
                       "weights; random weights (latency only), timed with CUDA events; one JSON document as the "
                       "last line.")
    p.add_argument("--device", default="cuda:0", help="device to measure (default: %(default)s; cpu works too)")
    p.add_argument("--quick", action="store_true", help="a CPU-sized smoke run: few layers, reps and probe counts")
    p.add_argument("--target-layers", type=int, default=None, help="layers of the bf16 Qwen3-32B-shaped stack (default 8; the 4-bit target has all 64)")
    p.add_argument("--draft-layers", type=int, default=None, help="layers of the Qwen3-0.6B draft (default 28)")
    options.out(p)
    p.add_argument("--book", action="store_true", help="then execute the rehearsal book's notebooks with target and "
                   "draft on --device (needs the book extra)")
    p.set_defaults(func=cmd_gpu_check)
