"""Row-exact attention for CPU decoding: a block of new tokens gets, bit for bit, what one-token steps would give.

Greedy speculative decoding is lossless in exact arithmetic; in floating point only if verifying a block of K + 1
tokens computes each position exactly as target-only decoding computes it, one token at a time. The packed linear
layers do on the CPUs this project measured (:func:`rows_exact_by_size` probes a loaded model's kernels), but
transformers' attention does not: a block that follows a cache goes to scaled-dot-product attention with an
explicit causal mask (and repeated key/value heads), where a single token gets neither, so the block takes
another kernel path and its hidden states drift from the one-token steps' (where the target's top two logits are
that close, speculative output then parts from target-only output).

:func:`exact_attention` (registered with transformers as :data:`NAME`) computes a block of queries that follows a
cache one query at a time, each through transformers' own SDPA function with exactly the arguments a one-token
step passes (its prefix of keys and values, no mask where the mask allows every position), or each through the
fused one-query attention of :mod:`thesis_lib.models.fused` where that applies, as a one-token step is; a prefill
(no cache) goes to SDPA unchanged (as do a static cache's prefill and models with a position bias or a paged
cache, which this project does not run). With row-exact linear layers the whole block forward then
equals the one-token steps bit for bit; the price is one small attention call per position instead of one per
block. Sliding-window layers past their window are not row-exact (Qwen2.5 and Qwen3 do not use them). On a GPU the
loader leaves the model's own attention. This module knows nothing about decoding or loading.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: the name under which :func:`exact_attention` is registered with transformers
NAME = "thesis_exact_sdpa"
def exact_attention(module: Any, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention-function signature (``query [B, H, q, d]``, ``key``/``value`` with the cache's
    positions first, ``[B, Hkv, kv, d]``); returns ``([B, q, H, d], None)``.

    Where a boolean mask says which keys each query sees (a causal block after a cache; the ragged rows of
    :mod:`thesis_studies.serving.loops`, one prefix per row and position; a token tree of
    :mod:`thesis_studies.trees.loop`, the prefix plus the query's ancestors), each query goes through SDPA alone
    with exactly those keys, in cache order, and no mask: a one-token step's call over the same keys, bit for bit
    (a query that sees no key gets zeros). A prefix is a slice of the cache; any other set is gathered. Any other
    mask (additive floats) is passed on."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, q, kv = query.shape[0], query.shape[2], key.shape[2]
    if attention_mask is None and q == 1:  # a one-token step: as each query of a verified block below
        return _one_query(module, query, key, value, *args, **kwargs)
    if (attention_mask is None or (b == 1 and kv == q)  # a prefill, a static cache's prefill
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):  # not Qwen's kinds
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    seen = _visible(attention_mask, b, q, kv)
    if seen is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    out = query.new_zeros(b, q, query.shape[1], query.shape[3])
    for i, row in enumerate(seen):
        for j, keys in enumerate(row):
            if isinstance(keys, int):
                if not keys:
                    continue
                k_, v_ = key[i:i + 1, :, :keys], value[i:i + 1, :, :keys]
                if b > 1:  # a slice of a wider cache: laid out as a one-row cache's keys are
                    k_, v_ = k_.contiguous(), v_.contiguous()
            else:
                k_, v_ = key[i:i + 1].index_select(2, keys), value[i:i + 1].index_select(2, keys)
            out[i:i + 1, j:j + 1], _ = _one_query(module, query[i:i + 1, :, j:j + 1], k_, v_, *args, **kwargs)
    return out, None


def _one_query(module, query, key, value, *args, **kwargs):
    """One query over its keys, no mask: the fused one-query attention where it applies
    (:func:`thesis_lib.models.fused.attend_one`), else transformers' SDPA function; a one-token step and each query
    of a block both come here, so both take the same path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from .fused import attend_one

    done = attend_one(module, query, key, value, **kwargs) if not args else None
    return done if done is not None else sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)


#: the last mask :func:`_visible` read and what it found (every layer of a forward gets the same mask tensor;
#: the tensor is held here, so its identity cannot be reused by another before it is replaced)
_LAST: list = [None, None]


def _visible(mask, b: int, q: int, kv: int) -> list[list] | None:
    """Per row and query of a boolean ``[B, 1, q, kv]`` mask, the keys it allows: a count where they are a
    prefix, else a tensor of their indices; None for a mask of another kind."""
    import torch

    if mask.dtype != torch.bool or mask.shape[1] != 1:
        return None
    if _LAST[0] is mask:
        return _LAST[1]
    m = mask.expand(b, 1, q, kv)[:, 0]
    counts = m.sum(-1)
    prefix = (m == (torch.arange(kv, device=m.device) < counts[..., None])).all(-1)
    seen = [[int(counts[i, j]) if prefix[i, j] else m[i, j].nonzero()[:, 0] for j in range(q)] for i in range(b)]
    _LAST[:] = [mask, seen]
    return seen


def register() -> str:
    """Register :func:`exact_attention` (and SDPA's mask builder for it) with transformers; returns :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use(model: Any) -> str:
    """Give ``model`` the row-exact attention; returns a line for the run's environment."""
    name = register()
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:  # transformers only warns where a model cannot switch
        raise ConfigError(f"{type(model).__name__} kept attention {model.config._attn_implementation!r}; "
                          "the row-exact attention cannot be set on it.")
    return "row-exact (a verified block attends one position at a time, as one-token steps do; SDPA kernels)"


#: The largest verified block the loader probes by default: a block of up to ``k_max`` = 12 proposals plus the
#: deferred schedule's carried token (the bench checks a run that verifies more, :func:`probe_rows`).
PROBED_BLOCK = 13


def rows_exact_by_size(model: Any, sizes=range(2, PROBED_BLOCK + 1), seed: int = 0,
                       head: bool = True) -> dict[int, bool]:
    """Per block size: whether the linear layers of ``model``'s first block and (``head``) its output layer compute
    each row of a block of that many rows bit for bit as they compute that row alone, on this machine's kernels at
    the current thread count (a probe of random rows in the model's dtype). The layers of the other blocks share
    these shapes."""
    import torch

    sizes = sorted(set(sizes))
    layers = [m for m in model.get_decoder().layers[0].modules() if hasattr(m, "in_features")]
    if head:  # a float32 head tied to the input embedding stays unpacked (models.packing): MKL's rows may differ
        layers.append(model.get_output_embeddings())
    gen = torch.Generator().manual_seed(seed)
    exact = {m: True for m in sizes}
    with torch.inference_mode():
        for layer in layers:
            x = torch.randn(max(sizes), layer.in_features, generator=gen).to(model.dtype)
            ones = torch.cat([layer(x[i:i + 1]) for i in range(max(sizes))])
            for m in sizes:
                exact[m] = exact[m] and torch.equal(layer(x[:m]), ones[:m])
    return exact


def rows_exact(model: Any, sizes=range(2, PROBED_BLOCK + 1), seed: int = 0, head: bool = True) -> bool:
    """Whether every block size of ``sizes`` passes :func:`rows_exact_by_size`: where it does and attention is
    row-exact, a verified block of up to max(sizes) tokens equals one-token steps."""
    return all(rows_exact_by_size(model, sizes, seed=seed, head=head).values())
