"""oneDNN-prepacked linear layers for CPU inference, in float32 or bfloat16.

Why this exists (measured on this project's 2-core AVX-512 machine, one 8960 x 1536 fp32 weight): the
stock ``F.linear`` path costs 3.4 ms for one row but 9.2 ms for five rows, because the GEMM re-packs the
whole weight matrix on every call, while a weight packed once for oneDNN (then in the one-row layout,
``"row"`` below) costs 2.4 ms for one row and 3.0 ms for five. A speculative round verifies K + 1 rows at once, so on CPU the packed layout
turns block verification from "about two single steps" into "about one and a quarter": the property
speculative decoding relies on, and the one the thesis' GPU already had.

Which packed layout (:data:`LAYOUTS`) matters as much as packing. ``"block"`` (the default, every precision) is
oneDNN's ``_reorder_linear_weight`` without a batch hint, the layout oneDNN picks for a general number of rows;
``"row"`` (float32 only, this module's float32 layout until 2026-11-24) is ``Tensor.to_mkldnn``, a layout for one
row. On the 2-core AVX2 EPYC (Zen, family 23), one target layer's seven products cost 5.2 ms for one row in the
``row`` layout and 12.6 ms for five (2.4x), in the ``block`` layout 5.5 ms and 7.7 ms (1.4x): a verified block
of five turns from "two and a half steps" into "one and a half" for 6 % more per single row (the draft's layer:
2.2 / 4.4 ms against 2.1 / 2.7 ms). ``thesis-lib precision-bench --precisions float32,float32-row`` measures the two
side by side on whole models.

:func:`pack_linears` swaps every float32 or bfloat16 ``nn.Linear`` of a model for :class:`PackedLinear`, which
keeps only the packed copy. A float32 head tied to the input embedding stays as it is (a packed copy would hold
the embedding twice); a bfloat16 tied head (Qwen3-0.6B's, say: 0.31 GB) is packed as a copy beside the
embedding, because there the copy pays: a 151936 x 896 head costs 6.0 ms per greedy call packed against 9.6 ms
with ``F.linear`` (bf16, one row; 13.0 / 33.0 ms in float32), measured on the 2-core AVX-512 BF16 EPYC. Every
bfloat16 output layer keeps its dense rows beside the packed copy (the embedded pair's untied heads: 0.47 GB for
the 1.5B target, 0.27 GB for the 0.5B draft): the greedy head re-scores its few near-tied candidates from them
(:class:`thesis_lib.heads.dense.DenseGreedyHead`).

bfloat16 packing (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``) needs a CPU with native
bf16 dot products (:func:`bf16_packing_available`); on the 1.5B target it makes one decode step 2 to 2.8 times
faster than packed float32 (then in the one-row layout; not re-measured there against the general one) and keeps verification of a 5-token block at about one step's cost (issue 19). The pages of the
memory-mapped safetensors file a packed weight came from leave the process' resident memory as soon as it is
packed, so the process holds the packed model once (the embedded pair: 16.5 GB peak before this, 9.0 GB
after, measured loading both models). Outputs equal the dense layer's up to float rounding. It changes the
kernels, not the model: every mode, transformers' ``generate()`` included, runs on the same packed layers
(and ``generate()`` never reads the ``weight`` property, which would make a dense copy).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


#: the packed layouts: "block" (oneDNN's general layout, float32 and bfloat16) and "row" (float32, one-row layout)
LAYOUTS = ("block", "row")
#: The fewest rows a bfloat16 product is computed with: a product of fewer rows (a one-token step, a short verified
#: block) is padded with zero rows to this many and the padding's outputs dropped. Why (measured 2026-11-24 on the
#: 2-core AVX-512 BF16 EPYC, oneDNN 3.12's ``brg_matmul:avx512_core_bf16``, the 1.5B target's 196 body products,
#: medians of 9 interleaved passes): one row costs 103 ms, two 113, five 87 (0.85 of one row), nine 108; so the
#: kernel reads the weights faster for 4 to 6 rows than for one or two, and a padded one-token step of the whole
#: target took 135 ms against 158 unpadded (0.86x; the draft's 50 against 53). Padded, the bf16 kernels also
#: compute each row of a block of 2 to 13 rows bit for bit as that row alone (:func:`thesis_lib.models.attention.rows_exact`
#: on both embedded models: unpadded they did not), so with row-exact attention a verified block equals one-token steps
#: in bf16 too. ``precision-bench --precisions bfloat16,bfloat16-unpadded`` measures the two side by side on whole
#: models. float32 products: :data:`F32_ROWS_FLOOR_AVX512`.
BF16_ROWS_FLOOR = 5
#: The same for float32 products on a CPU whose kernels are AVX-512 ones (:func:`float32_rows_floor`; 1, no padding,
#: elsewhere). Why (measured 2026-11-25 on the same EPYC, the target's 196 body products in float32, 5.24 GB, oneDNN's
#: general layout, medians of 9 interleaved passes): one row 197 ms, two 229, four 145, five 136 (0.69 of one row),
#: nine 197. On the 2-core AVX2 EPYC (family 23) one target layer's products cost 5.5 ms for one row and 7.7 ms for
#: five in the same layout, so there a padded one-token step would be 1.4 times slower: the floor follows the CPU.
F32_ROWS_FLOOR_AVX512 = 5


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available()


def bf16_packing_available() -> bool:
    """Whether oneDNN runs bfloat16 linear layers natively here (AVX-512 BF16 or AMX); without it they are
    emulated, 3 to 6 times slower than float32 on an AVX-512 Xeon this project ran on."""
    if not packing_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with W held in oneDNN's packed layout (CPU; float32 or bfloat16, the layer's own).

    ``keep_weight`` keeps the dense weight too (a head tied to the input embedding: :attr:`weight` then returns
    the embedding itself, no copy). ``layout``: one of :data:`LAYOUTS` ("row" is for float32 only). ``min_rows``
    ("block" layout): a product of fewer rows is computed padded with zero rows to this many (:data:`BF16_ROWS_FLOOR`);
    each row's output is the same whatever the other rows hold, so padding changes which kernel runs, not the model."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False, layout: str = "block", min_rows: int = 1):
        super().__init__()
        w = linear.weight.detach()
        check_layout(layout, w.dtype)
        if min_rows < 1:
            raise ConfigError(f"min_rows must be >= 1, got {min_rows}.")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # the one-row layout computes one row at a time, so padding has no meaning there
        self.out_dtype, self.layout, self.min_rows = w.dtype, layout, min_rows if layout == "block" else 1
        # the tied Parameter itself (a plain attribute, so that it is not registered a second time)
        object.__setattr__(self, "dense_weight", linear.weight if keep_weight else None)
        if layout == "block":
            self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(w, None), persistent=False)
            self.register_buffer("packed_bias", None if linear.bias is None else linear.bias.detach().clone(),
                                 persistent=False)
        else:
            self.register_buffer("packed_weight", w.float().to_mkldnn(), persistent=False)
            bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
            self.register_buffer("packed_bias", bias.to_mkldnn(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.layout == "block":
            rows = x2.shape[0]
            # Under autograd these oneDNN calls are ~100x slower (measured: 66 ms instead of 0.6 ms per layer),
            # and inference never needs their gradients.
            with torch.no_grad():
                x2 = x2.to(self.out_dtype)
                if rows < self.min_rows:
                    x2 = torch.cat([x2, x2.new_zeros(self.min_rows - rows, self.in_features)])
                y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.packed_weight, self.packed_bias,
                                                       "none", [], "")
            return y[:rows].reshape(*lead, self.out_features)
        y = torch._C._nn.mkldnn_linear(x2.float().to_mkldnn(), self.packed_weight, self.packed_bias).to_dense()
        return y.reshape(*lead, self.out_features).to(self.out_dtype)

    def packed_bias_dense(self) -> torch.Tensor | None:
        """The bias as a plain tensor (None without one; float32 layers in the one-row layout hold a zero bias when
        there is none)."""
        if self.packed_bias is None:
            return None
        return self.packed_bias.to_dense() if self.packed_bias.is_mkldnn else self.packed_bias

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight: the kept one, else a copy made on demand (e.g. for building a FlashHead clustering)."""
        if self.dense_weight is not None:
            return self.dense_weight
        return self.packed_weight.to_dense().to(self.out_dtype)

    def extra_repr(self) -> str:
        pad = f", products of fewer than {self.min_rows} rows padded" if self.min_rows > 1 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"packed=oneDNN {str(self.out_dtype).replace('torch.', '')} {self.layout} layout{pad}")


def check_layout(layout: str, dtype: torch.dtype = torch.float32) -> None:
    """Refuse an unknown layout, or the one-row layout for a layer that is not float32."""
    if layout not in LAYOUTS:
        raise ConfigError(f"Unknown packed layout {layout!r}: use one of {', '.join(LAYOUTS)}.")
    if layout == "row" and dtype != torch.float32:
        raise ConfigError(f"The one-row packed layout is for float32 layers, not {str(dtype).replace('torch.', '')}.")


def layout_for(dtype: torch.dtype, layout: str) -> str:
    """The layout a layer of ``dtype`` is packed in when ``layout`` is asked for: bfloat16 layers always "block"."""
    return layout if dtype == torch.float32 else "block"


def layer_bias(layer: nn.Module) -> torch.Tensor | None:
    """An output layer's bias as a plain tensor, packed or not (a packed layer's ``bias`` attribute does not exist:
    its bias lives beside the packed weight)."""
    if isinstance(layer, PackedLinear):
        return layer.packed_bias_dense()
    return getattr(layer, "bias", None)


def is_packed(module: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in module.modules())


def float32_rows_floor() -> int:
    """The fewest rows a packed float32 product computes with on this CPU: :data:`F32_ROWS_FLOOR_AVX512` where
    torch dispatches AVX-512 kernels (``torch.backends.cpu.get_cpu_capability()``), else 1 (AVX2 and others:
    a one-row product is the cheapest there)."""
    return F32_ROWS_FLOOR_AVX512 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 1


def rows_floor(dtype: torch.dtype, floor: int | None = None) -> int:
    """The fewest rows a packed layer of ``dtype`` computes with: ``floor`` if given, else bfloat16
    :data:`BF16_ROWS_FLOOR` and float32 :func:`float32_rows_floor`; other dtypes 1."""
    if floor is not None and floor < 1:
        raise ConfigError(f"The rows floor must be >= 1, got {floor}.")
    if dtype not in (torch.bfloat16, torch.float32):
        return 1
    if floor is not None:
        return floor
    return BF16_ROWS_FLOOR if dtype == torch.bfloat16 else float32_rows_floor()


def pack_linears(module: nn.Module, layout: str = "block", floor: int | None = None) -> int:
    """Replace every float32 (and, where :func:`bf16_packing_available`, bfloat16) ``nn.Linear`` below
    ``module`` (on CPU) by a :class:`PackedLinear`; return how many.

    A float32 head tied to the input embedding stays as it is (packing it would keep a second copy of the
    embedding); a bfloat16 one is packed beside the embedding it shares (see the module's docstring).
    Pages of a memory-mapped safetensors file that a packed weight came from leave the resident set as soon as
    it is packed, and freed heap memory is handed back afterwards (:func:`release_freed_memory`): the process
    holds the packed model, not the model twice. The input embedding's pages and a bf16 head's dense rows' leave
    too (file-backed and never written, they are read back as rows are touched). ``layout``: see :data:`LAYOUTS`
    (bfloat16 layers always take "block"). ``floor``: the fewest rows per product of a layer in the "block" layout
    (:func:`rows_floor`; None: its dtype's default on this CPU)."""
    check_layout(layout)
    rows_floor(torch.bfloat16, floor)
    keep = frozenset()  # weights whose dense tensor stays beside the packed copy
    get_in, get_out = getattr(module, "get_input_embeddings", None), getattr(module, "get_output_embeddings", None)
    out = get_out() if get_out is not None else None
    if get_in is not None and out is not None and get_in() is not None and out.weight is get_in().weight:
        keep = frozenset({id(out.weight)})
    elif out is not None and isinstance(out, nn.Linear) and out.weight.dtype == torch.bfloat16:
        keep = frozenset({id(out.weight)})  # a bf16 head keeps its dense rows too: the greedy head refines with them
    dtypes = {torch.float32} | ({torch.bfloat16} if bf16_packing_available() else set())
    maps = _file_maps()
    count = _pack(module, maps, keep, dtypes, layout, floor)
    if count and get_in is not None and get_in() is not None:
        # Read a few rows at a time (a token's embedding; a bf16 head's near-tied candidates, re-scored from its
        # dense rows): their pages come back from the file as they are touched. The 1.5B target in bf16: 3.87 ->
        # 3.44 GiB resident after a 16-token greedy decode, the same tokens after (measured 2026-11-24).
        emb = get_in().weight
        tied = out is not None and out.weight is emb
        if not (tied and emb.dtype == torch.float32):  # a float32 tied head reads every row at every step
            _drop_file_pages(emb, maps, in_use=True)
        if out is not None and not tied and isinstance(get_out(), PackedLinear) and id(out.weight) in keep:
            _drop_file_pages(out.weight, maps, in_use=True)
    release_freed_memory()
    return count


def _pack(module: nn.Module, maps: list, keep: frozenset, dtypes: set, layout: str, floor: int | None) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if (isinstance(child, nn.Linear) and child.weight.dtype in dtypes and child.weight.device.type == "cpu"
                and type(child.weight.detach()) is torch.Tensor):  # not a quantised tensor subclass (torchao)
            kept = id(child.weight) in keep
            if kept and child.weight.dtype == torch.float32:
                continue  # a tied float32 head: F.linear on the embedding, no second copy
            dtype = child.weight.dtype
            setattr(module, name, PackedLinear(child, keep_weight=kept, layout=layout_for(dtype, layout),
                                               min_rows=rows_floor(dtype, floor)))
            if not kept:
                _drop_file_pages(child.weight, maps)
            count += 1
        else:
            count += _pack(child, maps, keep, dtypes, layout, floor)
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
