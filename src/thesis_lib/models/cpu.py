"""What this machine's CPU is and can do: its name, whether it has native bfloat16 dot products, and so the
precision ``DTYPE: auto`` picks on it (:func:`auto_dtype`).

The answers choose kernels and precision elsewhere (FlashHead's centroid ranking, the k-means similarities)
and are recorded with every run.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def fast_bf16() -> bool:
    """Whether the CPU has native bfloat16 dot products (AVX-512 BF16), as torch reports it."""
    fn = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(fn and fn())


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def auto_dtype() -> tuple[torch.dtype, str]:
    """The precision ``DTYPE: auto`` runs on this CPU, and why: bfloat16 (oneDNN-packed) where the CPU has
    native bf16 dot products, float32 (oneDNN-packed) elsewhere. On the 2-core AVX-512 BF16 EPYC, packed bf16
    made a 1.5B target's decode step 2x to 2.8x faster than packed float32; on an AVX-512 Xeon without BF16,
    bf16 measured 3 to 6 times slower than float32 (issue 19)."""
    from .packing import bf16_packing_available

    if fast_bf16() and bf16_packing_available():
        return torch.bfloat16, "bfloat16: the CPU has native bf16 dot products (AVX-512 BF16), oneDNN packs bf16"
    if not fast_bf16():
        return torch.float32, "float32: the CPU has no native bf16 dot products (bf16 would be emulated, slower)"
    return torch.float32, "float32: this torch's oneDNN cannot pack bfloat16 layers"
