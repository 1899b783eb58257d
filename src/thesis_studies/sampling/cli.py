"""``thesis-lib studies sampling-check``: speculative sampling proved lossless on tiny models (an exact test)."""

from __future__ import annotations

import json
import platform
import time

from thesis_lib.cli import options
from thesis_lib.errors import ConfigError


def cmd_sampling_check(args) -> int:
    from thesis_studies.sampling import distcheck
    from thesis_lib.bench.environment import provenance
    from thesis_lib.bench.disturbance import available_cores

    if not 0 < args.delta < 1 or not 0 < args.alpha < 1 or not 0 < args.power < 1:
        raise ConfigError("--delta, --alpha and --power must lie strictly between 0 and 1.")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {args.workers}).")
    out = options.new_out_path(args)
    measured = provenance()  # taken before the hour of draws: the code and revision that make them
    pair, t0 = distcheck.tiny_pair(), time.perf_counter()

    def report(r):
        print(f"case {r['case']} {r['draft']:5s} {r['schedule']:8s}: {r['draws']} draws, {r['cells']} cells, "
              f"max |z| {r['max_abs_z']:.2f} vs {r['critical_z']:.2f}, power {r['power']:.4f}, "
              f"acceptance {r['acceptance']:.3f} -> {'ok' if r['ok'] else 'FAIL'}", flush=True)

    result = distcheck.run_all(pair, delta=args.delta, alpha=args.alpha, power=args.power, workers=args.workers,
                               progress=True, on_row=report)
    control, ok = result["negative_control"], result["ok"]
    print(f"negative control (always accept): max |z| {control['max_abs_z']:.1f} vs {control['critical_z']:.2f} "
          f"-> {'rejected, as it must be' if not control['ok'] else 'NOT REJECTED: the check is too weak'}")
    doc = {"delta": args.delta, "alpha": args.alpha, "power": args.power, "chunk": distcheck.CHUNK,
           "workers": args.workers or available_cores(), "configurations": result["configurations"],
           "negative_control": control, "ok": ok, "seconds": round(time.perf_counter() - t0, 1),
           "environment": {"python": platform.python_version(), "machine": platform.machine(),
                           "processor": platform.processor()}, "measured": measured}
    options.write_new(out, doc)
    print(json.dumps({k: v for k, v in doc.items() if k not in ("configurations", "negative_control")}))
    return 0 if ok else 1


def add_parsers(sub) -> None:
    p = sub.add_parser("sampling-check", help="prove speculative sampling lossless on tiny models (exact test)",
                       description="Speculative sampling (dense and FlashHead drafts, ordinary and deferred) against "
                       "target-only sampling's exact distribution of the first tokens (tiny models, 8 tokens), draws "
                       "enough to catch an error of --delta with probability --power; a wrong rule must fail.")
    p.add_argument("--delta", type=float, default=0.01, help="absolute error to catch (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=1e-3, help="family-wise level per configuration (default: %(default)s)")
    p.add_argument("--power", type=float, default=0.99, help="power against --delta (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes making the draws (default: one per core; any number: the same draws)")
    options.out(p, "write the results as JSON to this new file")
    p.set_defaults(func=cmd_sampling_check)
