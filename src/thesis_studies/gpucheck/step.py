"""The draft's decode step on a GPU for ``thesis-lib studies gpu-check`` (Tables 4.3/4.4's question), at Qwen3-0.6B's
shapes with random weights: the dense head against FlashHead on one step of the whole draft.

:func:`step_check`: eager transformers (bound by kernel launches at this size). :func:`graph_step_check`: a static
KV cache with the body compiled and run in CUDA graphs (``mode="reduce-overhead"``), and the whole step captured by
hand in one CUDA graph (:func:`_captured_steps`), with the body alone beside it: the launch-free setting of the
thesis' vLLM draft, and the ceiling a head that cost nothing would give.
"""

from __future__ import annotations

import torch

from thesis_lib.decoding.state import ModelState
from thesis_lib.heads import gpu_kernels
from thesis_lib.heads.clustering import random_clustering
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.flashhead import FlashHead
from thesis_lib.models.specs import QWEN3_CONFIGS
from thesis_studies.gpucheck.verify import qwen3
from thesis_studies.gpucheck.graphs import capture, queued_times
from thesis_lib.bench.timing import interleaved, stats_ms


@torch.inference_mode()
def step_check(device: str, *, layers: int, reps: int, context: int, n_probes: int, progress: bool) -> dict:
    """One decode step of a random Qwen3-0.6B-shaped draft, dense head vs FlashHead (compiled)."""
    shape = QWEN3_CONFIGS["Qwen3-0.6B"]
    model = qwen3(shape, layers, device)
    weight = model.get_output_embeddings().weight.detach()
    head = FlashHead(weight, random_clustering(shape["vocab_size"], shape["hidden_size"], shape["vocab_size"] // 16),
                     n_probes=n_probes, path="auto")
    ids = list(range(100, 100 + context))
    states = {name: ModelState(model, head=h) for name, h in (("dense", DenseGreedyHead.from_model(model)),
                                                               ("flashhead", head))}
    for st in states.values():
        st.greedy(ids[:-1], last_only=True)

    def step(name: str) -> None:
        st = states[name]
        st.greedy([ids[-1]], last_only=True)
        st.crop(1)

    times = interleaved({n: (lambda i, n=n: step(n)) for n in states}, 1, reps=reps, warmup=3, desc="draft step",
                        progress=progress, device=device)
    stats = {n: stats_ms(t) for n, t in times.items()}
    return {"layers": layers, "context": context, "n_probes": n_probes, "path": head.active_path,
            "dense_ms": stats["dense"]["p50_ms"], "flashhead_ms": stats["flashhead"]["p50_ms"],
            "speedup": stats["dense"]["p50_ms"] / stats["flashhead"]["p50_ms"],
            "dense_mean_ms": stats["dense"]["mean_ms"], "flashhead_mean_ms": stats["flashhead"]["mean_ms"]}


@torch.inference_mode()
def graph_step_check(device: str, *, layers: int, reps: int, context: int, n_probes: int, progress: bool) -> dict:
    """One decode step with a static KV cache and the body compiled (CUDA graphs on a GPU), dense vs FlashHead."""
    from transformers import StaticCache

    cuda = device.startswith("cuda")
    mode = "reduce-overhead" if cuda else None
    shape = QWEN3_CONFIGS["Qwen3-0.6B"]
    model = qwen3(shape, layers, device)
    weight = model.get_output_embeddings().weight.detach()
    clustering = random_clustering(shape["vocab_size"], shape["hidden_size"], shape["vocab_size"] // 16)
    flash = FlashHead(weight, clustering, n_probes=n_probes, path="compiled")
    flash.compile_mode = mode
    dense_head = DenseGreedyHead(weight)
    dense = torch.compile(dense_head.__call__, dynamic=False, mode=mode)
    cache = StaticCache(config=model.config, max_cache_len=context + 1)
    ids = torch.arange(100, 100 + context, device=device)[None]
    model.model(input_ids=ids[:, :-1], past_key_values=cache, cache_position=torch.arange(context - 1, device=device),
                use_cache=True)
    token, position = ids[:, -1:], torch.tensor([context - 1], device=device)
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", ()) if hasattr(layer, "cumulative_length")]

    def body_fn(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        # the same position each time (transformers' static layers count their own length: rewound in the graph),
        # so the step rewrites one cache slot and every repetition is the same work
        for counter in counters:
            counter.fill_(context - 1)
        return model.model(input_ids=token, past_key_values=cache, cache_position=position,
                           use_cache=True).last_hidden_state[:, -1]

    body = torch.compile(body_fn, dynamic=False, mode=mode)

    def step(head=None):
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs may reuse the last one's outputs
        hidden = body(token, position)
        return hidden if head is None else head(hidden)

    triton = FlashHead(weight, clustering, n_probes=n_probes, path="triton") if gpu_kernels.available(device) \
        else None
    fns = {"body": lambda i: step(), "dense": lambda i: step(dense), "flashhead": lambda i: step(flash),
           **({"flashhead_triton": lambda i: step(triton)} if triton is not None else {})}
    times = interleaved(fns, 1, reps=reps, warmup=3, desc="draft step (graphs)", progress=progress, device=device)
    stats = {n: stats_ms(t) for n, t in times.items()}
    captured = _captured_steps(body_fn, dense_head, triton, token, position, reps=reps, progress=progress,
                               device=device) if triton is not None else None
    return {"layers": layers, "context": context, "n_probes": n_probes, "compile_mode": mode or "default",
            **({"captured": captured} if captured is not None else {}),
            "flash_path": flash.active_path, "body_ms": stats["body"]["p50_ms"], "dense_ms": stats["dense"]["p50_ms"],
            "flashhead_ms": stats["flashhead"]["p50_ms"],
            "speedup": stats["dense"]["p50_ms"] / stats["flashhead"]["p50_ms"],
            **({"flashhead_triton_ms": stats["flashhead_triton"]["p50_ms"],
                "speedup_triton": stats["dense"]["p50_ms"] / stats["flashhead_triton"]["p50_ms"]}
               if triton is not None else {})}


def _captured_steps(body_fn, dense_head, flash_head, token, position, *, reps: int, progress: bool,
                    device: str) -> dict:
    """The whole draft step captured by hand in one CUDA graph, as a serving engine replays it: the body
    compiled by inductor without CUDA graphs of its own, then the dense head or FlashHead's Triton kernels.
    Also the body alone, whose time bounds what any head can gain: ``dense / body`` is the step speedup of a
    head that cost nothing."""
    def body_plain(t, q):  # its own code object: dynamo keeps this compile apart from the reduce-overhead one
        return body_fn(t, q)

    try:
        plain = torch.compile(body_plain, dynamic=False)
        fns = {"body": capture(plain, token, position),
               "dense": capture(lambda t, q: dense_head(plain(t, q)), token, position),
               "flashhead": capture(lambda t, q: flash_head(plain(t, q)), token, position)}
    except Exception as exc:  # noqa: BLE001 - recorded in the document and printed by the command
        return {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    times = queued_times(fns, 1, reps=reps, device=device)
    ms = {n: stats_ms(t)["p50_ms"] for n, t in times.items()}
    return {"how": "body compiled (inductor, no CUDA graphs of its own) + head, captured by hand in one CUDA graph; "
                   "each replay's device time with the GPU already busy (no launch latency)",
            "body_ms": ms["body"], "dense_ms": ms["dense"], "flashhead_ms": ms["flashhead"],
            "speedup": ms["dense"] / ms["flashhead"], "ceiling": ms["dense"] / ms["body"],
            "dense_head_share": (ms["dense"] - ms["body"]) / ms["dense"]}
