"""Row-exact attention for CPU decoding: a block of new tokens gets, bit for bit, what one-token steps would give.

Why this exists. Greedy speculative decoding is lossless in exact arithmetic; in floating point it is lossless
only if verifying a block of K + 1 tokens computes each position exactly as target-only decoding computes it,
one token at a time. On this project's CPUs the packed linear layers already do (float32 in oneDNN's general
layout, and torchao's int4 kernel: each output row of a block equals the one-row product, measured on the 2-core
AVX2 EPYC), but attention did not: transformers hands a block that follows a cache to PyTorch's scaled-dot-product
attention with an explicit causal mask (and, for grouped-query models, repeated key/value heads), where a single
token gets neither, so the block takes another kernel path. A verified block's hidden states drifted from the
one-token steps' (float32: up to 1e-4 in a hidden state of norm 190 on the 0.5B draft; the int4 target: up to
1.5), and where the target's top two logits were that close, speculative output parted from target-only output.

:func:`exact_attention` (registered with transformers as :data:`NAME`) computes a block of queries that follows a
cache one query at a time, each through transformers' own SDPA function with exactly the arguments a one-token
step passes (its prefix of keys and values, no mask where the mask allows every position); a prefill (no cache)
and a single token go to that function unchanged. With row-exact linear layers the whole block forward then
equals the one-token steps bit for bit, so speculative output equals target-only output token for token, near
ties included. The price is one small attention call per position instead of one per block (measured in
``thesis-lib precision-bench`` as the ``float32-sdpa`` variant, which keeps transformers' batched SDPA).

:data:`MODES`: "exact" (the CPU default), "sdpa" (transformers' own). On a GPU the matrix products themselves
are not row-exact (cuBLAS picks kernels by shape), so the loader keeps "sdpa" there. This module knows nothing
about decoding or loading.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: the name under which :func:`exact_attention` is registered with transformers
NAME = "thesis_exact_sdpa"
#: attention modes a model can be loaded with
MODES = ("exact", "sdpa")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"attention {mode!r}: choose one of {', '.join(MODES)}.")


def exact_attention(module: Any, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention-function signature (``query [B, H, q, d]``, ``key``/``value`` with the cache's
    positions first, ``[B, Hkv, kv, d]``); returns ``([B, q, H, d], None)``. Batch 1 rows with a mask that allows
    the whole prefix take the one-token path exactly; any row the mask restricts keeps its mask."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, kv = query.shape[2], key.shape[2]
    if q == 1 or kv == q:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    rows = []
    for j in range(q):
        n = kv - q + j + 1  # the keys position j may see: the cache and the block up to itself
        mask = None if attention_mask is None else attention_mask[:, :, j:j + 1, :n]
        if mask is not None and mask.dtype == torch.bool and bool(mask.all()):
            mask = None  # what a one-token step gets
        out, _ = sdpa_attention_forward(module, query[:, :, j:j + 1], key[:, :, :n], value[:, :, :n], mask,
                                        *args, **kwargs)
        rows.append(out)
    return torch.cat(rows, dim=1), None


def register() -> str:
    """Register :func:`exact_attention` (and SDPA's mask builder for it) with transformers; returns :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use(model: Any, mode: str) -> str:
    """Set ``model``'s attention to ``mode`` (:data:`MODES`); returns a line for the run's environment."""
    check_mode(mode)
    if mode == "exact":
        model.set_attn_implementation(register())
        return "row-exact (a verified block attends one position at a time, as one-token steps do; SDPA kernels)"
    model.set_attn_implementation("sdpa")
    return "sdpa (transformers' batched scaled-dot-product attention)"
