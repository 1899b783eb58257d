"""Row-exact attention for CPU decoding: a block of new tokens gets, bit for bit, what one-token steps would give.

Why this exists. Greedy speculative decoding is lossless in exact arithmetic; in floating point it is lossless
only if verifying a block of K + 1 tokens computes each position exactly as target-only decoding computes it,
one token at a time. The packed linear layers already did on the 2-core AVX2 EPYC this was measured on (float32
in oneDNN's general layout, and torchao's int4 kernel: each output row of a block equalled the one-row product; on
the AVX-512 BF16 EPYC packed bfloat16 does so once products of fewer than five rows are padded to five;
:func:`rows_exact` probes a loaded model's kernels, since another CPU or thread count may differ), but attention
did not: transformers hands a block that follows a cache to PyTorch's scaled-dot-product
attention with an explicit causal mask (and, for grouped-query models, repeated key/value heads), where a single
token gets neither, so the block takes another kernel path. A verified block's hidden states drifted from the
one-token steps' (float32: up to 1e-4 in a hidden state of norm 190 on the 0.5B draft; the int4 target: up to
1.5), and where the target's top two logits were that close, speculative output parted from target-only output.

:func:`exact_attention` (registered with transformers as :data:`NAME`) computes a block of queries that follows a
cache one query at a time, each through transformers' own SDPA function with exactly the arguments a one-token
step passes (its prefix of keys and values, no mask where the mask allows every position); a prefill (no cache)
and a single token go to that function unchanged (as do a static cache's prefill and models with a position bias
or a paged cache, which this project does not run). With row-exact linear layers the whole block forward then
equals the one-token steps bit for bit, so speculative output equals target-only output token for token, near
ties included. The price is one small attention call per position instead of one per block (``thesis-lib
precision-bench --precisions float32,float32-sdpa`` times it beside transformers' batched SDPA: on the AVX2 EPYC
blocks of 9 and 13 target tokens took 1.6 and 2 % more, a block of 5 no more within the noise). Sliding-window
layers past their window are not row-exact (Qwen2.5 and Qwen3 do not use them).

:data:`MODES`: "exact" (the CPU default), "sdpa" (transformers' own). On a GPU the loader leaves the model's own
attention: row-exactness there would need the matrix products' too, which this project has not measured. This
module knows nothing about decoding or loading.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: the name under which :func:`exact_attention` is registered with transformers
NAME = "thesis_exact_sdpa"
#: attention modes a model can be loaded with
MODES = ("exact", "sdpa")


def check_mode(mode: str) -> None:
    """Raise :class:`~thesis_lib.errors.ConfigError` unless ``mode`` is one of :data:`MODES`."""
    if mode not in MODES:
        raise ConfigError(f"attention {mode!r}: choose one of {', '.join(MODES)}.")


def exact_attention(module: Any, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention-function signature (``query [B, H, q, d]``, ``key``/``value`` with the cache's
    positions first, ``[B, Hkv, kv, d]``); returns ``([B, q, H, d], None)``. Batch 1 rows with a mask that allows
    the whole prefix take the one-token path exactly; any row the mask restricts keeps its mask."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, kv = query.shape[2], key.shape[2]
    if (q == 1 or kv == q or attention_mask is None  # a step, a prefill, or a static cache's prefill (keys cut to q)
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):  # not Qwen's kinds
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    rows = []
    for j in range(q):
        n = kv - q + j + 1  # the keys position j may see: the cache and the block up to itself
        mask = attention_mask[:, :, j:j + 1, :n]
        if mask.dtype == torch.bool and bool(mask.all()):
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
    name = register() if mode == "exact" else "sdpa"
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:  # transformers only warns where a model cannot switch
        raise ConfigError(f"{type(model).__name__} kept attention {model.config._attn_implementation!r}; "
                          f"attention {mode!r} cannot be set on it.")
    if mode == "exact":
        return "row-exact (a verified block attends one position at a time, as one-token steps do; SDPA kernels)"
    return "sdpa (transformers' batched scaled-dot-product attention)"


def rows_exact(model: Any, sizes: tuple[int, ...] = (2, 5, 9, 13), seed: int = 0, head: bool = True) -> bool:
    """Whether the linear layers of ``model``'s first block and (``head``) its output layer compute each row of a block of
    ``sizes`` rows bit for bit as they compute that row alone, on this machine's kernels (a probe of random rows in
    the model's dtype: a few products per layer). Where they do and attention is row-exact, a verified block of
    up to max(sizes) tokens equals one-token steps; the layers of the other blocks share these shapes."""
    import torch

    layers = [m for m in model.get_decoder().layers[0].modules() if hasattr(m, "in_features")]
    if head:  # a float32 head tied to the input embedding stays unpacked (models.packing): MKL's rows may differ
        layers.append(model.get_output_embeddings())
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        for layer in layers:
            x = torch.randn(max(sizes), layer.in_features, generator=gen).to(model.dtype)
            ones = torch.cat([layer(x[i:i + 1]) for i in range(max(sizes))])
            if not all(torch.equal(layer(x[:m]), ones[:m]) for m in sizes):
                return False
    return True
