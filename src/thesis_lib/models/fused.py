"""Fused float32 operations for CPU decoding: fewer, larger operations where eager PyTorch dispatches many small ones.

A decode step of the embedded draft dispatches about 3,300 aten operations, a few microseconds each, over tensors
whose bytes take microseconds to read (the measurement log's step profile, 2026-11-27): an RMS norm is six of
them, the rotary embedding of queries and keys a dozen, one query's attention a repeat of the cache's keys and
values and a scaled-dot-product call. The project's kernel module (:func:`thesis_lib.models.weight_only.kernel`,
``csrc/decode_ops.cpp``) does each in one call:

- :class:`FusedRMSNorm` replaces a model's RMS norms (:func:`use`);
- :func:`rotary` stands in for transformers' ``apply_rotary_pos_emb`` of Qwen2 and Qwen3 (:func:`use` installs it
  for the modelling modules; tensors it does not take go to transformers' own);
- :func:`attend_one` is one query's attention over its keys, which :func:`thesis_lib.models.attention.exact_attention`
  calls for a one-token step and for each query of a verified block alike.

Each computes every row with the same operations in the same order whatever the number of rows, so a verified
block stays equal to one-token steps, bit for bit; the results differ from transformers' in the last bits.
:data:`ENABLED` switches them off and on at run time for side-by-side measurement (:func:`enabled`); off, every
call takes transformers' code.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from . import weight_only

#: whether the fused operations run (True) or transformers' own code (False); read at every call
ENABLED = True


@contextlib.contextmanager
def switched(module, on: bool, name: str = "ENABLED"):
    """Run the block with ``module.<name>`` (``ENABLED``) set to ``on`` (then restore the previous setting)."""
    before = getattr(module, name)
    setattr(module, name, on)
    try:
        yield
    finally:
        setattr(module, name, before)


def enabled(on: bool):
    """Run the block with the fused operations on or off."""
    return switched(sys.modules[__name__], on)


#: the norms :func:`use` replaces: those computing ``weight * x / sqrt(mean(x^2) + eps)`` (not ``(1 + weight) * ...``)
NORMS = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm")


def _takes(*tensors: torch.Tensor) -> bool:
    """Whether the fused operations take these tensors: switched on, float32 CPU tensors, the kernel module built
    here (a fixed answer for the process, so a one-token step and a block's queries always take the same path)."""
    if not (ENABLED and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)):
        return False
    return weight_only.available()


class FusedRMSNorm(nn.Module):
    """An RMS norm (``weight * x / sqrt(mean(x^2) + eps)``) of a float32 model in one call; off, or for other
    tensors, the module it replaced."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.stock = norm
        self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.stock.weight
        if not _takes(x, w):
            return self.stock(x)
        return weight_only.kernel().rms_norm(x, w, self.eps)


def rotary(q, k, cos, sin, unsqueeze_dim: int = 1, *, stock=None):
    """transformers' ``apply_rotary_pos_emb`` (q, k ``[B, H, S, d]``, cos, sin ``[B, S, d]``) in one call; other
    layouts and tensors go to ``stock``, transformers' own."""
    if unsqueeze_dim != 1 or cos.dim() != 3 or q.dim() != 4 or k.shape[0] != q.shape[0] or not _takes(q, k, cos, sin):
        return stock(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    q_embed, k_embed = weight_only.kernel().rotary(q, k, cos, sin)
    return q_embed, k_embed


def attend_one(module, query, key, value, **kwargs):
    """One query's attention (``query [B, H, 1, d]``, ``key``/``value [B, Hkv, L, d]``, no mask) as transformers'
    attention functions return it, ``([B, 1, H, d], None)``; None where the fused operation does not apply
    (switched off, another dtype or device, no kernel module here, values shaped unlike the keys, dropout, a soft
    cap, a sliding window shorter than the keys, sinks)."""
    window = kwargs.get("sliding_window")
    if (query.shape[2] != 1 or value.shape != key.shape or not _takes(query, key, value) or kwargs.get("dropout", 0.0)
            or kwargs.get("softcap") or kwargs.get("s_aux") is not None
            or (window is not None and key.shape[2] > window)):
        return None
    scale = kwargs.get("scaling")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return weight_only.kernel().attend_one(query, key, value, float(scale)), None


def _install_rotary() -> None:
    """Put :func:`rotary` in place of ``apply_rotary_pos_emb`` in transformers' Qwen2 and Qwen3 modelling modules
    (once; it hands everything it does not take to the function it replaced)."""
    import functools
    import importlib

    for name in ("qwen2", "qwen3"):
        mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        current = mod.apply_rotary_pos_emb
        if getattr(current, "_thesis_fused", False):
            continue
        fused = functools.partial(rotary, stock=current)
        fused._thesis_fused = True
        mod.apply_rotary_pos_emb = fused


def use(model) -> int:
    """Give a float32 CPU model the fused operations: its RMS norms of the kinds :data:`NORMS` names replaced by
    :class:`FusedRMSNorm` (a second call replaces nothing more) and the fused rotary embedding installed (the fused attention is the row-exact attention's, :mod:`~thesis_lib.models.attention`).
    Returns how many norms were replaced."""
    weight_only.kernel()  # built (or loaded) now, not inside the first step
    n = 0
    for parent in list(model.modules()):
        if isinstance(parent, FusedRMSNorm):  # its stand-by stays as it is
            continue
        for name, child in list(parent.named_children()):
            if type(child).__name__ in NORMS:
                setattr(parent, name, FusedRMSNorm(child))
                n += 1
    _install_rotary()
    return n
