"""oneDNN-prepacked linear layers for CPU inference.

Why this exists (measured on this project's 2-core AVX-512 machine, one 8960 x 1536 fp32 weight): the
stock ``F.linear`` path costs 3.4 ms for one row but 9.2 ms for five rows, because the GEMM re-packs the
whole weight matrix on every call, while a weight packed once into oneDNN's blocked layout costs 2.4 ms for
one row and 3.0 ms for five. A speculative round verifies K + 1 rows at once, so on CPU the packed layout
turns block verification from "about two single steps" into "about one and a quarter": the property
speculative decoding relies on, and the one the thesis' GPU already had.

:func:`pack_linears` swaps every float32 ``nn.Linear`` of a model (body and output head, unless the head is
tied to the input embedding) for :class:`PackedLinear`, which keeps only the packed copy. The pages of the
memory-mapped safetensors file a packed weight came from leave the process' resident memory as soon as it is
packed, so the process holds the packed model once (the embedded pair: 16.5 GB peak before this, 9.0 GB
after, measured loading both models). Outputs equal the dense layer's up to float rounding. It changes the
kernels, not the model: every mode, transformers' ``generate()`` included, runs on the same packed layers
(and ``generate()`` never reads the ``weight`` property, which would make a dense copy).
"""

from __future__ import annotations

import torch
from torch import nn


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with W held in oneDNN's packed layout (CPU, float32)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.register_buffer("packed_weight", w.float().to_mkldnn(), persistent=False)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.register_buffer("packed_bias", bias.to_mkldnn(), persistent=False)
        self.out_dtype = w.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().to_mkldnn()
        y = torch._C._nn.mkldnn_linear(x2, self.packed_weight, self.packed_bias).to_dense()
        return y.reshape(*lead, self.out_features).to(self.out_dtype)

    @property
    def weight(self) -> torch.Tensor:
        """A dense copy of the weight (made on demand; e.g. for building a FlashHead clustering)."""
        return self.packed_weight.to_dense().to(self.out_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def is_packed(module: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in module.modules())


def pack_linears(module: nn.Module) -> int:
    """Replace every float32 ``nn.Linear`` below ``module`` (on CPU) by a :class:`PackedLinear`; return how many.

    A head tied to the input embedding stays as it is (packing it would keep a second copy of the embedding).
    Pages of a memory-mapped safetensors file that a packed weight came from leave the resident set as soon as
    it is packed, and freed heap memory is handed back afterwards (:func:`release_freed_memory`): the process
    holds the packed model, not the model twice."""
    skip = frozenset()
    get_in, get_out = getattr(module, "get_input_embeddings", None), getattr(module, "get_output_embeddings", None)
    if get_in is not None and get_out is not None and get_in() is not None and get_out() is not None \
            and get_out().weight is get_in().weight:
        skip = frozenset({id(get_out().weight)})
    count = _pack(module, skip=skip)
    release_freed_memory()
    return count


def _pack(module: nn.Module, maps: list | None = None, skip: frozenset = frozenset()) -> int:
    maps = _file_maps() if maps is None else maps
    count = 0
    for name, child in list(module.named_children()):
        if (isinstance(child, nn.Linear) and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"
                and id(child.weight) not in skip):
            setattr(module, name, PackedLinear(child))
            _drop_file_pages(child.weight, maps)
            count += 1
        else:
            count += _pack(child, maps, skip)
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


def _drop_file_pages(t: torch.Tensor, maps: list[tuple[int, int]]) -> None:
    """If ``t`` lies in a private mapping of a safetensors file, tell the kernel its pages are not needed
    (``MADV_DONTNEED``): they leave this process' resident memory now, not when the whole file is unmapped.
    Only whole pages inside ``t`` of a file mapping qualify: touched again they are read back from the file,
    and ``t`` is no longer used once packed; anonymous memory is never advised (it would lose its contents)."""
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
            ctypes.CDLL(None).madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), 4)  # 4: MADV_DONTNEED
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
