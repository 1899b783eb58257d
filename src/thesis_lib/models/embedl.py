"""Embedl's FlashHead checkpoints (``embedl/Qwen3-0.6B-FlashHead``, the thesis' draft): config and assets.

A checkpoint's config carries FlashHead's keys (``FLASH_KEYS``) beside its base model's, under a ``model_type``
``AutoModelForCausalLM`` does not know: :func:`base_config` rebuilds the base architecture's config, so the body
loads as that (the thesis' "dense shared" control, Table 4.7). :func:`resolve` takes a checkpoint folder, its
assets folder or a (gated) hub id, fetching config and assets only; :func:`with_body` fetches the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .hub import hub_snapshot

FLASH_KEYS = ("n_clusters", "n_probes", "flash_head_special_token_ids", "flash_head_cache_dir",
              "enforce_equal_cluster_sizes")
DEFAULT_ASSET_DIR = "flash_head_assets"
#: Base architectures a checkpoint's own ``model_type`` may wrap, most specific first.
BASES = ("qwen3", "qwen2", "llama", "mistral")


@dataclass(frozen=True)
class Checkpoint:
    """What a FlashHead checkpoint's config says; ``folder`` holds its config (and weights, if it has any)."""

    source: str
    folder: Path | None
    assets: Path
    n_clusters: int | None = None
    n_probes: int | None = None
    special_ids: tuple[int, ...] = ()
    equal_sizes: bool | None = None
    config: dict = field(default_factory=dict)

    @property
    def has_body(self) -> bool:
        """Whether the checkpoint ships model weights (then its body is the "dense shared" control)."""
        return self.folder is not None and any(self.folder.glob("*.safetensors"))


def is_checkpoint(config: dict) -> bool:
    return "flash_head_cache_dir" in config or ("n_clusters" in config and "n_probes" in config)


def read_config(folder: Path) -> dict:
    """A folder's ``config.json`` (``{}`` if there is none or it cannot be read)."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _checkpoint(source: str, folder: Path | None, assets: Path, cfg: dict) -> Checkpoint:
    special = cfg.get("flash_head_special_token_ids") or ()
    special = (special,) if isinstance(special, int) else tuple(int(i) for i in special)
    return Checkpoint(source=source, folder=folder, assets=assets, n_clusters=cfg.get("n_clusters"),
                      n_probes=cfg.get("n_probes"), special_ids=special,
                      equal_sizes=cfg.get("enforce_equal_cluster_sizes"), config=cfg)


def resolve(assets: str, *, fallback: str = "", fetch_assets: bool = True) -> Checkpoint:
    """A checkpoint (or bare assets) from a folder or a hub id; clear errors for anything else. With
    ``fetch_assets=False`` a hub checkpoint's config alone is read (a cheap check)."""
    path = Path(assets).expanduser()
    if path.is_dir():
        cfg = read_config(path)
        if is_checkpoint(cfg):
            return _checkpoint(assets, path, path / cfg.get("flash_head_cache_dir", DEFAULT_ASSET_DIR), cfg)
        if (path / DEFAULT_ASSET_DIR).is_dir():
            return Checkpoint(source=assets, folder=None, assets=path / DEFAULT_ASSET_DIR)
        return Checkpoint(source=assets, folder=None, assets=path)  # the assets folder itself
    parts = assets.split("/")
    if len(parts) == 2 and all(parts) and not assets.startswith((".", "/", "~")):
        folder = hub_snapshot(assets, ("config.json",), fallback=fallback)
        cfg = read_config(folder)
        if not is_checkpoint(cfg):
            raise ConfigError(f"{assets!r} is no FlashHead checkpoint: its config.json has none of "
                              f"{', '.join(FLASH_KEYS[:2])}.")
        sub = cfg.get("flash_head_cache_dir", DEFAULT_ASSET_DIR)
        if fetch_assets:
            folder = hub_snapshot(assets, ("config.json", f"{sub}/*"), fallback=fallback)
        return _checkpoint(assets, folder, folder / sub, cfg)
    raise ConfigError(f"The FlashHead assets {assets!r}: this path is not a folder, nor a hub id of the form "
                      "'org/name'.")


def with_body(checkpoint: Checkpoint) -> Path:
    """The checkpoint's folder with its weights (downloaded from the hub if needed)."""
    if checkpoint.folder is None:
        raise ConfigError(f"{checkpoint.source} holds FlashHead assets only, no model weights.")
    if Path(checkpoint.source).expanduser().is_dir():
        return checkpoint.folder
    from .specs import HUB_FILES

    return hub_snapshot(checkpoint.source, HUB_FILES["model"] + (f"{checkpoint.assets.name}/*",))


def base_config(config: dict):
    """The base architecture's ``PretrainedConfig`` for a checkpoint's config (its FlashHead keys dropped)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kind = str(config.get("model_type", ""))
    base = kind if kind in CONFIG_MAPPING else next((b for b in BASES if b in kind.lower()), None)
    if base is None:
        raise ConfigError(f"Cannot tell the base architecture of model_type {kind!r} (looked for "
                          f"{', '.join(BASES)}).")
    rest = {k: v for k, v in config.items()
            if k not in FLASH_KEYS and k not in ("model_type", "architectures", "auto_map", "transformers_version")}
    return AutoConfig.for_model(base, **rest)
