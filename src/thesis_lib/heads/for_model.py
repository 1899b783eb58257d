"""A FlashHead for a loaded model: where its clustering and settings come from, and which tokens it always
scores (thesis section 3.4).

:func:`flashhead_for` is the one call: assets from ``assets`` (a folder in Embedl's format, an Embedl
checkpoint's folder or hub id, :mod:`thesis_lib.models.embedl`), else the model folder's own, else this
library's clustering of the model's head (built once, cached). A checkpoint's config sets the probe count and
the special tokens; :func:`special_token_ids` finds them in a tokenizer otherwise, and :func:`outlier_tokens`
adds, on request, the tokens that fit their cluster worst. :func:`kmeans_ahead` says, before a model loads, which
clusterings of its head would be made by k-means and how long they would take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from ..errors import ClusteringAssetError, ConfigError
from ..models import embedl
from ..models.loading import output_rows
from ..models.packing import layer_bias
from .assets import ASSET_DIR, cached_clustering, load_assets
from .clustering import Clustering, check_cluster_count, default_clusters
from .flashhead import FlashHead, check_probes


def special_token_ids(tokenizer, extra: Iterable[int] = (), limit: int | None = None) -> list[int]:
    """EOS and the tokenizer's special / chat-template tokens, the ids FlashHead always scores."""
    ids = set(int(i) for i in extra)
    ids.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
    for tok_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(tok_id))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(i for i in ids if i >= 0 and (limit is None or i < limit))


def checkpoint_for(loaded, assets: str | None = None) -> embedl.Checkpoint | None:
    """Where a FlashHead's clustering and settings come from: ``assets`` (a folder in Embedl's format, an
    Embedl checkpoint's folder or hub id), else the model's own folder if it is a FlashHead checkpoint or holds
    ``flash_head_assets``; ``None``: this library's clustering."""
    if assets:
        return embedl.resolve(str(assets))
    folder = Path(loaded.path) if getattr(loaded, "path", None) else None
    if folder is not None and ((folder / ASSET_DIR).is_dir() or embedl.is_checkpoint(embedl.read_config(folder))):
        return embedl.resolve(str(folder))
    return None


def clustering_for(loaded, weight: torch.Tensor | None = None, *, assets: str | None = None,
                   n_clusters: int | None = None, n_probes: int | None = None, seed: int = 0, iterations: int = 20,
                   progress: bool = True, log=print, checkpoint: embedl.Checkpoint | None = None) -> Clustering:
    """The clustering a FlashHead for ``loaded`` uses (see :func:`flashhead_for` for where it comes from).

    ``weight`` is the model's output embedding if the caller already holds it (a packed layer makes a
    dense copy on every ``.weight`` read). Bad parameters fail before any clustering work.
    """
    out = loaded.model.get_output_embeddings()
    rows = output_rows(loaded.model)
    hidden = int(loaded.model.config.hidden_size)
    checkpoint = checkpoint or checkpoint_for(loaded, assets)
    if checkpoint is not None:
        clustering = load_assets(checkpoint.assets, vocab_size=rows, hidden_size=hidden)
        stated = checkpoint.n_clusters
        if stated is not None and clustering.n_clusters != int(stated):
            raise ClusteringAssetError(f"{checkpoint.source}: its config says n_clusters={stated}, its assets hold "
                                       f"{clustering.n_clusters} clusters.")
        if n_clusters is not None and clustering.n_clusters != n_clusters:
            raise ConfigError(f"the assets of {checkpoint.source} hold {clustering.n_clusters} clusters, not "
                              f"{n_clusters}.")
        if n_probes is not None:
            check_probes(n_probes, clustering.n_clusters)
        clustering.info.setdefault("source", checkpoint.source)
        return clustering
    c = default_clusters(rows) if n_clusters is None else int(n_clusters)
    check_cluster_count(rows, c)
    if n_probes is not None:
        check_probes(n_probes, c)
    weight = out.weight.detach() if weight is None else weight
    return cached_clustering(weight, c, seed=seed, iterations=iterations, progress=progress, log=log)


def kmeans_ahead(draft: str, precision: str, *, clusters: int | None = None, block_sizes=(),
                 iterations: int = 20) -> dict[int, float]:
    """Before ``draft`` loads: the clusterings of its head that :func:`clustering_for` would make by k-means (neither
    cached nor shipped), each cluster count (``clusters``, V/16 by default, and V over each of ``block_sizes``) with
    its predicted seconds on this machine (:func:`~.clustering.kmeans_seconds`). The head is read from the embedded
    model's converted folder for loads in ``precision``; {} for any other draft (a hub model's head is read only where
    it is downloaded) or one not converted here."""
    from safetensors import safe_open

    from ..models.embedded import EMBEDDED, EMBEDDED_PREFIX, converted_dir
    from .assets import head_sha256, needs_kmeans
    from .clustering import kmeans_seconds

    model = EMBEDDED.get(draft.removeprefix(EMBEDDED_PREFIX)) if draft.startswith(EMBEDDED_PREFIX) else None
    file = converted_dir(model, precision) / "model.safetensors" if model else None
    if file is None or not file.is_file():
        return {}
    with safe_open(str(file), framework="pt") as f:
        weight = f.get_tensor("lm_head.weight" if "lm_head.weight" in f.keys() else "model.embed_tokens.weight")
    weight = weight.to(torch.float32)  # the loaded head's rows, as its clustering's key hashes them
    v, d = weight.shape
    sha = head_sha256(weight)
    counts = {int(clusters or default_clusters(v))} | {v // int(b) for b in block_sizes}
    return {c: kmeans_seconds(v, d, c, iterations=iterations) for c in sorted(counts)
            if needs_kmeans(sha, c, iterations=iterations)}


def _candidate_rows(out, weight: torch.Tensor, given: bool) -> torch.Tensor:
    """The rows FlashHead keeps for its candidates: a weight-only output layer's own bfloat16 rows where ``weight``
    is their float32 widening (read from the layer, or ``given`` by the caller and checked), the same values in
    half the bytes (a 151,936 x 896 head keeps 260 MiB, not 519); else ``weight``. The clustering is built from
    ``weight`` either way (its cache key is those bytes)."""
    from ..models.weight_only import WeightOnlyLinear

    rows = out.dense_weight if isinstance(out, WeightOnlyLinear) else None
    if rows is None or rows.dtype != torch.bfloat16 or weight.dtype != torch.float32 or rows.shape != weight.shape:
        return weight
    if given and not torch.equal(rows.float(), weight):
        return weight
    return rows


def flashhead_for(loaded, *, assets: str | None = None, n_clusters: int | None = None, n_probes: int | None = None,
                  seed: int = 0, iterations: int = 20, path: str = "auto", centroid_dtype: str = "auto",
                  progress: bool = True, log=print,
                  weight: torch.Tensor | None = None) -> FlashHead:
    """A FlashHead for a loaded model (:class:`~thesis_lib.models.loading.LoadedModel`).

    Assets come from, in order: ``assets`` (a folder in Embedl's format, ours or an official checkpoint's, or
    an Embedl checkpoint's hub id); the model folder's own assets (an official FlashHead checkpoint); else this
    library's clustering of the model's head, built once and cached
    (:func:`~thesis_lib.heads.assets.cached_clustering`). A checkpoint's config sets the probe count and the
    always-scored special tokens unless ``n_probes`` is given. Bad parameters (``n_probes``, ``n_clusters``)
    fail before any clustering work. ``weight``: the output embedding if the
    caller holds it already (a packed layer makes a dense copy on every read).
    """
    checkpoint = checkpoint_for(loaded, assets)
    out = loaded.model.get_output_embeddings()
    given = weight is not None
    weight = out.weight.detach() if weight is None else weight  # read once: a packed layer copies on each read
    clustering = clustering_for(loaded, weight, n_clusters=n_clusters, n_probes=n_probes, seed=seed,
                                iterations=iterations, progress=progress, log=log, checkpoint=checkpoint)
    if checkpoint is not None and checkpoint.special_ids:
        specials = sorted(set(checkpoint.special_ids))
    else:
        specials = special_token_ids(loaded.tokenizer, list(loaded.eos_ids), loaded.vocab_limit)
    if n_probes is None and checkpoint is not None and checkpoint.n_probes is not None:
        n_probes = int(checkpoint.n_probes)
    head = FlashHead(_candidate_rows(out, weight, given), clustering, special_ids=specials, vocab_limit=loaded.vocab_limit,
                     bias=layer_bias(out), n_probes=n_probes, path=path, centroid_dtype=centroid_dtype)
    head.checkpoint = checkpoint.source if checkpoint is not None else None
    return head
