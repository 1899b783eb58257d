"""FlashHead's Triton head of this revision against an earlier revision's, side by side on one GPU (random weights
at Qwen3-0.6B's head shape, 9,496 clusters of 16), both captured in CUDA graphs and timed on the device alone,
beside the dense head; and their tokens against the float32 reference and against each other.

    git show REV:src/thesis_lib/heads/gpu_kernels.py > OLD/gpu_kernels.py   # and triton_kernels.py, an __init__.py
    PYTHONPATH=src:. python tools/gpu_head_compare.py --old OLD --out compare.json

``--old`` names a package folder holding the earlier ``gpu_kernels.py`` and ``triton_kernels.py``; its ``greedy``
takes FlashHead's fast arguments. In the document ``old`` is that revision's head and ``new`` this one's (where
this revision keeps the earlier kernels, the two are the same). ``--set`` sets this revision's module constants for
the whole run (so ``new`` is that design); ``--variants`` times other settings beside it, interleaved and each
alone, with their kernel profiles. Interleaved, the graph in the ``new`` slot (and ``default`` among the variants)
has timed 2.5-5.9 us slower than alone on an H100, identical code included (the measurement log, 2026-11-27):
compare designs as variants or alone. ``--batch`` also times both at batch B, and the document records each
compiled kernel's registers and spills. Prints one line per probe count and writes the
JSON document.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="package folder with the earlier gpu_kernels.py/triton_kernels.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--repeat-calls", type=int, default=5, help="calls of each head per state, tokens compared")
    ap.add_argument("--batch", default="", help="batch sizes at which new, old and dense are also timed, "
                    "captured over B rows at 593 probes (e.g. '1,2,4,8,16,32')")
    ap.add_argument("--variants", default="", help="settings of the new head also timed at 593 probes: module "
                    "constants of this revision's heads.gpu_kernels, e.g. 'PICK_BLOCK=512;PICK_BLOCK=2048,TIE_CAP=32' "
                    "(variants split by ';')")
    ap.add_argument("--set", default="", help="module constants of this revision's heads.gpu_kernels for the whole "
                    "run, so 'new' is that design, e.g. 'SCORE_IN_TRITON=0,CENTROID_BLOCK=32'")
    args = ap.parse_args()
    from thesis_studies.gpucheck.run import random_clustering, versions
    from thesis_studies.gpucheck.graphs import capture_head, queued_times
    from thesis_lib.bench.timing import stats_ms
    from thesis_lib.heads import gpu_kernels
    from thesis_lib.heads.dense import DenseGreedyHead
    from thesis_lib.heads.flashhead import FlashHead

    _apply(gpu_kernels, args.set)
    old_dir = Path(args.old).resolve()
    sys.path.insert(0, str(old_dir.parent))
    old = importlib.import_module(f"{old_dir.name}.gpu_kernels")
    device = "cuda:0"
    vocab, hidden = 151936, 1024
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    states = torch.randn(args.rows, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
    clustering = random_clustering(vocab, hidden, vocab // 16)
    head = FlashHead(weight, clustering, n_probes=593, path="triton")
    eager = FlashHead(weight, clustering, n_probes=593, path="eager")
    reference = FlashHead(weight, clustering, n_probes=593, path="reference")
    dense = DenseGreedyHead(weight)
    doc = {"versions": versions(device), "old": str(old_dir.name), "set": args.set, "rows": args.rows, "reps": args.reps,
           "note": "random weights: latency only", "curve": []}
    t0 = time.perf_counter()
    for p in (64, 256, 593):
        for h in (head, eager, reference):
            h.with_probes(p)
        calls = {"dense": dense, "new": head, "old": lambda x: old.greedy(x, *head.fast_arguments())}
        graphs = {name: capture_head(fn, states) for name, fn in calls.items()}
        want = [int(reference(states[i:i + 1])) for i in range(args.rows)]
        fast = [int(eager(states[i:i + 1])) for i in range(args.rows)]  # the torch path's bfloat16 ranking
        got = {n: [[int(graphs[n](i)) for i in range(args.rows)] for _ in range(args.repeat_calls)]
               for n in ("new", "old")}
        times = queued_times(graphs, args.rows, reps=args.reps, device=device)
        ms = {n: stats_ms(t)["p50_ms"] for n, t in times.items()}
        row = {"n_probes": p, "ms": ms, "speedup_new": ms["dense"] / ms["new"], "speedup_old": ms["dense"] / ms["old"],
               "new_over_old": ms["old"] / ms["new"],
               "same_as_reference": {n: sum(a == b for a, b in zip(v[0], want)) for n, v in got.items()},
               "same_as_eager_bf16": {n: sum(a == b for a, b in zip(v[0], fast)) for n, v in got.items()},
               "stable_over_calls": {n: all(x == v[0] for x in v) for n, v in got.items()},
               "new_equals_old": sum(a == b for a, b in zip(got["new"][0], got["old"][0]))}
        doc["curve"].append(row)
        print(f"p={p}: dense {1e3 * ms['dense']:.1f} us, old {1e3 * ms['old']:.1f} us ({row['speedup_old']:.2f}x), "
              f"new {1e3 * ms['new']:.1f} us ({row['speedup_new']:.2f}x); same as reference "
              f"{row['same_as_reference']}, as eager bf16 {row['same_as_eager_bf16']}, new = old "
              f"{row['new_equals_old']}/{args.rows}, stable {row['stable_over_calls']}", flush=True)
    doc["variants"] = _variants(args, head, dense, states, gpu_kernels, capture_head, queued_times, stats_ms)
    doc["batch"] = _batch(args, head, old, dense, states, capture_head, queued_times, stats_ms)
    doc["kernel_profile"] = _profile(head, states[:1])
    doc["resources"] = _resources(gpu_kernels)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _apply(gpu_kernels, spec: str) -> None:
    """Set the module constants a spec names ('NAME=int,NAME=int'); a name the module lacks is an error."""
    for kv in filter(None, spec.split(",")):
        name, value = kv.split("=")
        getattr(gpu_kernels, name)
        setattr(gpu_kernels, name, int(value))


def _variants(args, head, dense, states, gpu_kernels, capture_head, queued_times, stats_ms) -> list[dict]:
    """The new head at 593 probes with other module settings (captured with them), beside the defaults and the
    dense head; tokens compared with the defaults'."""
    head.with_probes(593)
    out = []
    base = capture_head(head, states)
    want = [int(base(i)) for i in range(args.rows)]
    for spec in filter(None, args.variants.split(";")):
        settings = dict(kv.split("=") for kv in spec.split(","))
        saved = {k: getattr(gpu_kernels, k) for k in settings}
        try:
            _apply(gpu_kernels, spec)
            graph = capture_head(head, states)
            profile = _profile(head, states[:1])
        finally:
            for k, v in saved.items():
                setattr(gpu_kernels, k, v)
        same = sum(int(graph(i)) == want[i] for i in range(args.rows))
        times = queued_times({"dense": capture_head(dense, states), "default": base, "variant": graph}, args.rows,
                             reps=args.reps, device="cuda:0")
        ms = {n: stats_ms(t)["p50_ms"] for n, t in times.items()}
        alone = {n: stats_ms(queued_times({n: g}, args.rows, reps=args.reps, device="cuda:0")[n])["p50_ms"]
                 for n, g in (("variant", graph), ("default", base))}
        out.append({"settings": settings, "ms": ms, "alone_ms": alone, "same_as_default": same,
                    "kernel_profile": profile})
        print(f"variant {spec}: {1e3 * ms['variant']:.1f} us against the default's {1e3 * ms['default']:.1f} us "
              f"(dense {1e3 * ms['dense']:.1f}); alone {1e3 * alone['variant']:.1f} against "
              f"{1e3 * alone['default']:.1f}; same tokens {same}/{args.rows}; kernels "
              + ", ".join(f"{k['name'][:24]} {k['us_per_call']:.1f}" for k in profile), flush=True)
    return out


def _batch(args, head, old, dense, states, capture_head, queued_times, stats_ms) -> dict:
    """New, old and dense heads at batch B, each captured over a static [B, D] input (593 probes); the two
    FlashHead heads' tokens compared on every group."""
    head.with_probes(593)
    out = {}
    for b in (int(x) for x in filter(None, args.batch.split(","))):
        n = states.shape[0] // b
        calls = {"dense": dense, "new": head, "old": lambda x: old.greedy(x, *head.fast_arguments())}
        graphs = {name: capture_head(fn, states, rows=b) for name, fn in calls.items()}
        same = sum(int(torch.equal(graphs["new"](i).clone(), graphs["old"](i))) for i in range(n))
        times = queued_times(graphs, n, reps=args.reps, device="cuda:0")
        ms = {name: stats_ms(t)["p50_ms"] for name, t in times.items()}
        out[str(b)] = {"groups": n, "ms": ms, "speedup_new": ms["dense"] / ms["new"],
                       "speedup_old": ms["dense"] / ms["old"], "same_groups": same}
        print(f"B={b}: dense {1e3 * ms['dense']:.1f} us, old {1e3 * ms['old']:.1f} us "
              f"({ms['dense'] / ms['old']:.2f}x), new {1e3 * ms['new']:.1f} us ({ms['dense'] / ms['new']:.2f}x); "
              f"same {same}/{n}", flush=True)
    return out


def _resources(gpu_kernels) -> dict:
    """Registers, spills and shared memory of each compiled kernel of this revision (the compiler's report)."""
    out = {}
    for name in ("score_count_kernel", "count_kernel", "pick_kernel", "candidate_kernel", "finish_kernel"):
        try:
            caches = getattr(gpu_kernels._kernels(), name).device_caches
            for device, cache in caches.items():
                for key, kernel in cache[0].items():
                    kernel._init_handles()
                    out.setdefault(name, []).append({"n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                                                     "shared": kernel.metadata.shared})
        except Exception as exc:  # noqa: BLE001 - the report is informative only
            out[name] = f"{type(exc).__name__}: {exc}"
    print("resources:", json.dumps(out), flush=True)
    return out


def _profile(head, h: torch.Tensor) -> list[dict]:
    """Device microseconds per call of each kernel of the new head (torch.profiler, 50 calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        head(h)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            head(h)
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    return [{"name": e.key[:100], "us_per_call": e.self_device_time_total / 50} for e in rows[:8]
            if e.self_device_time_total > 0]


if __name__ == "__main__":
    raise SystemExit(main())
