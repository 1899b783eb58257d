"""The fused float32 decoding operations (``models.fused``, ``csrc/decode_ops.cpp``): transformers' results to float32
rounding, every row of a block equal to that row alone, and the switch back to transformers' code."""

from __future__ import annotations

import pytest
import torch

from thesis_lib.models import fused
from thesis_lib.models import weight_only as wo

pytestmark = pytest.mark.skipif(not wo.available(), reason="the project's CPU kernel cannot be built here")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def _qwen2():
    import transformers.models.qwen2.modeling_qwen2 as q

    return q


@pytest.mark.parametrize("width", [96, 100, 27])  # 16-lane blocks only; 4 over; one block and 11 over
def test_the_rms_norm_is_transformers_and_each_row_is_its_own(width):
    q = _qwen2()
    g = torch.Generator().manual_seed(0)
    stock = q.Qwen2RMSNorm(width, eps=1e-6)
    with torch.no_grad():
        stock.weight.copy_(torch.randn(width, generator=g))
    norm = fused.FusedRMSNorm(stock)
    x = torch.randn(5, 7, width, generator=g) * 3  # 35 rows: split between threads
    got = norm(x)
    assert _rel(got, stock(x)) < 1e-6
    want64 = stock.weight.double() * x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert _rel(got, want64) < 1e-6
    assert all(torch.equal(got[:, i], norm(x[:, i:i + 1])[:, 0]) for i in range(7))
    assert torch.equal(got[3, 2], norm(x[3, 2]))
    with fused.enabled(False):
        assert torch.equal(norm(x), stock(x))
    assert torch.equal(norm(x.double()), stock(x.double()))  # float64: transformers' code


def test_the_rotary_embedding_is_transformers_and_each_position_is_its_own():
    q = _qwen2()
    g = torch.Generator().manual_seed(1)
    qs, ks = torch.randn(1, 6, 5, 32, generator=g), torch.randn(1, 2, 5, 32, generator=g)
    angle = torch.randn(1, 5, 16, generator=g)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)

    def not_fused(*args, **kwargs):
        raise AssertionError("the fused rotary handed float32 CPU tensors on")

    got = fused.rotary(qs, ks, cos, sin, stock=not_fused)
    for x, y in zip((qs, ks), got):
        ref = x.double() * cos[:, None].double() + q.rotate_half(x.double()) * sin[:, None].double()
        assert _rel(y, ref) < 1e-6
    for j in range(5):
        one = fused.rotary(qs[:, :, j:j + 1], ks[:, :, j:j + 1], cos[:, j:j + 1], sin[:, j:j + 1], stock=not_fused)
        assert torch.equal(one[0], got[0][:, :, j:j + 1]) and torch.equal(one[1], got[1][:, :, j:j + 1])
    calls = []
    with fused.enabled(False):
        fused.rotary(qs, ks, cos, sin, stock=lambda *a, **kw: calls.append(a) or (a[0], a[1]))
    fused.rotary(qs.double(), ks.double(), cos.double(), sin.double(),
                 stock=lambda *a, **kw: calls.append(a) or a[:2])
    assert len(calls) == 2


def test_one_query_attention_is_sdpa_with_grouped_heads():
    g = torch.Generator().manual_seed(2)
    query = torch.randn(2, 6, 1, 72, generator=g)  # 72: a remainder after 16 x 4 lanes
    key, value = torch.randn(2, 2, 9, 72, generator=g), torch.randn(2, 2, 9, 72, generator=g)
    out, none = fused.attend_one(None, query, key, value, scaling=0.3, dropout=0.0)
    assert none is None and out.shape == (2, 1, 6, 72)
    ref = torch.nn.functional.scaled_dot_product_attention(query.double(), key.double().repeat_interleave(3, 1),
                                                           value.double().repeat_interleave(3, 1), scale=0.3)
    assert _rel(out, ref.transpose(1, 2)) < 1e-6
    # each row of a batch alone gives the same bits
    assert torch.equal(out[1:], fused.attend_one(None, query[1:], key[1:], value[1:], scaling=0.3)[0])
    # a prefix of a longer cache, read in place, is the prefix copied
    longer_k, longer_v = torch.cat([key, key], 2), torch.cat([value, value], 2)
    assert torch.equal(fused.attend_one(None, query, longer_k[:, :, :9], longer_v[:, :, :9], scaling=0.3)[0], out)
    assert fused.attend_one(None, query, key, value, scaling=0.3, dropout=0.1) is None
    assert fused.attend_one(None, query, key, value, scaling=0.3, sliding_window=4) is None
    assert fused.attend_one(None, query.double(), key.double(), value.double(), scaling=0.3) is None
    with fused.enabled(False):
        assert fused.attend_one(None, query, key, value, scaling=0.3) is None


def test_a_block_s_queries_in_one_call_equal_each_query_alone():
    """attend_causal: query j of a block after ``start`` cached positions over keys 0..start + j, each (query, head)
    bit for bit as attend_one computes it alone, and causal softmax attention to float32 rounding."""
    k = wo.kernel()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 5, 72, generator=g)
    keys, values = torch.randn(2, 2, 40, 72, generator=g), torch.randn(2, 2, 40, 72, generator=g)
    start = 30
    block = k.attend_causal(q, keys, values, 0.3, start)
    assert block.shape == (2, 5, 6, 72)
    for j in range(5):
        alone = k.attend_one(q[:, :, j:j + 1].contiguous(), keys[:, :, :start + j + 1], values[:, :, :start + j + 1], 0.3)
        assert torch.equal(block[:, j:j + 1], alone), j
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, j:j + 1].double(), keys[:, :, :start + j + 1].double().repeat_interleave(3, 1),
            values[:, :, :start + j + 1].double().repeat_interleave(3, 1), scale=0.3)
        assert _rel(block[:, j:j + 1], ref.transpose(1, 2)) < 1e-6
    with pytest.raises(RuntimeError, match="does not fit a cache"):
        k.attend_causal(q, keys[:, :, :33], values[:, :, :33], 0.3, start)


#: (keys before the queries, width, scale): widths and lengths with remainders past the kernel's lanes; a scale of
#: 40 puts most weights below exp's lowest argument
ATTENTION_CASES = (((1, 72), 0.3), ((17, 64), 0.3), ((300, 128), 0.3), ((33, 8), 0.3), ((9, 13), 0.3), ((40, 64), 40.0))


def _attention_inputs(g, length, d):
    return (torch.randn(1, 6, 3, d, generator=g), torch.randn(1, 2, length + 3, d, generator=g),
            torch.randn(1, 2, length + 3, d, generator=g))


@pytest.mark.parametrize("forced", [None, "AVX2"])  # the variable's case does not matter, as for the weight kernels
def test_attention_is_softmax_attention_on_each_path(forced, monkeypatch):
    """On the CPU's own path and on the AVX2 path forced: softmax attention to float32 rounding at widths and lengths
    with remainders, also where most weights fall below exp's lowest argument; a NaN in a query gives that head's
    row NaN and leaves the others."""
    if forced:
        monkeypatch.setenv(wo.FORCED_PATH_ENV, forced)
    k = wo.kernel()
    g = torch.Generator().manual_seed(4)
    for (length, d), scale in ATTENTION_CASES:
        q, keys, values = _attention_inputs(g, length, d)
        got = k.attend_causal(q, keys, values, scale, length)
        for j in range(3):
            ref = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, j:j + 1].double(), keys[:, :, :length + j + 1].double().repeat_interleave(3, 1),
                values[:, :, :length + j + 1].double().repeat_interleave(3, 1), scale=scale)
            assert _rel(got[:, j:j + 1], ref.transpose(1, 2)) < 1e-6, (length, d, j)
    q[0, 1, 0, 0] = float("nan")
    out = k.attend_causal(q, keys, values, 0.3, 40)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, 0].isnan().any() and not out[0, 1:].isnan().any()


@pytest.mark.skipif(not wo.available() or not wo.kernel().avx512_path(),
                    reason="a CPU without AVX-512 runs attention's AVX2 path only: nothing to compare it with")
def test_attention_s_avx2_path_gives_the_avx512_path_s_bits(monkeypatch):
    """The AVX2 path (two 8-lane registers) computes every (query, head) as the AVX-512 path does, bit for bit."""
    k = wo.kernel()
    g = torch.Generator().manual_seed(4)
    for (length, d), scale in ATTENTION_CASES:
        q, keys, values = _attention_inputs(g, length, d)
        wide = k.attend_causal(q, keys, values, scale, length)
        monkeypatch.setenv(wo.FORCED_PATH_ENV, "avx2")
        narrow = k.attend_causal(q, keys, values, scale, length)
        monkeypatch.delenv(wo.FORCED_PATH_ENV)
        assert torch.equal(wide, narrow), (length, d)


def test_a_model_with_the_fused_operations_is_the_stock_model_to_rounding(tiny_models):
    """A packed float32 tiny model with the fused operations (what the loader gives a CPU model) against the same
    model with them switched off: the same hidden states to float32 rounding, and greedy tokens alike."""
    model = tiny_models[("f32x", "qwen3", "target")]
    assert any(isinstance(m, fused.FusedRMSNorm) for m in model.modules())
    ids = torch.arange(5, 40)[None]
    with torch.inference_mode():
        on = model(ids).logits
        with fused.enabled(False):
            off = model(ids).logits
    assert _rel(on, off) < 1e-5 and torch.equal(on.argmax(-1), off.argmax(-1))
    assert not torch.equal(on, off)  # the fused path really ran


def test_without_the_kernel_module_every_query_takes_transformers_attention(monkeypatch):
    """Where the kernel module cannot be built, the fused attention declines every call (a one-token step and the
    queries of a block alike), and the row-exact attention answers with transformers' SDPA."""
    from types import SimpleNamespace

    from thesis_lib.models import attention

    g = torch.Generator().manual_seed(3)
    query, key = torch.randn(1, 4, 1, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    monkeypatch.setattr(wo, "available", lambda: False)
    assert fused.attend_one(None, query, key, key, scaling=0.25) is None
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    out, _ = attention.exact_attention(module, query, key, key, None, scaling=0.25, dropout=0.0)
    ref = torch.nn.functional.scaled_dot_product_attention(query, key.repeat_interleave(2, 1),
                                                           key.repeat_interleave(2, 1), scale=0.25)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-6)


def test_only_the_norms_it_knows_are_replaced_and_only_once():
    import transformers.models.qwen2.modeling_qwen2 as q

    class OnePlusRMSNorm(torch.nn.Module):  # a (1 + w) norm of another family: left alone
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8))

    model = torch.nn.Sequential(q.Qwen2RMSNorm(8), OnePlusRMSNorm())
    assert fused.use(model) == 1 and isinstance(model[0], fused.FusedRMSNorm)
    assert isinstance(model[1], OnePlusRMSNorm)
    assert fused.use(model) == 0 and isinstance(model[0].stock, q.Qwen2RMSNorm)
