"""``thesis-lib studies gpu-check``: the GPU acceptance run at the thesis' shapes with random weights, and the
rehearsal book's notebooks on that device."""

from __future__ import annotations

import json
import time

from thesis_lib.cli import options
from thesis_lib.errors import ConfigError


def cmd_gpu_check(args) -> int:
    from thesis_studies.gpucheck import run as gpucheck

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
    options.write_new(out_path, doc)
    print(json.dumps(doc))
    return 0


def _rehearsal_book_on(device: str) -> dict:
    """Execute every chapter notebook of the rehearsal set (tiny stand-in models) with target and draft on
    ``device`` itself, not on virtual GPUs: the book's GPU code path on a real device (notebooks only; the HTML
    step does not depend on the device)."""
    from thesis_lib.book import execute

    t0 = time.perf_counter()
    runs = f"runs/gpu-check-book-{time.strftime('%Y%m%d-%H%M%S')}"
    fates = execute.execute("rehearsal", recompute=True, overrides={"DEVICE": device, "DRAFT_DEVICE": device,
                                                                     "RUNS_DIR": runs}, progress=True)
    report = execute.execution_report("rehearsal")
    return {"set": "rehearsal", "device": device, "runs_dir": runs, "fates": fates, "notebooks": report,
            "seconds": round(time.perf_counter() - t0, 1)}


def add_parsers(sub) -> None:
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
