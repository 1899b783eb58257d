"""oneDNN-prepacked linear layers for CPU inference, in float32 or bfloat16.

The stock ``F.linear`` re-packs the whole weight on every call, so on CPU a product of five rows costs far more
than one of one row; a weight packed once in oneDNN's general layout (``_reorder_linear_weight``, no batch hint)
makes a verified block of K + 1 rows cost little more than a one-token step, the property speculative decoding
relies on (the measurement log, ``docs/measurements.md``, has the figures per CPU).

:func:`pack_linears` swaps every float32 or bfloat16 ``nn.Linear`` of a model for :class:`PackedLinear`, which
keeps only the packed copy. A float32 head tied to the input embedding stays as it is (a packed copy would hold
the embedding twice); a bfloat16 tied head is packed as a copy beside the embedding, because there the copy
pays. Every bfloat16 output layer keeps its dense rows beside the packed copy: the greedy head re-scores its few
near-tied candidates from them (:class:`thesis_lib.heads.dense.DenseGreedyHead`).

A product of fewer rows than :func:`rows_floor` is computed padded with zero rows (each row's output does not
depend on the others, so padding changes which kernel runs, not the model): oneDNN's AVX-512 kernels read the
weights faster for about five rows than for one, and padded they compute each row of a block bit for bit as that
row alone. bfloat16 packing needs native bf16 dot products (:func:`bf16_packing_available`). The pages of the
memory-mapped safetensors file a packed weight came from leave the process' resident memory once it is packed, so
the process holds the packed model once. Every mode, transformers' ``generate()`` included, runs on the same
packed layers (and ``generate()`` never reads the ``weight`` property, which would make a dense copy).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import at_least

#: The fewest rows a packed bfloat16 product computes with (fewer are padded with zero rows).
BF16_ROWS_FLOOR = 5
#: The same for float32 where torch runs AVX-512 kernels (:func:`float32_rows_floor`; elsewhere 1, no padding:
#: on AVX2 a one-row product is the cheapest).
F32_ROWS_FLOOR_AVX512 = 5


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available()


def bf16_packing_available() -> bool:
    """Whether oneDNN runs bfloat16 linear layers natively here (AVX-512 BF16 or AMX); without it they are
    emulated, several times slower than float32."""
    if not packing_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with W held in oneDNN's packed layout (CPU; float32 or bfloat16, the layer's own).

    ``keep_weight`` keeps the dense weight too (a head tied to the input embedding: :attr:`weight` then returns
    the embedding itself, no copy). ``min_rows``: a product of fewer rows is computed padded with zero rows to this
    many (:func:`rows_floor`)."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False, min_rows: int = 1):
        super().__init__()
        w = linear.weight.detach()
        at_least("min_rows", min_rows)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype, self.min_rows = w.dtype, min_rows
        # the tied Parameter itself (a plain attribute, so that it is not registered a second time)
        object.__setattr__(self, "dense_weight", linear.weight if keep_weight else None)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(w, None), persistent=False)
        self.register_buffer("packed_bias", None if linear.bias is None else linear.bias.detach().clone(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        with torch.no_grad():  # under autograd these oneDNN calls are about 100x slower, and inference needs none
            x2 = x2.to(self.out_dtype)
            if rows < self.min_rows:
                x2 = torch.cat([x2, x2.new_zeros(self.min_rows - rows, self.in_features)])
            y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.packed_weight, self.packed_bias, "none", [], "")
        return y[:rows].reshape(*lead, self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight: the kept one, else a copy made on demand (e.g. for building a FlashHead clustering)."""
        if self.dense_weight is not None:
            return self.dense_weight
        return self.packed_weight.to_dense().to(self.out_dtype)

    def extra_repr(self) -> str:
        pad = f", products of fewer than {self.min_rows} rows padded" if self.min_rows > 1 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"packed=oneDNN {str(self.out_dtype).replace('torch.', '')} block layout{pad}")


def layer_bias(layer: nn.Module) -> torch.Tensor | None:
    """An output layer's bias as a plain tensor, packed or not (a packed layer's ``bias`` attribute does not exist:
    its bias lives beside the packed weight)."""
    if isinstance(layer, PackedLinear) or hasattr(layer, "packed_bias"):  # also a weight-only layer
        return layer.packed_bias
    return getattr(layer, "bias", None)


def is_packed(module: nn.Module) -> bool:
    """Whether ``module`` computes with prepacked layers (oneDNN's or the weight-only kernel's)."""
    return any(isinstance(m, PackedLinear) or hasattr(m, "packed_weight") for m in module.modules())


def float32_rows_floor() -> int:
    """The fewest rows a packed float32 product computes with on this CPU: :data:`F32_ROWS_FLOOR_AVX512` where
    torch dispatches AVX-512 kernels (``torch.backends.cpu.get_cpu_capability()``), else 1 (AVX2 and others:
    a one-row product is the cheapest there)."""
    return F32_ROWS_FLOOR_AVX512 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 1


def rows_floor(dtype: torch.dtype) -> int:
    """The fewest rows a packed layer of ``dtype`` computes with: bfloat16 :data:`BF16_ROWS_FLOOR`, float32
    :func:`float32_rows_floor`, other dtypes 1."""
    if dtype == torch.bfloat16:
        return BF16_ROWS_FLOOR
    return float32_rows_floor() if dtype == torch.float32 else 1


def pack_linears(module: nn.Module) -> int:
    """Replace every float32 (and, where :func:`bf16_packing_available`, bfloat16) ``nn.Linear`` below
    ``module`` (on CPU) by a :class:`PackedLinear`; return how many.

    A float32 head tied to the input embedding stays as it is (packing it would keep a second copy of the
    embedding); a bfloat16 one is packed beside the embedding it shares (see the module's docstring).
    Pages of a memory-mapped safetensors file that a packed weight came from leave the resident set as soon as
    it is packed, and freed heap memory is handed back afterwards (:func:`release_freed_memory`): the process
    holds the packed model, not the model twice. The input embedding's pages and a bf16 head's dense rows' leave
    too (file-backed and never written, they are read back as rows are touched). Each layer computes with at
    least :func:`rows_floor` rows of its dtype."""
    keep = frozenset()  # weights whose dense tensor stays beside the packed copy
    get_in, get_out = getattr(module, "get_input_embeddings", None), getattr(module, "get_output_embeddings", None)
    out = get_out() if get_out is not None else None
    if get_in is not None and out is not None and get_in() is not None and out.weight is get_in().weight:
        keep = frozenset({id(out.weight)})
    elif out is not None and isinstance(out, nn.Linear) and out.weight.dtype == torch.bfloat16:
        keep = frozenset({id(out.weight)})  # a bf16 head keeps its dense rows too: the greedy head refines with them
    dtypes = {torch.float32} | ({torch.bfloat16} if bf16_packing_available() else set())
    maps = _file_maps()
    count = _pack(module, maps, keep, dtypes)
    if count and get_in is not None and get_in() is not None:
        # Read a few rows at a time (a token's embedding; a bf16 head's near-tied candidates, re-scored from its
        # dense rows): their pages come back from the file as they are touched.
        emb = get_in().weight
        tied = out is not None and out.weight is emb
        if not (tied and emb.dtype == torch.float32):  # a float32 tied head reads every row at every step
            _drop_file_pages(emb, maps, in_use=True)
        if out is not None and not tied and isinstance(get_out(), PackedLinear) and id(out.weight) in keep:
            _drop_file_pages(out.weight, maps, in_use=True)
    release_freed_memory()
    return count


def _pack(module: nn.Module, maps: list, keep: frozenset, dtypes: set) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if (isinstance(child, nn.Linear) and child.weight.dtype in dtypes and child.weight.device.type == "cpu"
                and type(child.weight.detach()) is torch.Tensor):  # not a quantised tensor subclass (torchao)
            kept = id(child.weight) in keep
            if kept and child.weight.dtype == torch.float32:
                continue  # a tied float32 head: F.linear on the embedding, no second copy
            setattr(module, name, PackedLinear(child, keep_weight=kept, min_rows=rows_floor(child.weight.dtype)))
            if not kept:
                _drop_file_pages(child.weight, maps)
            count += 1
        else:
            count += _pack(child, maps, keep, dtypes)
    return count


def _file_maps() -> list[tuple[int, int]]:
    """Address ranges of this process' private (copy-on-write) mappings of ``.safetensors`` files
    (``/proc/self/maps``): safetensors maps its files so."""
    out = []
    try:
        for line in open("/proc/self/maps", encoding="utf-8"):
            parts = line.split()
            if len(parts) >= 6 and parts[-1].endswith(".safetensors") and parts[1].endswith("p"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    except OSError:
        pass
    return out


def _drop_file_pages(t: torch.Tensor, maps: list[tuple[int, int]], in_use: bool = False) -> None:
    """If ``t`` lies in a private mapping of a safetensors file, tell the kernel its pages are not needed
    (``MADV_DONTNEED``): they leave this process' resident memory now, not when the whole file is unmapped.
    Only whole pages inside ``t`` of a file mapping qualify: touched again they are read back from the file,
    and ``t`` is no longer used once packed; anonymous memory is never advised (it would lose its contents).
    ``in_use`` (a tensor still read, a few rows at a time): ``MADV_PAGEOUT`` instead, which reclaims clean file
    pages the same way but never discards a page this process wrote (such a page would go to swap, or stay)."""
    import ctypes
    import os

    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    if not any(lo <= start and end <= hi for lo, hi in maps):
        return
    page = os.sysconf("SC_PAGE_SIZE")
    a, b = -(-start // page) * page, end // page * page
    if b > a:
        try:
            ctypes.CDLL(None).madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), 21 if in_use else 4)  # PAGEOUT, DONTNEED
        except (OSError, AttributeError):
            pass


def release_freed_memory() -> None:
    """Ask glibc to return freed heap memory to the system (``malloc_trim``): after packing, the unpacked
    weights' gigabytes would otherwise stay counted in the process' memory. A no-op without glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass
