"""``thesis-lib studies gpu-check``: the GPU acceptance run, at the thesis' shapes with RANDOM weights (no hub needed).

What it measures, on one device, in bfloat16, timed with CUDA events on a GPU (:mod:`thesis_lib.bench.timing`):

- **head** (Tables 4.1/4.2's question): one greedy head call on a Qwen3-0.6B-shaped hidden state, the dense
  151,936 x 1,024 head against FlashHead at 64..593 probes (C = 9,496 clusters of 16), eager and compiled, and
  compiled with CUDA graphs (``mode="reduce-overhead"``) on a GPU. The clusters are a random equal-size
  partition: a head's cost depends on its shapes, not on which tokens share a cluster.
- **draft step** (Tables 4.3/4.4's, :mod:`~thesis_studies.gpucheck.step`): one decode step of a random Qwen3-0.6B
  (28 layers, tied embeddings) with the dense head and with FlashHead at Embedl's default 593 probes.
- **draft step with the body in a CUDA graph**: the same step with a static KV cache and the body compiled with
  ``mode="reduce-overhead"`` (CUDA graphs on a GPU), both heads compiled likewise: the launch-free setting in
  which the thesis' vLLM draft ran. In eager transformers a 28-layer step is bound by kernel launches, which
  hides what the head costs; this row shows the head's share where launches are gone.
- **heads at batch B**: the dense head and FlashHead on B = 1..32 random states at once, each call with its
  launches and, on a GPU, both heads captured in CUDA graphs (:func:`thesis_studies.serving.heads.random_heads_by_batch`).
- **verify curve**: the forward over a block of n = 1..13 tokens over one step of a Qwen3-32B-shaped stack
  with fewer layers in bf16; on a GPU also the whole 64-layer target with 4-bit weights, head included, over
  blocks of 1..16 (:func:`thesis_studies.gpucheck.verify.verify_int4_check`), whose step the summary sets against
  the captured FlashHead draft step (the thesis' draft-cost ratio).

Random weights make these latency numbers, never acceptance or speedup of decoding; every report says so.
The result is one JSON document (last line of the command's output). ``quick`` shrinks everything so that
the command runs on a CPU in the test suite.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from thesis_lib.decoding.clocks import synchronize
from thesis_lib.heads.clustering import random_clustering
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads import gpu_kernels
from thesis_lib.heads.flashhead import FlashHead, compile_settings
from thesis_lib.models.specs import QWEN3_CONFIGS
from thesis_studies.gpucheck.step import graph_step_check, step_check
from thesis_studies.gpucheck.verify import verify_check, verify_int4_check
from thesis_studies.gpucheck.graphs import capture_head, queued_times, replay_step
from thesis_lib.bench.timing import interleaved, stats_ms

PROBES = (64, 128, 256, 593)
NOTE = ("random weights at the thesis' shapes: latency only (no acceptance, no decoding speedup); the verify "
        "stack is bf16 with fewer layers; the 4-bit target runs torch's tinygemm kernel, not AWQ's")


def versions(device: str) -> dict:
    """Versions and the device, for the report."""
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(torch.device(device))))
    return out


@torch.inference_mode()
def head_check(device: str, *, reps: int, rows: int, probes=PROBES, graphs: bool, progress: bool,
               shape: dict = QWEN3_CONFIGS["Qwen3-0.6B"]) -> dict:
    """Dense head vs FlashHead (eager, compiled, compiled with CUDA graphs) on random hidden states."""
    vocab, hidden = shape["vocab_size"], shape["hidden_size"]
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    states = torch.randn(rows, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
    clustering = random_clustering(vocab, hidden, vocab // 16)
    dense = DenseGreedyHead(weight)
    dense_graphs = torch.compile(dense.__call__, dynamic=False, mode="reduce-overhead") if graphs else None
    triton = graphs and gpu_kernels.available(device)
    dense_captured = capture_head(dense, states) if triton else None  # the dense head does not change with probes
    paths = ["eager", "compiled"] + (["graphs"] if graphs else []) + (["triton"] if triton else [])
    heads = {}
    for path in paths:
        head = FlashHead(weight, clustering, n_probes=max(probes),
                         path={"graphs": "compiled"}.get(path, path))
        if path == "graphs":
            head.compile_mode = "reduce-overhead"
        heads[path] = head
    reference = FlashHead(weight, clustering, n_probes=max(probes), path="reference")
    out = {"vocab": vocab, "hidden": hidden, "n_clusters": clustering.n_clusters, "rows": rows, "curve": []}
    for p in probes:
        fns = {"dense": lambda i: dense(states[i:i + 1])}
        if dense_graphs is not None:
            fns["dense_graphs"] = lambda i: replay_step(dense_graphs, states[i:i + 1])
        for path, head in heads.items():
            if triton and path in ("compiled", "graphs") and p != max(probes):
                continue  # beside the kernels, torch.compile's head (slow on a GPU, compiled anew per probe count)
                # at the largest only; without them it is the shown path at every probe count
            head.with_probes(p)
            fns[f"flash_{path}"] = ((lambda i, h=head: replay_step(h, states[i:i + 1])) if path == "graphs"
                                    else (lambda i, h=head: h(states[i:i + 1])))
        if triton:  # each head captured in one CUDA graph by hand, as a serving engine replays its step
            fns["dense_captured"] = dense_captured
            fns["flash_triton_captured"] = capture_head(heads["triton"], states)  # again: its probe count changed
        # every path's token against the float32 reference over the probed clusters, on every state
        reference.with_probes(p)
        want = [int(reference(states[i:i + 1])) for i in range(rows)]
        agree = {name: sum(int(fn(i)) == want[i] for i in range(rows)) for name, fn in fns.items()
                 if name.startswith("flash_")}
        times = interleaved(fns, rows, reps=reps, warmup=min(rows, 8), desc=f"head p={p}", progress=progress,
                            device=device)
        stats = {name: stats_ms(ts) for name, ts in times.items()}
        row = {"n_probes": p, "candidates": heads["eager"].candidates_per_step(),
               **{f"{name}_ms": s["p50_ms"] for name, s in stats.items()},
               **{f"speedup_{name[6:]}": stats["dense"]["p50_ms"] / s["p50_ms"]
                  for name, s in stats.items() if name.startswith("flash_")}}
        if "flash_graphs" in stats:  # both heads in CUDA graphs: the like-for-like comparison on a GPU
            row["speedup_graphs_vs_dense_graphs"] = stats["dense_graphs"]["p50_ms"] / stats["flash_graphs"]["p50_ms"]
        if triton:
            row["speedup_triton_captured_vs_dense_captured"] = (stats["dense_captured"]["p50_ms"]
                                                                 / stats["flash_triton_captured"]["p50_ms"])
            # the same two graphs, each replay's device time alone (no launch latency, no input copy)
            queued = queued_times({"dense": fns["dense_captured"], "flash": fns["flash_triton_captured"]}, rows,
                                   reps=reps, device=device)
            row["dense_queued_ms"] = stats_ms(queued["dense"])["p50_ms"]
            row["flash_triton_queued_ms"] = stats_ms(queued["flash"])["p50_ms"]
            row["speedup_triton_queued"] = row["dense_queued_ms"] / row["flash_triton_queued_ms"]
        row["agree_with_reference"] = {name[6:]: n for name, n in agree.items()}
        out["curve"].append(row)
    out["paths"] = {path: head.active_path for path, head in heads.items()}
    out["compile_errors"] = {path: head.compile_error for path, head in heads.items() if head.compile_error}
    return out


@torch.inference_mode()
def head_profile(device: str, *, n_probes: int = 593, calls: int = 50,
                 shape: dict = QWEN3_CONFIGS["Qwen3-0.6B"]) -> dict:
    """Where one head call's device time goes: torch.profiler's kernels of FlashHead on the path it takes on
    this device (``flashhead``: the Triton kernels on a GPU), of the compiled FlashHead and of the dense head,
    per call, largest first; and torch.topk's cost, sorted and not, at this probe count."""
    from torch.profiler import ProfilerActivity, profile

    vocab, hidden = shape["vocab_size"], shape["hidden_size"]
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    h = torch.randn(1, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
    clustering = random_clustering(vocab, hidden, vocab // 16)
    heads = {"flashhead": FlashHead(weight, clustering, n_probes=n_probes, path="auto"),
             "flashhead_compiled": FlashHead(weight, clustering, n_probes=n_probes, path="compiled"),
             "dense": DenseGreedyHead(weight)}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    out = {"n_probes": n_probes, "calls": calls}
    for name, head in heads.items():
        if name == "flashhead":
            head(h)
            out["flashhead_path"] = head.active_path
        for _ in range(5):
            head(h)
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(calls):
                head(h)
            synchronize(device)
        key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
        rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)
        out[name] = [{"name": e.key[:120], "calls_per_head_call": e.count / calls,
                      "us_per_head_call": getattr(e, key, 0) / calls} for e in rows[:12] if getattr(e, key, 0) > 0]
    cs = torch.randn(1, vocab // 16, generator=g).to(device=device, dtype=torch.bfloat16)
    for sort in (True, False):
        times = []
        for _ in range(30):
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(20):
                torch.topk(cs, n_probes, dim=-1, sorted=sort)
            synchronize(device)
            times.append((time.perf_counter() - t0) / 20 * 1000)
        out[f"topk_sorted_{sort}_ms"] = statistics.median(times)
    return out


def run(device: str = "cuda:0", *, quick: bool = False, progress: bool = True, target_layers: int | None = None,
        draft_layers: int | None = None) -> dict:
    """The whole check; ``quick`` shrinks it to a CPU-sized smoke run (few layers, few reps, two probe counts)."""
    cuda = device.startswith("cuda")
    compile_settings()  # dynamo's settings for the dense heads compiled here as for the FlashHead's
    t0 = time.perf_counter()
    doc = {"note": NOTE, "versions": versions(device), "quick": quick}
    doc["head"] = head_check(device, reps=2 if quick else 20, rows=8 if quick else 64,
                             probes=(64, 593) if quick else PROBES, graphs=cuda, progress=progress)
    doc["draft_step"] = step_check(device, layers=draft_layers or (2 if quick else 28), reps=3 if quick else 50,
                                   context=32 if quick else 256, n_probes=593, progress=progress)
    try:  # CUDA graphs of a whole model depend on the torch/transformers pair: a failure is reported, not fatal
        doc["draft_step_graphs"] = graph_step_check(device, layers=draft_layers or (2 if quick else 28),
                                                    reps=3 if quick else 50, context=32 if quick else 256,
                                                    n_probes=593, progress=progress)
    except Exception as exc:  # noqa: BLE001 - recorded in the document and printed by the command
        doc["draft_step_graphs"] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    doc["head_profile"] = head_profile(device, calls=5 if quick else 50)
    doc["verify"] = verify_check(device, layers=target_layers or (1 if quick else 8), reps=2 if quick else 10,
                                 context=32 if quick else 256, max_block=5 if quick else 13)
    if cuda:  # the 4-bit kernel is CUDA's; the quick run on a CPU has none (quick on a GPU: 2 layers)
        doc["verify_int4"] = verify_int4_check(device, layers=2 if quick else 64, reps=2 if quick else 10,
                                               context=32 if quick else 256, max_block=5 if quick else 16)
    from thesis_studies.serving.heads import random_heads_by_batch

    doc["batch_heads"] = random_heads_by_batch(device, quick=quick, progress=progress)
    at_default = next(r for r in doc["head"]["curve"] if r["n_probes"] == 593)
    doc["summary"] = {"head_speedup_at_593": at_default.get(
                          "speedup_triton_queued", at_default.get("speedup_graphs_vs_dense_graphs",
                                                                  at_default["speedup_compiled"])),
                      "head_speedup_at_593_captured_with_launch": at_default.get(
                          "speedup_triton_captured_vs_dense_captured"),
                      "agree_with_reference_at_593": at_default["agree_with_reference"],
                      "head_speedup_at_593_compiled": at_default["speedup_compiled"],
                      "draft_step_speedup": doc["draft_step"]["speedup"],
                      "draft_step_speedup_graphs": doc["draft_step_graphs"].get("speedup"),
                      "draft_step_speedup_captured": (doc["draft_step_graphs"].get("captured") or {}).get("speedup"),
                      "draft_step_ceiling_captured": (doc["draft_step_graphs"].get("captured") or {}).get("ceiling"),
                      "verify_13_over_step": doc["verify"]["over_step"].get(13),
                      **_thesis_regime(doc),
                      "thesis": {"head_speedup": 4.32, "draft_step_speedup": 1.108}}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    return doc


def _thesis_regime(doc: dict) -> dict:
    """The thesis' cost terms from this run: the captured FlashHead draft step over the 4-bit target's one-token
    step (the draft's cost ratio), and the target's block of 5 over its step (empty where either part is missing)."""
    int4 = doc.get("verify_int4") or {}
    captured = (doc.get("draft_step_graphs") or {}).get("captured") or {}
    if "ms" not in int4 or "flashhead_ms" not in captured:
        return {}
    step = {int(n): x for n, x in int4["ms"].items()}[1]
    return {"target_step_ms_int4": step, "draft_over_target_int4": captured["flashhead_ms"] / step,
            "verify_5_over_step_int4": {int(n): x for n, x in int4["over_step"].items()}.get(5)}


def text(doc: dict) -> str:
    """The document as the lines ``thesis-lib studies gpu-check`` prints: heads, draft steps, kernels, verify curve."""
    lines = [f"gpu-check on {doc['versions']['device']} ({doc['versions'].get('gpu', 'CPU')}); {doc['note']}"]
    for r in doc["head"]["curve"]:
        lines.append(
            f"  head, {r['n_probes']:>4} probes: dense {r['dense_ms']:.3f} ms"
            + (f" (captured {r['dense_captured_ms']:.4f} ms, device time alone {r['dense_queued_ms']:.4f} ms)"
               if "dense_queued_ms" in r else "") + ", FlashHead "
            + ", ".join(f"{k[6:-3]} {v:.3f} ms ({r['speedup_' + k[6:-3]]:.2f}x)" for k, v in r.items()
                        if k.startswith("flash_") and k.endswith("_ms"))
            + "; same token as the float32 reference: "
            + ", ".join(f"{k} {v}/{doc['head']['rows']}" for k, v in r["agree_with_reference"].items()))
    st = doc["draft_step"]
    lines.append(f"  draft step ({st['layers']} layers): dense {st['dense_ms']:.2f} ms, FlashHead "
                 f"{st['flashhead_ms']:.2f} ms ({st['speedup']:.3f}x; thesis 1.108x)")
    st = doc["draft_step_graphs"]
    if "error" in st:
        lines.append(f"  draft step, body in a CUDA graph: FAILED ({st['error'][:300]})")
    else:
        lines.append(f"  draft step, body in a CUDA graph ({st['compile_mode']}): body {st['body_ms']:.3f} ms, with the "
                     f"dense head {st['dense_ms']:.3f} ms, with FlashHead {st['flashhead_ms']:.3f} ms "
                     f"({st['speedup']:.3f}x; thesis 1.108x)")
        if "flashhead_triton_ms" in st:
            lines.append(f"  draft step, body in a CUDA graph, FlashHead's Triton kernel: "
                         f"{st['flashhead_triton_ms']:.3f} ms ({st['speedup_triton']:.3f}x)")
        cap = st.get("captured")
        if cap and "error" in cap:
            lines.append(f"  draft step captured by hand: FAILED ({cap['error'][:300]})")
        elif cap:
            lines.append(f"  draft step captured by hand in one CUDA graph: body {cap['body_ms']:.3f} ms, with the "
                         f"dense head {cap['dense_ms']:.3f} ms, with FlashHead {cap['flashhead_ms']:.3f} ms "
                         f"({cap['speedup']:.3f}x; a head that cost nothing: {cap['ceiling']:.3f}x)")
    prof = doc["head_profile"]
    lines.append(f"  torch.topk of {prof['n_probes']} in {doc['head']['n_clusters']}: sorted "
                 f"{prof['topk_sorted_True_ms']:.4f} ms, unsorted {prof['topk_sorted_False_ms']:.4f} ms; FlashHead's "
                 f"kernels per call ({prof.get('flashhead_path')} path, us): "
                 + "; ".join(f"{r['name'][:60]} {r['us_per_head_call']:.1f}" for r in prof["flashhead"][:8]))
    if "batch_heads" in doc:
        lines.append("  heads at batch B (random states), FlashHead over the dense head: " + ", ".join(
            f"B={b} {part['stats']['dense']['p50_ms'] / part['stats']['flashhead']['p50_ms']:.2f}x"
            for b, part in doc["batch_heads"]["by_batch"].items()))
    cap = (doc.get("batch_heads") or {}).get("captured")
    if cap:
        lines.append("  heads at batch B captured (device time), FlashHead over the dense head, one call (a call per "
                     "row): " + ", ".join(f"B={b} {r['speedup_batched']:.2f}x" + (
                         f" ({r['speedup_per_row']:.2f}x)" if "speedup_per_row" in r else "")
                                          for b, r in cap["by_batch"].items()))
    v4 = doc.get("verify_int4")
    if v4 and "error" in v4:
        lines.append(f"  4-bit target: FAILED ({v4['error'][:300]})")
    elif v4:
        ms = {int(n): x for n, x in v4["ms"].items()}  # int keys as measured, str keys once saved as JSON
        lines.append(f"  4-bit target ({v4['layers']} layers, {v4['weights_gb']:.1f} GB): step {ms[1]:.2f} ms; "
                     "verify / step: " + ", ".join(f"{n}: {x:.2f}" for n, x in v4["over_step"].items()))
        if "draft_over_target_int4" in doc.get("summary", {}):
            lines.append(f"  captured FlashHead draft step over the 4-bit target step: "
                         f"{doc['summary']['draft_over_target_int4']:.3f}")
    v = doc["verify"]
    lines.append(f"  verify / step ({v['how']}): " + ", ".join(f"{n}: {x:.2f}" for n, x in v["over_step"].items())
                 + (f"; captured verify FAILED ({v['captured_error'][:200]})" if "captured_error" in v else ""))
    return "\n".join(lines)
