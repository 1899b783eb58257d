"""What this machine's CPU is and can do: its name, and whether it has native bfloat16 dot products.

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
