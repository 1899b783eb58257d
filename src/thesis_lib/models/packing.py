"""oneDNN-prepacked linear layers for CPU inference.

Why this exists (measured on this project's 2-core AVX-512 machine, one 8960 x 1536 fp32 weight): the
stock ``F.linear`` path costs 3.4 ms for one row but 9.2 ms for five rows, because the GEMM re-packs the
whole weight matrix on every call, while a weight packed once into oneDNN's blocked layout costs 2.4 ms for
one row and 3.0 ms for five. A speculative round verifies K + 1 rows at once, so on CPU the packed layout
turns block verification from "about two single steps" into "about one and a quarter": the property
speculative decoding relies on, and the one the thesis' GPU already had.

:func:`pack_linears` swaps every float32 ``nn.Linear`` of a model (body and output head) for
:class:`PackedLinear`, which keeps only the packed copy: anonymous memory stays about the model's size,
but the pages of a memory-mapped safetensors file that were read while packing stay resident as
(reclaimable) page cache, so RSS can show up to twice the model (measured: 6.4 GB anonymous plus 6.1 GB
file-backed for the 1.5B target). Outputs equal the dense layer's up to float rounding. It changes the
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
    """Replace every float32 ``nn.Linear`` below ``module`` (on CPU) by a :class:`PackedLinear`; return how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
            setattr(module, name, PackedLinear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count
