"""Low-byte linear layers for CPUs: weights stored in bfloat16 or int8, products in float32 or in int8.

A decode step reads every weight of the model once, so on a CPU its time is about the weights' bytes over the
memory's read rate. Where the CPU has no native bfloat16 dot products, the models run in float32 and read 4 bytes
per weight; these layers read 2 (``bfloat16-weights``: the bf16 model's own weights) or 1 (``int8-weights``: each
output row rounded to 255 levels of its largest magnitude, one float32 scale per row) and compute in float32.
``int8-dynamic`` reads the same int8 weights and also rounds each input row, at run time, to int8 levels in blocks
of 32 values (a float32 scale per block), so that the products are exact integer dot products (AVX-512 VNNI where
the CPU has it, AVX2 byte products elsewhere): a block of rows costs little more than one row, at the price of
rounding the activations too. ``int4-dynamic`` rounds the weights to 15 levels per block of 32 inputs (a bfloat16
scale per output and block, 0.5625 bytes a weight in all) under the same activations: a draft's body in 4 bits. Each block's integer sum is exact in any order and the blocks are added in a fixed
order, so every path computes each output alike, bit for bit.

The kernel is the project's own (``csrc/weight_only.cpp``), compiled for this machine once, at install time
(``thesis-lib prepare``) or on first use, into the model cache (:func:`kernel`). No part of torch's ecosystem
reached the read rate here (the measurement log has the comparison: oneDNN has no float32-activation kernel over
bf16 or int8 weights that torch exposes; ATen's int8 product with float32 activations is scalar). Each output
element is one chain of fused multiply-adds in a fixed order whatever the number of rows, so every row of a
verified block equals that row computed alone, bit for bit: greedy speculative output stays equal to target-only
output by construction (the loader's row probe checks it like any other layer).

:func:`convert` swaps a model's linear layers for :class:`WeightOnlyLinear` and casts the rest (embeddings,
norms) to float32, the precision the model then computes in. A draft's output layer is kept in bfloat16 weights,
its dense rows beside them: the draft's FlashHead and the dense greedy head read its rows. A target's output layer
(``head_rows=False``: nothing reads its rows) takes the body's format, ``int8-dynamic`` under a 4-bit body too: half
the bytes of bfloat16 rows, and a verified block's rows at about the cost of one.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError

#: DTYPE names of the weight-only formats -> the weights' torch dtype
FORMATS = {"bfloat16-weights": torch.bfloat16, "int8-weights": torch.int8, "int8-dynamic": torch.int8,
           "int4-dynamic": torch.uint8}
#: the input width each format's layers must be a multiple of (others stay float32 ``nn.Linear``)
WIDTH = {"bfloat16-weights": 16, "int8-weights": 16, "int8-dynamic": 32, "int4-dynamic": 32}
#: the formats whose products take activations rounded to int8 per block of 32 at run time
DYNAMIC = ("int8-dynamic", "int4-dynamic")
#: what a format's name leaves open: named in results' keys, so that a result made with another layout is not reused
LAYOUTS = {"int4-dynamic": "bfloat16 scales"}
_SOURCE = Path(__file__).with_name("csrc") / "weight_only.cpp"
#: built into the same module: the fused float32 operations of :mod:`thesis_lib.models.fused`, the compact step's
#: layers in one call (:mod:`thesis_lib.models.compact`) and FlashHead's greedy head (:mod:`thesis_lib.heads.cpu_kernels`)
_SOURCES = tuple(_SOURCE.with_name(n) for n in ("weight_only.cpp", "decode_ops.cpp", "compact_layers.cpp",
                                                 "flash_head.cpp"))
#: ``THESIS_LIB_KERNEL_PATH=avx2`` runs the AVX2 path on a CPU with AVX-512 too: the path of CPUs without AVX-512,
#: timed and tested here
FORCED_PATH_ENV = "THESIS_LIB_KERNEL_PATH"
_FLAGS = ["-O3", "-fopenmp"]
_kernel = None
_kernel_error: str | None = None


def build_dir() -> Path:
    """Where the kernel is compiled: under the model cache, per source, flags and torch version, and per the paths
    torch's build file names (the sources' and torch's headers': two checkouts or virtual environments sharing a
    cache would otherwise rebuild the one folder in turn, each seeing the other's build file)."""
    from .cache import cache_dir

    sources = b"".join(p.read_bytes() for p in sorted(_SOURCE.parent.iterdir()) if p.suffix in (".cpp", ".h"))
    key = hashlib.sha256(sources + f"{' '.join(_FLAGS)}{torch.__version__}{_SOURCE.parent}|{Path(torch.__file__).parent}"
                         .encode()).hexdigest()
    return cache_dir() / "kernels" / f"weight_only-{key[:12]}"


def kernel(*, verbose: bool = False):
    """The compiled kernel module (built on first call, which it says, 85-92 s on two AVX2 cores; later calls load it).
    Raises :class:`ConfigError` where it cannot be built (no C++ compiler, no AVX2 and FMA)."""
    global _kernel, _kernel_error
    if _kernel is not None:
        return _kernel
    if _kernel_error is not None:
        raise ConfigError(_kernel_error)
    from .cpu import cpu_flags

    flags = cpu_flags()
    if flags and not {"avx2", "fma"} <= flags:
        _kernel_error = "the weight-only kernel needs a CPU with AVX2 and FMA; this one has neither"
        raise ConfigError(_kernel_error)
    from torch.utils.cpp_extension import load

    from ..progress import heartbeat, note
    from .cache import build_lock

    d = build_dir()
    try:
        with build_lock(d, "the weight-only kernel", stale=("lock",)):  # torch's lock waits forever on a dead builder
            fresh, t0 = not any(d.glob("*.so")), time.perf_counter()
            if fresh:
                note("compiling the project's C++ kernels (models/csrc; about a minute and a half on two cores, the "
                     "first time and after a change of their sources)")
            with heartbeat("compiling the C++ kernels"):
                _kernel = load("thesis_weight_only", [str(p) for p in _SOURCES], extra_cflags=_FLAGS,
                               extra_ldflags=["-fopenmp"], build_directory=str(d), verbose=verbose)
            if fresh:
                note(f"C++ kernels ready in {time.perf_counter() - t0:.0f} s")
    except (OSError, RuntimeError, ImportError) as e:  # no compiler, no ninja, a failed build
        _kernel_error = f"the weight-only kernel could not be built ({type(e).__name__}: {str(e).splitlines()[0]})"
        raise ConfigError(_kernel_error) from e
    return _kernel


def path_arg() -> int:
    """The kernel's path argument: 0, this CPU's best; 1, AVX2 (forced by :data:`FORCED_PATH_ENV`)."""
    import os

    forced = os.environ.get(FORCED_PATH_ENV, "").lower()
    if forced not in ("", "avx2"):
        raise ConfigError(f"{FORCED_PATH_ENV}={forced!r}: the only path that can be forced is avx2.")
    return 1 if forced == "avx2" else 0


def kernel_path(fmt: str = "int8-weights") -> str:
    """Which of the kernel's paths runs ``fmt`` here: "AVX-512" (or "AVX-512 VNNI" for ``int8-dynamic``) or "AVX2"
    (the CPU's, or the one forced)."""
    k = kernel()
    if path_arg():
        return "AVX2"
    if fmt in DYNAMIC:
        return "AVX-512 VNNI" if k.vnni_path() else "AVX2"
    return "AVX-512" if k.avx512_path() else "AVX2"


def available() -> bool:
    """Whether the kernel is built or can be built here (building it if need be)."""
    try:
        kernel()
    except ConfigError:
        return False
    return True


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (int8 ``[N, K]``, float32 scale ``[N]``): each row divided by its largest magnitude over
    127 and rounded to the nearest integer (symmetric; a row of zeros gets scale 1)."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class WeightOnlyLinear(nn.Module):
    """``y = x @ (W * scale).T + b`` with W held in bfloat16 or int8 in the kernel's block layout (for
    ``int8-dynamic``, x rounded per block of 32 first; the products in float32 otherwise).
    ``keep_weight`` keeps W's dense bfloat16 rows too (an output layer: the FlashHead clustering and its candidate
    rows are read from them)."""

    def __init__(self, linear: nn.Linear, fmt: str, keep_weight: bool = False):
        super().__init__()
        if fmt not in FORMATS:
            raise ConfigError(f"Unknown weight-only format {fmt!r}: use one of {', '.join(FORMATS)}.")
        k = kernel()
        w = linear.weight.detach()
        self.in_features, self.out_features, self.fmt = linear.in_features, linear.out_features, fmt
        if self.in_features % WIDTH[fmt]:
            raise ConfigError(f"{fmt} layers need an input width divisible by {WIDTH[fmt]}, got {self.in_features}.")
        if fmt == "int4-dynamic":
            packed, scale = pack_int4(*quantize_int4(w))
        else:
            if fmt == "bfloat16-weights":
                q, scale = w.to(torch.bfloat16), None
            else:
                q, scale = quantize_int8(w)
            packed = (k.pack_dynamic if fmt == "int8-dynamic" else k.pack)(q.contiguous())
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.path = path_arg()
        bias = linear.bias
        self.register_buffer("packed_bias", None if bias is None else bias.detach().float().clone(), persistent=False)
        # a plain attribute, not a buffer: model.float() must not make it a float32 copy. Its own storage: a view of
        # the loaded weights would keep the whole memory-mapped checkpoint file mapped and resident
        self.dense_weight = w.to(torch.bfloat16, copy=True) if keep_weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()
        with torch.no_grad():
            if self.fmt in DYNAMIC:
                fn = kernel().linear_dynamic if self.fmt == "int8-dynamic" else kernel().linear_dynamic4
                y = fn(x2, self.packed_weight, self.out_features, self.scale, self.packed_bias, self.path)
            else:
                y = kernel().linear(x2, self.packed_weight, self.out_features, self.scale, self.packed_bias,
                                    self.path)
        return y.reshape(*lead, self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight in float32 (kept rows, else unpacked from the block layout)."""
        if self.dense_weight is not None:
            return self.dense_weight.float()
        return unpack(self.packed_weight, self.out_features, self.in_features, self.scale, self.fmt)

    def weight_bytes(self) -> int:
        """Bytes of weights one product reads (the packed block layout, scales included)."""
        n = self.packed_weight.numel() * self.packed_weight.element_size()
        return n + (0 if self.scale is None else self.scale.numel() * self.scale.element_size())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.fmt}"


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (int8 levels -7..7 ``[N, K]``, bfloat16 scales ``[N, K / 32]``): each block of 32 inputs of
    a row divided by its scale, its largest magnitude over 7 rounded to bfloat16, and rounded to the nearest integer
    within -7..7 (a block of zeros: scale 1)."""
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // 32, 32)
    scale = (blocks.abs().amax(dim=2) / 7).to(torch.bfloat16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / scale.float()[..., None]).clamp_(-7, 7).to(torch.int8)
    return q.reshape(n, k), scale


def pack_int4(levels: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels ``[N, K]`` (-7..7) and bfloat16 scales ``[N, K / 32]`` -> the kernel's int4-dynamic layout: nibbles level + 8,
    per group of 32 outputs and 4 inputs 64 bytes (low nibbles outputs 0-15, high 16-31), ``[N/32 * K * 16]``
    bytes; the scales as ``[N/32][K/32][32]`` (rows past N: level 0, scale 0)."""
    n, k = levels.shape
    rows = -(-n // 32) * 32
    u = torch.full((rows, k), 8, dtype=torch.uint8)
    u[:n] = (levels.to(torch.int16) + 8).to(torch.uint8)
    s = torch.zeros(rows, k // 32, dtype=torch.bfloat16)
    s[:n] = scale
    u = u.view(rows // 32, 2, 16, k // 4, 4).permute(0, 3, 1, 2, 4)  # [G, K/4, 2, 16, 4]
    packed = (u[:, :, 0] | (u[:, :, 1] << 4)).contiguous().view(-1)
    return packed, s.view(rows // 32, 32, k // 32).permute(0, 2, 1).contiguous().view(-1)


def unpack(packed: torch.Tensor, n: int, k: int, scale: torch.Tensor | None = None,
           fmt: str = "int8-weights") -> torch.Tensor:
    """The inverse of the kernel's ``pack`` (``pack_dynamic`` for ``int8-dynamic``, :func:`pack_int4` for
    ``int4-dynamic``): ``[N, K]`` float32 (times ``scale`` per row for int8, per row and block for int4)."""
    if fmt == "int4-dynamic":
        rows, nb = -(-n // 32) * 32, k // 32
        nib = packed.view(rows // 32, k // 4, 16, 4)
        u = torch.stack([nib & 0x0F, nib >> 4], dim=2)  # [G, K/4, 2, 16, 4]
        levels = u.permute(0, 2, 3, 1, 4).reshape(rows, k)[:n].float() - 8
        s = scale.view(rows // 32, nb, 32).permute(0, 2, 1).reshape(rows, nb)[:n].float()
        return (levels.view(n, nb, 32) * s[..., None]).view(n, k)
    if fmt == "int8-dynamic":
        rows = -(-n // 32) * 32
        levels = (packed ^ 0x80).view(torch.int8)
        w = levels.view(rows // 32, k // 4, 32, 4).permute(0, 2, 1, 3).reshape(rows, k)[:n].float()
        return w * scale[:, None]
    rows = -(-n // 4) * 4
    w = packed.view(rows // 4, k // 16, 4, 16).permute(0, 2, 1, 3).reshape(rows, k)[:n].float()
    return w if scale is None else w * scale[:, None]


def head_format(fmt: str, head_rows: bool = True) -> str:
    """The output layer's format in a model converted to ``fmt``: ``bfloat16-weights`` where its dense rows are kept
    (a draft's), else the body's (``int8-dynamic`` for either dynamic format: a 4-bit head would cost accuracy)."""
    if head_rows:
        return "bfloat16-weights"
    return "int8-dynamic" if fmt in DYNAMIC else fmt


def convert(model: nn.Module, fmt: str, head_rows: bool = True) -> int:
    """Swap every CPU ``nn.Linear`` below ``model`` for a :class:`WeightOnlyLinear` of ``fmt`` (the output layer in
    :func:`head_format`, its dense bfloat16 rows kept where ``head_rows``), cast every other parameter and buffer to
    float32, and return how many layers were swapped. A head tied to the input embedding is swapped like the body's
    layers (``fmt``, no dense rows kept); the embedding it was tied to stays float32 for the lookup."""
    from .packing import release_freed_memory

    if fmt not in FORMATS:
        raise ConfigError(f"Unknown weight-only format {fmt!r}: use one of {', '.join(FORMATS)}.")
    kernel()  # a clear error before any layer changes
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    out = get_out() if get_out is not None else None
    tied = out is not None and get_in is not None and get_in() is not None and out.weight is get_in().weight
    count = _swap(model, fmt, None if tied else out, head_rows)
    for m in model.modules():
        if isinstance(m, WeightOnlyLinear):
            continue
        for name, p in m.named_parameters(recurse=False):
            if p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
        for name, b in m.named_buffers(recurse=False):
            if b is not None and b.is_floating_point() and b.dtype != torch.float32:
                m._buffers[name] = b.float()
    if hasattr(model, "config"):
        model.config.dtype = torch.float32
    release_freed_memory()
    return count


def _swap(module: nn.Module, fmt: str, head: nn.Module | None, head_rows: bool) -> int:
    count = 0
    for name, child in list(module.named_children()):
        layer_fmt = head_format(fmt, head_rows) if child is head else fmt
        if isinstance(child, nn.Linear) and child.weight.device.type == "cpu" and child.in_features % WIDTH[layer_fmt] == 0:
            setattr(module, name, WeightOnlyLinear(child, layer_fmt, keep_weight=child is head and head_rows))
            count += 1
        else:
            count += _swap(child, fmt, head, head_rows)
    return count
