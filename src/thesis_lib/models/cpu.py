"""This CPU's name, its feature flags, whether it has native bfloat16 dot products, and whether the project has
measured a block's rows to equal single rows on this kind of CPU (:func:`rows_exact_expected`). The answers choose
kernels and precision elsewhere (:mod:`~thesis_lib.models.auto`) and are recorded with every run.
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


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def rows_exact_expected(dtype: torch.dtype) -> bool:
    """Whether this project has measured packed layers of ``dtype`` on this kind of CPU to compute every row of a
    block as they compute it alone (at the loader's rows floor), so that a failing probe here is a fault to report,
    not a fact of the machine: bfloat16 where the CPU has native bf16 (the AVX-512 BF16 EPYC, the AMX Xeon); float32
    on AVX2-only CPUs (the AVX2 EPYC) and on CPUs with AMX (the AMX Xeon). Elsewhere (an AVX-512 CPU without AMX in
    float32, for one) it is not known, and a failing probe is reported, not treated as a fault."""
    if dtype == torch.bfloat16:
        return fast_bf16()
    if dtype != torch.float32:
        return False
    flags = cpu_flags()
    return "amx_bf16" in flags or ("avx2" in flags and "avx512f" not in flags)
