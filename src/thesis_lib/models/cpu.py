"""This CPU's name, whether it has native bfloat16 dot products, and so the precision ``DTYPE: auto`` picks
(:func:`auto_precision`), and whether the project has measured a block's rows to equal single rows on this kind of CPU
(:func:`rows_exact_expected`). The answers choose kernels and precision elsewhere and are recorded with every run.
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


def auto_precision() -> tuple[str, str]:
    """The precision ``DTYPE: auto`` runs on this CPU, and why. Wherever the project's kernel builds
    (:mod:`~thesis_lib.models.weight_only`), int8 weights, a quarter of float32's bytes and half of bfloat16's: with
    int8 products over activations rounded per block of 32 (``int8-dynamic``) where the CPU has AVX-512 VNNI or no
    AVX-512 at all, else (AVX-512 without VNNI, where int8-dynamic would fall back to AVX2 but int8-weights runs
    AVX-512) with float32 products (``int8-weights``): the faster of the two on each path measured (the
    measurement log). Without the kernel, oneDNN-packed bfloat16 where the CPU has native bf16 dot products, else
    packed float32 (emulated bf16 is slower than float32)."""
    from . import weight_only
    from .packing import bf16_packing_available

    if weight_only.available():
        native = "native bf16 dot products" if fast_bf16() else "no native bf16 dot products"
        path = weight_only.kernel_path("int8-dynamic")
        if path == "AVX-512 VNNI" or weight_only.kernel_path("int8-weights") == "AVX2":
            return "int8-dynamic", (f"int8-dynamic: a decode step reads every weight once; int8 weights (one scale "
                                    f"per row) read a quarter of float32's bytes and half of bfloat16's, and integer "
                                    f"products over activations rounded per block of 32 cost less arithmetic than "
                                    f"float32's, every block's rows exact (this CPU: {path} kernel, {native})")
        return "int8-weights", (f"int8-weights: a decode step reads every weight once, and int8 weights (one scale "
                                f"per row) read a quarter of float32's bytes and half of bfloat16's; this CPU has "
                                f"AVX-512 without VNNI, where float32 products on AVX-512 beat int8 products on "
                                f"AVX2; every block's rows exact ({native})")
    if fast_bf16() and bf16_packing_available():
        return "bfloat16", ("bfloat16: the CPU has native bf16 dot products (AVX-512 BF16), oneDNN packs bf16 "
                            "(the weight-only kernel is not available here)")
    return "float32", ("float32: the CPU has no native bf16 dot products (bf16 would be emulated, slower) and the "
                       "weight-only kernel is not available here")


def auto_dtype() -> tuple[torch.dtype, str]:
    """The activations' dtype of :func:`auto_precision`'s choice (float32 for the weight-only formats), and why."""
    name, why = auto_precision()
    return (torch.bfloat16 if name == "bfloat16" else torch.float32), why


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


def draft_precision(dtype: str, draft_dtype: str | None, device: str = "cpu") -> str:
    """The ``dtype`` parameter a draft on ``device`` loads with: ``draft_dtype`` where it names one; "same":
    ``dtype``; "auto" or None: ``int4-dynamic`` on a CPU where ``dtype`` means ``int8-dynamic`` there (the draft's
    body in 4 bits: a cheaper step at about the same acceptance; the measurement log has both), else ``dtype``."""
    if draft_dtype not in (None, "auto"):
        return dtype if draft_dtype == "same" else draft_dtype
    resolved = auto_precision()[0] if dtype == "auto" else dtype
    return "int4-dynamic" if device == "cpu" and resolved == "int8-dynamic" else dtype
