"""The precisions ``DTYPE: auto`` and ``DRAFT_DTYPE: auto`` pick on this CPU (:func:`auto_precision`,
:func:`draft_precision`), from its facts (:mod:`~thesis_lib.models.cpu`) and from whether the
project's weight-only kernel builds here (:mod:`~thesis_lib.models.weight_only`).
"""

from __future__ import annotations

from .cpu import fast_bf16


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


def draft_precision(dtype: str, draft_dtype: str | None, device: str = "cpu") -> str:
    """The ``dtype`` parameter a draft on ``device`` loads with: ``draft_dtype`` where it names one; "same":
    ``dtype``; "auto" or None: ``int4-dynamic`` on a CPU where ``dtype`` means ``int8-dynamic`` there (the draft's
    body in 4 bits: a cheaper step at about the same acceptance; the measurement log has both), else ``dtype``."""
    if draft_dtype not in (None, "auto"):
        return dtype if draft_dtype == "same" else draft_dtype
    resolved = auto_precision()[0] if dtype == "auto" else dtype
    return "int4-dynamic" if device == "cpu" and resolved == "int8-dynamic" else dtype
