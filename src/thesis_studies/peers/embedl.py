"""Embedl's own FlashHead beside this library's, on the same assets and the same real hidden states.

Embedl publishes its head as PyPI ``flash-head`` (pure torch; the thesis ran it). Where it is installed
(extra ``embedl``: this project never ships its code, whose licence forbids redistribution), :func:`compare`
builds it from the very clustering our head uses (written in Embedl's asset format), runs both greedy heads on
every state, and reports

- the same-token rate, and every difference classified: a **tie** (both tokens have the same exact logit; Embedl
  breaks ties by candidate order, this library by lowest id), **padding** (Embedl picked a row of the embedding
  matrix past the tokenizer's last token, which this library never scores), a **ranking** difference (the
  winning token's cluster is probed by one head and not the other: the cluster scores are ranked in another
  precision), or **other** (none in float32; with a bf16 head, where ours scores candidates unrounded and
  Embedl's compares bf16-rounded logits, a near-tie can land here);
- latency side by side: one call per state, interleaved, same threads, same states (ours as configured,
  compiled where that works).

Embedl's head runs on the CPU here (it moves inputs to CUDA whenever a GPU is visible); both heads are compared
on the CPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import tempfile
from pathlib import Path

import torch

from thesis_lib.heads.assets import save_assets
from thesis_lib.heads.clustering import Clustering
from thesis_lib.heads.flashhead import FlashHead
from thesis_lib.bench.timing import interleaved, stats_ms
from thesis_lib.book import params

PACKAGE, DIST = "flash_head", "flash-head"


def available() -> str | None:
    """The installed ``flash-head`` version, or None."""
    if importlib.util.find_spec(PACKAGE) is None:
        return None
    return importlib.metadata.version(DIST)


def embedl_head(weight: torch.Tensor, head: FlashHead, folder: Path):
    """Embedl's FlashHead over ``weight`` with ``head``'s clustering (written to ``folder`` in Embedl's format),
    probe count and special tokens."""
    from flash_head.flash_head import FlashHead as EmbedlFlashHead
    from flash_head.flash_head import get_flash_head_parameters

    save_assets(Clustering(centroids=head.centroids.cpu(), assignments=head.assignments.cpu()), folder / "assets")
    lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lm_head.weight = torch.nn.Parameter(weight, requires_grad=False)
    parts = get_flash_head_parameters(lm_head, cache_dir="assets", model_or_dir=str(folder))
    return EmbedlFlashHead(lm_head, parts["centroids"], parts["vocab_maps_tensor"], n_probes=head.n_probes,
                           special_token_ids=head.special_ids.tolist())


@torch.inference_mode()
def compare(head: FlashHead, weight: torch.Tensor, states: torch.Tensor, *, reps: int = 3,
            progress: bool = True) -> dict:
    """Same-token rate, classified differences and latency of ``head`` and Embedl's head (module docstring)."""
    version = available()
    if version is None:
        return {"installed": False}
    weight = weight.detach().cpu()
    states = states.cpu().to(weight.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        theirs = embedl_head(weight, head, Path(tmp))
    rows = [states[i:i + 1].contiguous() for i in range(states.shape[0])]
    ours = [int(head(r.to(head.device))[0]) for r in rows]
    embedl = [int(theirs.get_next_token(r[None]).reshape(-1)[0]) for r in rows]
    differences = []
    probed = head.top_clusters(states.to(head.device), reference=False).cpu()  # our fast path's ranking
    ref = head.top_clusters(states.float().to(head.device), reference=True).cpu()  # float32 ranking
    for i, (a, b) in enumerate(zip(ours, embedl)):
        if a == b:
            continue
        h = states[i].float()
        la, lb = float(weight[a].float() @ h), float(weight[b].float() @ h)
        ca, cb = int(head.assignments[a]), int(head.assignments[b])
        in_ours = {ca, cb} <= set(probed[i].tolist()) | set(head.special_ids.tolist())
        if la == lb:
            kind = "tie"
        elif b >= head.vocab_limit:
            kind = "padding"
        elif not in_ours or set(probed[i].tolist()) != set(ref[i].tolist()):
            kind = "ranking"
        else:
            kind = "other"
        differences.append({"state": i, "ours": a, "embedl": b, "logit_ours": la, "logit_embedl": lb, "kind": kind})
    fns = {"ours": lambda i: head(rows[i].to(head.device)).tolist(), "embedl": lambda i: theirs.get_next_token(
        rows[i][None]).tolist()}
    times = interleaved(fns, len(rows), reps=reps, warmup=min(8, len(rows)), desc="ours vs Embedl",
                        progress=progress)
    stats = {n: stats_ms(t) for n, t in times.items()}
    kinds = [d["kind"] for d in differences]
    return {"installed": True, "version": version, "states": len(rows), "n_probes": head.n_probes,
            "n_clusters": head.n_clusters, "ours_path": head.active_path,
            "ours_centroid_dtype": str(head.centroid_dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "same": sum(a == b for a, b in zip(ours, embedl)), "same_rate": sum(a == b for a, b in zip(ours, embedl))
            / len(rows), "differences": differences, "ties": kinds.count("tie"), "padding": kinds.count("padding"),
            "ranking": kinds.count("ranking"), "other": kinds.count("other"), "latency": stats,
            "speedup_p50": stats["embedl"]["p50_ms"] / stats["ours"]["p50_ms"],
            "speedup_mean": stats["embedl"]["mean_ms"] / stats["ours"]["mean_ms"]}


def model_bench_part(flash_head, states: torch.Tensor, *, dense=None, weight: torch.Tensor, reps: int = 3,
                     progress: bool = True) -> dict:
    """``model-bench``'s ``embedl`` part: :func:`compare` on the bench's states and dense output embedding."""
    return compare(flash_head, weight, states, reps=reps, progress=progress)


def book_comparison(p, mb: dict) -> tuple[dict | None, str]:
    """Embedl's head beside ours (:func:`compare`) and its source: this model bench if the package
    is installed, else the document ``EMBEDL_PEER_FILE`` names, else none."""
    if (mb.get("embedl") or {}).get("installed"):
        return mb["embedl"], "this run's model bench"
    if p.embedl_peer_file and (params.ROOT / p.embedl_peer_file).is_file():
        doc = json.loads((params.ROOT / p.embedl_peer_file).read_text(encoding="utf-8"))
        return doc["embedl"], f"thesis-lib model-bench --parts embedl, saved in {p.embedl_peer_file}"
    return None, "not measured: Embedl's flash-head is not installed (pip install -e '.[embedl]')"
