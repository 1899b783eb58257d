"""FlashHead's assets on disk: Embedl's format, the content-keyed cache, shipped clusterings.

- Embedl's format (:func:`save_assets`, :func:`load_assets`): ``flash_head_assets/`` holding
  ``clustering_cache.safetensors`` (``centroids [hidden, C]``, ``cluster_assignments [V]``) and
  ``clustering_config.json``; our sidecar records the files' sha256, so a damaged folder is never used.
- The cache (:func:`cached_clustering`): keyed by the head's sha256 and the parameters.
- Shipped clusterings (:func:`ship_clustering`, :func:`shipped_clustering`): the assignments of the default
  book's clusterings in ``thesis_lib/data/clusterings/``, so a small CPU need not run k-means; centroids are
  rebuilt from the head. ``thesis-lib cluster --ship`` writes one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import ClusteringAssetError
from ..models.cache import cache_dir, sha256_file, write_atomic, write_json
from ..models.cpu import fast_bf16
from .clustering import (ALGORITHM_VERSION, Clustering, capacities, check_cluster_count, default_clusters, member_means,
                         spherical_kmeans)

ASSET_DIR = "flash_head_assets"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "clusterings"
CACHE_FILE = "clustering_cache.safetensors"
CONFIG_FILE = "clustering_config.json"
SIDECAR_FILE = "thesis_lib_clustering.json"


def save_assets(clustering: Clustering, folder: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write Embedl's two files and our sidecar, each whole or not at all (:func:`write_atomic`), the sidecar last."""
    from safetensors.torch import save

    folder = Path(folder)
    data = save({"centroids": clustering.centroids.T.contiguous(),  # [hidden, C]: one column per centroid
                 "cluster_assignments": clustering.assignments.to(torch.int64).contiguous()})
    config = {"format": "safetensors", "vocab_size": clustering.vocab_size, "hidden_size": clustering.hidden_size}
    sidecar = {"n_clusters": clustering.n_clusters, "sha256": {CACHE_FILE: hashlib.sha256(data).hexdigest()},
               **clustering.info, **(extra or {})}
    write_json(folder / CONFIG_FILE, config, indent=2)
    write_atomic(folder / CACHE_FILE, data)
    sidecar["sha256"][CONFIG_FILE] = sha256_file(folder / CONFIG_FILE)
    write_json(folder / SIDECAR_FILE, sidecar, indent=2)
    return folder


def load_assets(folder: str | Path, *, vocab_size: int | None = None, hidden_size: int | None = None,
                verify: bool = True) -> Clustering:
    """Read FlashHead assets (ours or an official checkpoint's) and check them against the head's ``vocab_size``
    and ``hidden_size`` and, with ``verify``, our sidecar's sha256; :class:`ClusteringAssetError` otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / ASSET_DIR).is_dir():
        folder = folder / ASSET_DIR
    cache, cfg_path = folder / CACHE_FILE, folder / CONFIG_FILE
    for p in (cache, cfg_path):
        if not p.is_file():
            raise ClusteringAssetError(f"FlashHead assets in {folder} lack {p.name}.")
    sidecar = _read_json(folder / SIDECAR_FILE) if (folder / SIDECAR_FILE).is_file() else None
    if verify and sidecar is not None:
        for name, want in sidecar.get("sha256", {}).items():
            got = sha256_file(folder / name) if (folder / name).is_file() else "missing"
            if got != want:
                raise ClusteringAssetError(f"FlashHead asset {folder / name} is corrupt (sha256 {got[:12]}, expected {want[:12]}).")
    config = _read_json(cfg_path)
    if config.get("format") not in (None, "safetensors"):
        raise ClusteringAssetError(f"{cfg_path}: format {config.get('format')!r}, expected 'safetensors'.")
    try:
        tensors = load_file(str(cache))
    except (SafetensorError, OSError, ValueError) as e:
        raise ClusteringAssetError(f"cannot read {cache}: {e}") from e
    if "centroids" not in tensors or "cluster_assignments" not in tensors:
        raise ClusteringAssetError(f"{cache} holds {sorted(tensors)}, not 'centroids' and 'cluster_assignments'.")
    cen = tensors["centroids"].squeeze()
    assign = tensors["cluster_assignments"].to(torch.long).flatten()
    v_cfg, d_cfg = config.get("vocab_size"), config.get("hidden_size")
    for name, want, got in (("vocab_size", vocab_size, v_cfg), ("hidden_size", hidden_size, d_cfg)):
        if want is not None and got != want:
            raise ClusteringAssetError(f"FlashHead assets in {folder} were built for {name}={got}, but the model's head has {want}.")
    if assign.shape[0] != v_cfg:
        raise ClusteringAssetError(f"cluster_assignments has {assign.shape[0]} entries, config says vocab_size={v_cfg}.")
    if cen.ndim != 2 or d_cfg not in cen.shape:
        raise ClusteringAssetError(f"centroids of shape {tuple(cen.shape)} do not have hidden size {d_cfg}.")
    cen = cen.T if cen.shape[0] == d_cfg else cen  # stored [hidden, C]; accept [C, hidden] too
    if int(assign.min()) < 0 or int(assign.max()) >= cen.shape[0]:
        raise ClusteringAssetError(f"cluster_assignments point outside 0..{cen.shape[0] - 1}.")
    info = dict(sidecar or {})
    if sidecar is None:
        info["source"] = "assets without thesis_lib's sidecar (e.g. an official checkpoint's)"
    if folder.parent.parent == clustering_cache_root():
        info["cache_key"] = folder.parent.name
    return Clustering(centroids=cen.to(torch.float32).contiguous(), assignments=assign, info=info)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ClusteringAssetError(f"cannot read {path}: {e}") from e


def head_sha256(weight: torch.Tensor) -> str:
    """sha256 of a head's float32 bytes (shape included), the content key of its clusterings."""
    w = weight.detach().to(torch.float32).cpu().contiguous()  # no copy for a contiguous float32 CPU head
    h = hashlib.sha256(f"{tuple(w.shape)}".encode())
    h.update(memoryview(w.numpy()).cast("B"))  # hashed in place, not copied into a bytes object
    return h.hexdigest()


def clustering_cache_root() -> Path:
    return cache_dir() / "flashhead"


def cache_folder(weight_sha: str, n_clusters: int, seed: int, iterations: int, low_precision: bool) -> Path:
    key = f"{weight_sha[:16]}-C{n_clusters}-seed{seed}-it{iterations}-{'bf16' if low_precision else 'fp32'}-v{ALGORITHM_VERSION}"
    return clustering_cache_root() / key / ASSET_DIR


def needs_kmeans(weight_sha: str, n_clusters: int, *, seed: int = 0, iterations: int = 20,
                 low_precision: bool | None = None) -> bool:
    """Whether :func:`cached_clustering` would run k-means for this head and these parameters: neither a cache
    entry nor a shipped clustering under their key."""
    folder = cache_folder(weight_sha, n_clusters, seed, iterations, fast_bf16() if low_precision is None else
                          low_precision)
    return not folder.is_dir() and not shipped_file(folder.parent.name).is_file()


def shipped_file(key: str, folder: str | Path | None = None) -> Path:
    """Where the shipped clustering for cache key ``key`` lies (in ``folder``, else the package's)."""
    return (Path(folder) if folder is not None else SHIPPED_DIR) / f"{key}.safetensors"


def ship_clustering(clustering: Clustering, weight_sha: str, key: str, folder: str | Path | None = None) -> Path:
    """Write ``clustering``'s assignments and record as the shipped file for cache key ``key`` (never
    overwriting one); centroids are rebuilt from the head on use."""
    from safetensors.torch import save

    path = shipped_file(key, folder)
    if path.exists():
        raise ClusteringAssetError(f"{path} exists; remove it first to ship another clustering under that key.")
    dtype = torch.int16 if clustering.n_clusters <= torch.iinfo(torch.int16).max else torch.int32
    info = {k: v for k, v in clustering.info.items() if k not in ("cache_key", "source", "shipped", "sha256", "head_sha256")}
    meta = {"head_sha256": weight_sha, "key": key, "n_clusters": str(clustering.n_clusters),
            "info": json.dumps(info)}
    return write_atomic(path, save({"cluster_assignments": clustering.assignments.to(dtype).contiguous()}, metadata=meta))


def shipped_clustering(weight: torch.Tensor, weight_sha: str, key: str, n_clusters: int,
                       folder: str | Path | None = None) -> Clustering | None:
    """The shipped clustering for ``key`` if there is one for the head ``weight_sha``, else ``None``; one whose
    cluster sizes are not the equal-size capacities for ``n_clusters`` is damaged and raises."""
    from safetensors import SafetensorError, safe_open

    path = shipped_file(key, folder)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            assign = f.get_tensor("cluster_assignments").to(torch.long)
    except (SafetensorError, OSError, ValueError) as e:
        raise ClusteringAssetError(f"cannot read the shipped clustering {path.name}: {e}") from e
    if meta.get("head_sha256") != weight_sha:
        return None  # the same key prefix, another head: cluster it here
    v = weight.shape[0]
    cap = capacities(v, n_clusters)
    if (assign.shape != (v,) or int(assign.min()) < 0 or int(assign.max()) >= n_clusters
            or not torch.equal(torch.bincount(assign, minlength=n_clusters), cap)):
        raise ClusteringAssetError(f"the shipped clustering {path.name} is not an equal-size partition of "
                                   f"{v} tokens into {n_clusters} clusters.")
    w = weight.detach().to(torch.float32).cpu()
    centroids = member_means(w, assign, cap)
    info = json.loads(meta.get("info", "{}"))
    info["shipped"] = f"thesis_lib/data/clusterings/{path.name}"
    return Clustering(centroids=centroids, assignments=assign, info=info)


def cached_clustering(weight: torch.Tensor, n_clusters: int | None = None, *, seed: int = 0, iterations: int = 20,
                      low_precision: bool | None = None, progress: bool = True, rebuild: bool = False,
                      log=print) -> Clustering:
    """The clustering of ``weight`` for these parameters: a sound cache entry (a damaged one is reported and
    rebuilt), else the shipped one for this head, else k-means (``rebuild`` skips both)."""
    v, d = weight.shape
    n_clusters = default_clusters(v) if n_clusters is None else int(n_clusters)
    check_cluster_count(v, n_clusters)
    low_precision = fast_bf16() if low_precision is None else low_precision
    sha = head_sha256(weight)
    folder = cache_folder(sha, n_clusters, seed, iterations, low_precision)
    if folder.exists() and not rebuild:
        try:
            c = load_assets(folder, vocab_size=v, hidden_size=d)
            if c.n_clusters == n_clusters:
                return c
            log(f"FlashHead cache {folder} holds {c.n_clusters} clusters, not {n_clusters}: rebuilding it.")
        except ClusteringAssetError as e:
            log(f"FlashHead cache unusable ({e}): rebuilding it.")
        shutil.rmtree(folder, ignore_errors=True)
    c = None if rebuild else shipped_clustering(weight, sha, folder.parent.name, n_clusters)
    if c is None:
        c = spherical_kmeans(weight, n_clusters, iterations=iterations, seed=seed, low_precision=low_precision,
                             progress=progress)
    save_assets(c, folder, extra={"head_sha256": sha})
    c.info["head_sha256"] = sha
    c.info["cache_key"] = folder.parent.name
    return c
