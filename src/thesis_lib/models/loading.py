"""Loading a model, or a target/draft pair that shares one tokenizer, onto a device (thesis section 3.2).

:func:`load_pair` runs every cheap check (both specs available, the same token table) before any weights
load. :class:`LoadedModel` carries the model, its tokenizer, the folder it came from and what loading did
(dtype, kernels). ``dtype="auto"`` on CPU is bfloat16 where the CPU has native bf16 dot products and float32
elsewhere (:func:`thesis_lib.models.auto.auto_precision`, recorded with the reason); float32 and bfloat16 models get
oneDNN-packed linear layers (:mod:`~thesis_lib.models.packing`) unless told otherwise. This module knows nothing about decoding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MissingPackageError, TokenizerMismatchError
from ..progress import heartbeat, without_library_bars
from . import attention as attn
from . import embedl, fused, virtual, weight_only
from .auto import draft_precision
from .packing import PackedLinear, bf16_packing_available, pack_linears, packing_available
from .specs import (DEFAULT_DRAFT, DEFAULT_TARGET, QUANT_SUFFIXES, ModelSpec, check_available, local_dir, model_config,
                    resolve)


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


def weight_format(name: str, device: str) -> str | None:
    """The weight-only format (:mod:`~thesis_lib.models.weight_only`) a ``dtype`` parameter means on ``device``
    ("auto" resolved), or None for a plain dtype."""
    if device != "cpu" and name in weight_only.FORMATS:
        raise ConfigError(f"DTYPE {name} is a CPU format (the project's kernel over {name.split('-')[0]} weights); "
                          f"on {device} use bfloat16 or float16.")
    if name == "auto" and device == "cpu":
        from .auto import auto_precision

        name = auto_precision()[0]
    return name if name in weight_only.FORMATS else None


def _dtype(name: str, device: str):
    """The torch dtype a model computes in for a ``dtype`` parameter (the weight-only formats: float32)."""
    import torch

    if weight_format(name, device):
        return torch.float32
    if name == "auto":
        if device == "cpu":
            from .auto import auto_precision

            return _dtype(auto_precision()[0], device)
        return torch.bfloat16
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}[name]
    except KeyError:
        raise ConfigError(f"Unknown dtype {name!r}: use auto, float32, bfloat16, float16, float64, "
                          f"{' or '.join(weight_only.FORMATS)} (CPU).") from None


#: Quantisation methods transformers 5 loads through another package: AWQ and GPTQ go through gptqmodel
#: (``autoawq`` is archived upstream, untested beyond torch 2.6 and ignored by transformers 5).
QUANTIZED_WITH = {"awq": "gptqmodel", "gptq": "gptqmodel"}
GPU_STACK = ("the GPU stack: `make book PARAMS=gpu-thesis` installs it, or pip install -e '.[gpu]' "
             "(gptqmodel 7.7.0, which needs torch 2.14.1)")


def resolved_dtype(name: str, device: str = "cpu") -> str:
    """The precision a ``dtype`` parameter means on ``device`` here ("auto" resolved: this CPU's choice, or
    bfloat16 on a GPU), as a name such as "bfloat16" or "int8-weights"."""
    return weight_format(name, device) or str(_dtype(name, device)).replace("torch.", "")


def check_device(device: str | None, name: str = "device") -> None:
    """A clear error for a device string torch cannot read (None: the default device)."""
    import torch

    try:
        torch.device(device or "cpu")
    except (RuntimeError, TypeError):
        raise ConfigError(f"{name} {device!r} is no device torch knows (cpu, cuda, cuda:1, mps, ...).") from None


def resolved_attention(device: str = "cpu") -> str:
    """The attention a model loads with on ``device``: "exact" (row-exact, :mod:`~thesis_lib.models.attention`) on
    a CPU, the model's own ("model") elsewhere (row-exactness there is not measured)."""
    return "exact" if device == "cpu" else "model"


def check_quantization(spec: str | ModelSpec) -> dict | None:
    """The quantisation a model's config declares, checked before any weights load: a method whose loader
    package is missing raises :class:`MissingPackageError` naming it."""
    import importlib.util

    name = spec if isinstance(spec, str) else spec.spec
    ms = resolve(name)
    if ms.quant is not None:  # a load-time quantisation (``<spec>@int4``)
        q = QUANT_SUFFIXES[ms.quant]
        if importlib.util.find_spec(q["package"]) is None:
            raise MissingPackageError(
                f"{name} is quantised at load ({q['method']}, group {q['group_size']}) by `{q['package']}`, which is "
                f"not installed: `make env` installs it with the CPU stack (torchao 0.18.0), or pip install -e '.[int4]'.")
        return {"quant_method": ms.quant, "load_time": True, **q}
    config = model_config(name)
    q = config.get("quantization_config") or None
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    package = QUANTIZED_WITH.get(method)
    if package and importlib.util.find_spec(package) is None:
        raise MissingPackageError(
            f"{spec if isinstance(spec, str) else spec.spec} is {method.upper()}-quantised ({q.get('bits')}-bit, "
            f"group size {q.get('group_size')}); transformers 5 loads {method.upper()} checkpoints through "
            f"`{package}`, which is not installed. Install {GPU_STACK}. (`autoawq` is archived upstream and "
            "transformers 5 ignores it.)")
    return q


def quantization_info(model: Any) -> dict | None:
    """What a quantised model was loaded with: method, bits, group size, the loader package's version and the
    kernel classes it chose (for the run's environment)."""
    import importlib.metadata

    q = getattr(model.config, "quantization_config", None)
    if q is None:
        return None
    q = q.to_dict() if hasattr(q, "to_dict") else dict(q)
    method = str(q.get("quant_method", "")).lower()
    package = QUANTIZED_WITH.get(method)
    try:
        version = importlib.metadata.version(package) if package else None
    except importlib.metadata.PackageNotFoundError:
        version = None
    kernels = sorted({type(m).__name__ for m in model.modules()
                      if type(m).__module__.split(".")[0] in {"gptqmodel", "awq"}})
    return {"method": method, "bits": q.get("bits"), "group_size": q.get("group_size"), "package": package,
            "package_version": version, "kernels": kernels}


def check_load_time(spec: str, device: str, dtype: str) -> None:
    """A ``<spec>@int4`` model runs on the CPU with bfloat16 activations; anything else is refused here."""
    quant = resolve(spec).quant
    if quant is None:
        return
    if device != "cpu":
        raise ConfigError(f"{spec}: the @{quant} suffix quantises for the CPU kernels; on {device} use a checkpoint "
                          "quantised ahead (AWQ, like the thesis' target).")
    if dtype not in ("auto", "bfloat16", "bf16"):
        raise ConfigError(f"{spec}: the int4 kernel takes bfloat16 activations; DTYPE {dtype} cannot be used.")


def quantize_body(model: Any, q: dict) -> tuple[int, int]:
    """Quantise every linear layer of ``model`` but its head in place (``q``: a :data:`QUANT_SUFFIXES` entry);
    returns (quantised, body linears): torchao leaves a layer whose input width the group size does not divide
    as it was."""
    import torch
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    head = model.get_output_embeddings()
    body = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=int(q["group_size"])),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and m is not head)
    quantised = sum(type(m.weight.detach()) is not torch.Tensor for m in body)
    return quantised, len(body)


def quantization_info_load_time(q: dict) -> dict:
    """What a load-time quantisation used, for the run's environment (like :func:`quantization_info`)."""
    import importlib.metadata

    return {"method": q["method"], "bits": q["bits"], "group_size": q["group_size"], "package": q["package"],
            "package_version": importlib.metadata.version(q["package"]), "scope": "body linears; head not quantised"}


def load_tokenizer(spec: str | ModelSpec, *, progress: bool = True, dtype: str | None = None):
    """A model's tokenizer (``dtype``: the precision its weights will load in, so that an embedded model is
    converted once, in that precision)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_dir(spec, progress=progress, what="tokenizer", dtype=dtype))


def _row_probe(model, largest: int) -> dict:
    """The loader's record of :func:`~thesis_lib.models.attention.rows_exact_by_size` over blocks of 2 to
    ``largest`` rows: the verdict, and the sizes, threads and any sizes that failed."""
    import torch

    by_size = attn.rows_exact_by_size(model, range(2, largest + 1))
    return {"rows_exact": all(by_size.values()),
            "rows_probed": {"sizes": [min(by_size), max(by_size)], "threads": torch.get_num_threads(),
                            "inexact": [n for n, ok in by_size.items() if not ok]}}


def probe_rows(lm: LoadedModel, largest: int) -> None:
    """Make ``lm.info``'s row probe cover blocks of up to ``largest`` rows at the current thread count (probing
    again only where the load's probe did not), so a run records the exactness of every block it can verify."""
    import torch

    probed = lm.info.get("rows_probed")
    if probed is None or (probed["sizes"][1] >= largest and probed["threads"] == torch.get_num_threads()):
        return
    lm.info.update(_row_probe(lm.model, max(largest, probed["sizes"][1])))


def load_model(spec: str, *, device: str = "cpu", dtype: str = "auto", tokenizer: Any = None,
               progress: bool = True, pack: bool | None = None, head_rows: bool = True) -> LoadedModel:
    """Load one model (eval mode, no grad) and its tokenizer on ``device``.

    ``pack`` (default: on for float32 and, where oneDNN runs it natively, bfloat16 models on CPU) swaps the linear layers for oneDNN-packed ones
    (:mod:`~thesis_lib.models.packing`): the same model with faster kernels, used by every mode alike. On a CPU
    the attention is row-exact (:func:`resolved_attention`): a block of new tokens attends as one-token steps do;
    ``info["rows_exact"]`` says whether this CPU's kernels compute a block's rows as single rows, probed for every
    block of 2 to :data:`~thesis_lib.models.attention.PROBED_BLOCK` rows at the current thread count
    (``info["rows_probed"]``; :func:`probe_rows` extends it for a run that verifies longer blocks).
    A quantised checkpoint needs its loader package (:func:`check_quantization`, checked first); an Embedl
    FlashHead checkpoint loads as its base architecture (:func:`thesis_lib.models.embedl.base_config`). The
    recorded ``dtype`` is the one the model ended up in (AWQ on CUDA: float16, whatever was asked). ``head_rows``:
    a weight-only model keeps its head's dense rows (a draft's; :func:`~thesis_lib.models.weight_only.head_format`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantized = check_quantization(spec)
    load_time = bool(quantized and quantized.get("load_time"))
    if load_time:
        check_load_time(spec, device, dtype)
        dtype = "bfloat16"
    fmt = None if load_time else weight_format(dtype, device)
    # a weight-only model loads in bfloat16 (its stored precision) and computes in float32 once converted
    torch_dtype = torch.bfloat16 if fmt else _dtype(dtype, device)
    path = local_dir(spec, progress=progress, dtype=str(torch_dtype).replace("torch.", ""))
    t0 = time.perf_counter()
    on_virtual = device.startswith("cuda") and virtual.active()
    kwargs = {"dtype": torch_dtype, "device_map": device if device != "cpu" and not on_virtual else None}
    if pack is None:
        pack = device == "cpu" and not fmt and packing_available() and (
            torch_dtype == torch.float32 or torch_dtype == torch.bfloat16 and bf16_packing_available())
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if embedl.is_checkpoint(raw):
        kwargs["config"] = embedl.base_config(raw)
    with heartbeat(f"loading {spec}"), without_library_bars():
        model, loading_info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    missing = [k for k in loading_info.get("missing_keys", []) if "lm_head" not in k]
    if missing:
        raise ConfigError(f"{spec}: {len(missing)} weights of the model are missing from its files "
                          f"(e.g. {missing[0]}); the checkpoint does not fit its config.")
    if on_virtual:
        virtual.place(model, device)
    model.eval()
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    if load_time:
        n_quant, n_body = quantize_body(model, quantized)
    packed = pack_linears(model) if pack and not fmt and (quantized is None or load_time) else 0
    n_wo = weight_only.convert(model, fmt, head_rows) if fmt else 0
    floor_rows = max((m.min_rows for m in model.modules() if isinstance(m, PackedLinear)), default=1)
    padded = f", products of fewer than {floor_rows} rows padded to {floor_rows}" if floor_rows > 1 else ""
    info = {"attention": (attn.use(model) if resolved_attention(device) == "exact"
                          else str(model.config._attn_implementation)),
            "rows_exact": None,
            "load_seconds": round(time.perf_counter() - t0, 2),
            "cpu_kernels": (f"oneDNN-packed ({packed} linear layers, block layout{padded})"
                            if packed else "stock"),
            "rows_floor": floor_rows,
            "dtype_requested": fmt or str(torch_dtype).replace("torch.", "")}
    if fmt:
        products = ("int8 products over activations rounded per block of 32" if fmt in weight_only.DYNAMIC
                    else "float32 products")
        info["cpu_kernels"] = (f"{fmt} ({n_wo} linear layers, the head in {weight_only.head_format(fmt, head_rows)}; "
                               f"{products}, {weight_only.kernel_path(fmt)} kernel)")
    if device == "cpu" and not on_virtual and model.dtype == torch.float32 and weight_only.available():
        n_norms = fused.use(model)
        info["fused"] = (f"fused float32 operations: {n_norms} RMS norms, the rotary embedding, one query's "
                         "attention (models.fused)")
    if device == "cpu" and not on_virtual:
        info.update(_row_probe(model, attn.PROBED_BLOCK))
    if load_time:
        info["cpu_kernels"] = (f"int4 weight-only body ({n_quant} of {n_body} linear layers, group "
                               f"{quantized['group_size']}), " + (f"oneDNN-packed bf16 for the rest ({packed} layers, "
                                                                  f"the head included{padded})" if packed else "stock bf16 for the rest"))
        info["dtype_reason"] = "bfloat16 activations: the int4 kernel's input precision"
        info["quantization"] = quantization_info_load_time(quantized)
    elif dtype == "auto" and device == "cpu":
        from .auto import auto_precision

        info["dtype_reason"] = auto_precision()[1]
    if quantized is not None and not load_time:
        info["quantization"] = quantization_info(model)
    if embedl.is_checkpoint(raw):
        info["flashhead_checkpoint"] = {k: raw.get(k) for k in embedl.FLASH_KEYS if k in raw}
    if on_virtual:
        info["virtual_device"] = True
    marker = path / "thesis_lib.json"
    if marker.is_file():  # an embedded model's conversion record (its stored dtype is not the loaded one)
        stored = json.loads(marker.read_text())
        info.update({k: v for k, v in stored.items() if k != "dtype"}, stored_dtype=stored.get("dtype"))
    return LoadedModel(spec=str(spec), model=model, tokenizer=tok, path=path, device=device,
                       dtype=str(model.dtype).replace("torch.", ""), info=info)


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


def _stored(dtype: str, device: str) -> str:
    """The precision a model is read from its files in for a ``dtype`` parameter (weight-only: bfloat16)."""
    return "bfloat16" if weight_format(dtype, device) else str(_dtype(dtype, device)).replace("torch.", "")


def load_pair(target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT, *, device: str = "cpu",
              draft_device: str | None = None, dtype: str = "auto", progress: bool = True,
              pack: bool | None = None, draft_dtype: str | None = "auto") -> tuple[LoadedModel, LoadedModel]:
    """Load a target and a draft that share a tokenizer, the draft in :func:`~thesis_lib.models.auto.draft_precision`
    (by default a 4-bit body beside an int8-dynamic target on a CPU); every cheap check runs before any weights load."""
    d_device = draft_device or device
    d_name = draft_precision(dtype, draft_dtype, d_device) if not resolve(draft).quant else dtype
    check_available(target)
    check_available(draft)
    check_quantization(target)
    check_quantization(draft)
    check_load_time(target, device, dtype)
    check_load_time(draft, d_device, d_name)
    _dtype(d_name, d_device)  # an unknown draft dtype fails here, before any weights load
    t_dtype = _stored("bfloat16" if resolve(target).quant else dtype, device)
    d_dtype = _stored("bfloat16" if resolve(draft).quant else d_name, d_device)
    t_tok = load_tokenizer(target, progress=progress, dtype=t_dtype)
    d_tok = load_tokenizer(draft, progress=progress, dtype=d_dtype)
    check_same_tokenizer(t_tok, d_tok, target, draft)
    tgt = load_model(target, device=device, dtype=dtype, tokenizer=t_tok, progress=progress, pack=pack, head_rows=False)
    drf = load_model(draft, device=d_device, dtype=d_name, tokenizer=d_tok, progress=progress, pack=pack)
    if d_name != dtype and draft_dtype in (None, "auto"):
        drf.info["dtype_reason"] = f"{d_name}: the draft's body in 4 bits where {dtype} means int8-dynamic on its CPU"
    return tgt, drf
