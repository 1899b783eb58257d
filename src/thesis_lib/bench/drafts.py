"""The draft heads a benchmark run needs, built from its configuration: FlashHead (our clustering or
Embedl's assets), and chapter 6's adaptive-probe and frequency-truncated heads with the token counts behind
the latter; plus what the run folder records about them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from ..errors import ConfigError
from ..heads.adaptive import AdaptiveFlashHead
from ..heads.assets import clustering_cache_root
from ..heads.for_model import flashhead_for
from ..heads.truncated import frequency_head
from ..models import embedl, loading
from ..models.auto import draft_precision
from ..models.loading import check_same_tokenizer
from .modelbench import collect_hidden_states
from .prompts import encode


def count_tokens(loaded, prompts, *, max_new_tokens: int = 48, cache: str | Path | None = None,
                 progress: bool = True) -> tuple[Counter, dict]:
    """Token counts over the prompts' texts (chat-formatted, as the benchmark sends them) and the model's own
    greedy continuations of them; cached in ``cache`` (a JSON file) keyed by model, prompts and length.
    Returns the counts and a description of the corpus."""
    key = {"model": str(loaded.info.get("gguf_sha256") or loaded.spec), "prompts": [p.question_id for p in prompts],
           "texts": hashlib.sha256(json.dumps([p.text for p in prompts]).encode()).hexdigest(),
           "max_new_tokens": max_new_tokens}
    path = Path(cache) if cache else None
    if path is not None and path.is_file():
        doc = json.loads(path.read_text())
        if doc.get("key") == key:
            return Counter({int(t): c for t, c in doc["counts"].items()}), doc["corpus"]
    if not prompts:
        raise ConfigError("No calibration prompts to count tokens on.")
    counts: Counter = Counter()
    for p in prompts:
        counts.update(encode(loaded.tokenizer, p.text, chat=True))
    hs = collect_hidden_states(loaded, prompts, max_new_tokens=max_new_tokens, progress=progress)
    counts.update(hs.dense_tokens)
    corpus = {"prompts": len(prompts), "generated_tokens": len(hs.dense_tokens), "tokens": sum(counts.values()),
              "distinct": len(counts), "source": "calibration prompts (not measured) and the draft's greedy "
              "continuations of them"}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "corpus": corpus, "counts": {str(t): c for t, c in counts.items()}}))
    return counts, corpus


def token_counts(cfg, draft, *, progress: bool = True):
    """The frequency head's token counts for this configuration (calibration prompts, cached)."""
    key = json.dumps([cfg.draft, cfg.prompt_file, cfg.freq_calibration, cfg.freq_tokens_generated,
                      [p.question_id for p in cfg.check_prompts()]])
    cache = clustering_cache_root().parent / "token-counts" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    return count_tokens(draft, cfg.calibration_prompts(), max_new_tokens=cfg.freq_tokens_generated, cache=cache,
                        progress=progress)


def beyond_heads(cfg, draft, head, *, progress: bool = True) -> tuple[dict, dict]:
    """The heads of the ``adaflash`` and ``freq`` drafts the configuration's modes need, and what the run
    folder should record about them."""
    heads, info = {}, {}
    drafts = cfg.drafts()
    if "adaflash" in drafts:
        heads["adaflash"] = AdaptiveFlashHead(head, margin=cfg.adaptive_margin, min_probes=cfg.adaptive_min_probes,
                                              max_probes=cfg.adaptive_max_probes or head.n_probes)
        info["adaflash"] = {"margin": cfg.adaptive_margin, "min_probes": heads["adaflash"].min_probes,
                            "max_probes": heads["adaflash"].max_probes}
    if "freq" in drafts:
        counts, corpus = token_counts(cfg, draft, progress=progress)
        n = cfg.freq_tokens or head.n_probes * head.cluster_size
        heads["freq"] = frequency_head(draft, counts, n, head.special_ids.tolist())
        info["freq"] = {"tokens": n, "scored": heads["freq"].candidates_per_step(), "corpus": corpus}
    return heads, info


def flash_body(cfg, draft, *, progress: bool = True):
    """An Embedl checkpoint's own model, when ``assets`` names one that ships weights: the thesis' FlashHead
    draft is that model, and its "dense shared" control is that body with the dense head (Table 4.7). Loaded on
    the draft's device and precision, after checking it speaks the draft's token table. None otherwise (the
    FlashHead draft is then the dense draft's body with another head)."""
    if not cfg.assets:
        return None
    checkpoint = embedl.resolve(cfg.assets)
    if not checkpoint.has_body:
        return None
    folder = embedl.with_body(checkpoint)
    check_same_tokenizer(draft.tokenizer, loading.load_tokenizer(str(folder)), draft.spec, cfg.assets)
    body = loading.load_model(str(folder), device=draft.device, dtype=draft_precision(cfg.dtype, cfg.draft_dtype, draft.device),
                              pack=cfg.pack,
                              tokenizer=draft.tokenizer, progress=progress)
    body.spec = cfg.assets
    return body


def flash_head(cfg, draft, body=None):
    """The FlashHead head for ``draft`` as the configuration asks (assets, or our cached clustering); with an
    Embedl checkpoint's ``body`` (:func:`flash_body`) it replaces that model's output layer instead."""
    owner = body if body is not None else draft
    head = flashhead_for(owner, assets=cfg.assets, n_clusters=cfg.clusters, n_probes=cfg.probes,
                         seed=cfg.cluster_seed, iterations=cfg.kmeans_iterations, path=cfg.flash_path,
                         centroid_dtype=cfg.centroid_dtype)
    head.body = body
    return head


def flash_info(head) -> dict:
    """What a run folder's environment records about its FlashHead head."""
    return {"n_clusters": head.n_clusters, "n_probes": head.n_probes, "path": head.active_path,
            "compile_error": head.compile_error, "recompile_resets": head.recompile_resets,
            "centroid_dtype": str(head.centroid_dtype).replace("torch.", ""),
            "candidates": head.candidates_per_step(), "cluster_size": head.cluster_size,
            "checkpoint": head.checkpoint,
            "body": head.body.spec if head.body is not None else "the dense draft's own (same model)",
            "clustering": {k: v for k, v in head.clustering_info.items() if k != "history"}}
