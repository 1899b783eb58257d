"""The draft heads a benchmark run needs, built from its configuration: FlashHead (our clustering or Embedl's
assets, with an Embedl checkpoint's own body), and the heads of the studies' drafts; plus what the run folder
records about them.
"""

from __future__ import annotations

from .. import extensions
from ..heads.for_model import flashhead_for
from ..models import embedl, loading
from ..models.auto import draft_precision
from ..models.loading import check_same_tokenizer


def study_heads(cfg, draft, head, *, progress: bool = True) -> tuple[dict, dict]:
    """The heads of the drafts beyond the thesis' that the configuration's modes need, each built by the study that
    registered it (:data:`thesis_lib.extensions.DRAFT_HEADS`), and what the run folder should record about them."""
    heads, info = {}, {}
    drafts = cfg.drafts()
    for name, build in extensions.DRAFT_HEADS.items():
        if name in drafts:
            heads[name], info[name] = build(cfg, draft, head, progress=progress)
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
