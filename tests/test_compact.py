"""The compact decode step (models.compact): the modules' values, bit for bit, through fewer calls."""

from __future__ import annotations

import pytest
import torch

from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.models import attention, compact, fused, tiny
from thesis_lib.models import weight_only as wo

from conftest import TINY_VOCAB, int8_pair

pytestmark = pytest.mark.skipif(not wo.available(), reason="the project's CPU kernel cannot be built here: no compact step")


def _int8(arch: str, seed: int = 0, fmt: str = "int8-dynamic"):
    model = tiny.tiny_model(arch, seed=seed)
    wo.convert(model, fmt)
    attention.use(model)
    fused.use(model)
    return model


def _pair_of_states(model):
    on, off = ModelState(model, vocab_limit=TINY_VOCAB), ModelState(model, vocab_limit=TINY_VOCAB)
    prompt = list(range(30, 47))
    on.hidden(prompt)
    off.hidden(prompt)
    return on, off


def _both(on, off, ids):
    a = on.hidden(ids)
    with compact.enabled(False):
        b = off.hidden(ids)
    return a, b


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("arch,fmt", [("qwen2", "int8-dynamic"), ("qwen3", "int8-dynamic"), ("qwen2", "int4-dynamic")])
def test_steps_and_blocks_after_a_cache_equal_the_modules_bit_for_bit(arch, fmt, native, monkeypatch):
    """Through the layers in one kernel call (native) and through the Python loop of the same calls."""
    model = _int8(arch, fmt=fmt)
    assert compact.why_not(model) is None
    monkeypatch.setattr(compact, "NATIVE", native)
    on, off = _pair_of_states(model)
    calls, native_calls = [], []
    step = on.compact
    assert step.native is not None and step.native[1][-1] == int(fmt == "int4-dynamic")
    real, real_native = step.hidden, step._native_layers
    step.hidden = lambda *a: calls.append(1) or real(*a)
    step._native_layers = lambda *a: native_calls.append(1) or real_native(*a)
    try:
        with torch.inference_mode():
            for ids in ([5], [9, 11, 13], [2], [40, 41, 42, 43, 44, 45]):
                a, b = _both(on, off, ids)
                assert torch.equal(a, b), ids
            on.crop(4)
            off.crop(4)
            a, b = _both(on, off, [7])
            assert torch.equal(a, b)
    finally:
        step.hidden, step._native_layers = real, real_native
    assert len(calls) == 5  # every step after the prefill took the compact path
    assert len(native_calls) == (5 if native else 0)
    assert on.length == off.length == on.cache.get_seq_length()
    for layer_on, layer_off in zip(on.cache.layers, off.cache.layers):  # the caches hold the same keys
        assert torch.equal(layer_on.keys, layer_off.keys) and torch.equal(layer_on.values, layer_off.values)


def test_a_cache_the_modules_grew_is_taken_in_before_the_next_step():
    """A token tree's forward goes through the modules (a cache of its own tensors), a kept path moves positions
    in place, and the storage grows past its first capacity: the next compact step still equals the modules'."""
    model = _int8("qwen2", seed=1)
    on, off = _pair_of_states(model)
    with torch.inference_mode():
        for state in (on, off):
            base = state.length
            visible = torch.ones(3, base + 3, dtype=torch.bool)
            visible[1, base] = visible[2, base + 1] = False  # a root with two children
            visible[0, base + 1:] = False
            state.hidden_masked([4, 8, 9], [base, base + 1, base + 1], visible)
            state.keep(base, [0, 2])
        a, b = _both(on, off, [12])
        assert torch.equal(a, b)
        for _ in range(300):  # past the first 256 positions
            a, b = _both(on, off, [int(a.sum().abs()) % TINY_VOCAB])
        assert torch.equal(a, b) and on.storage.keys[0].shape[2] > 256


@pytest.mark.parametrize("deferred", [False, True])
def test_speculative_output_equals_target_only_on_the_compact_path(deferred):
    target, draft, flash = int8_pair()
    prompt = list(range(60, 90))
    with torch.inference_mode():
        ref = greedy_generate(ModelState(target, vocab_limit=TINY_VOCAB), prompt, max_new_tokens=40).tokens
        with compact.enabled(False):
            modules = greedy_generate(ModelState(target, vocab_limit=TINY_VOCAB), prompt, max_new_tokens=40).tokens
        for head in (None, flash):
            spec = speculative_generate(ModelState(target, vocab_limit=TINY_VOCAB),
                                        ModelDrafter(draft, head=head, vocab_limit=TINY_VOCAB), prompt, k=4,
                                        max_new_tokens=40, schedule="deferred" if deferred else "ordinary")
            assert spec.tokens == ref
    assert ref == modules and len(ref) == 40


def test_joint_products_share_the_layers_bytes_and_leave_their_values():
    model = _int8("qwen2", seed=2)
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, attn.q_proj.in_features)
    with torch.inference_mode():
        before = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        compact.for_model(model)
        after = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    base = attn.q_proj.packed_weight.untyped_storage().data_ptr()
    assert attn.k_proj.packed_weight.untyped_storage().data_ptr() == base
    assert attn.v_proj.packed_weight.untyped_storage().data_ptr() == base
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_models_it_does_not_mirror_say_why_and_decode_through_the_modules():
    stock = tiny.tiny_model("qwen2", seed=0)  # transformers' attention, stock norms
    assert "row-exact" in compact.why_not(stock)
    assert ModelState(stock).compact is None
    bf16 = _int8("qwen2").to(torch.bfloat16)
    assert compact.why_not(bf16) == "not a float32 CPU model"
    model = _int8("qwen2")
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert "sliding" in compact.why_not(model)
    on, _ = _pair_of_states(_int8("qwen3"))
    on.compact.hidden = None  # would fail if called
    with fused.enabled(False), torch.inference_mode():  # fused operations off: the compact step stands aside too
        assert on.hidden([3]).shape == (1, on.model.config.hidden_size)


def test_a_copied_or_converted_model_gets_its_own_step():
    """The step holds the layers it was built from: a deep copy of a model (other weights) and a model converted
    after its first state each get a step of their own."""
    import copy

    model = _int8("qwen2", seed=4)
    first = compact.for_model(model)
    assert first is not None and compact.for_model(model) is first
    twin = copy.deepcopy(model)
    assert compact.for_model(twin) is not first
    later = tiny.tiny_model("qwen2", seed=5)
    assert ModelState(later).compact is None  # not yet row-exact and fused
    wo.convert(later, "int8-dynamic")
    attention.use(later)
    fused.use(later)
    assert compact.for_model(later) is not None


def test_the_layers_run_in_one_call_only_where_every_product_is_joint_and_dynamic():
    """int8-weights products (float32, one per layer) and norms of two epsilons keep the Python loop."""
    assert compact.for_model(_int8("qwen2", fmt="int4-dynamic")).native is not None
    assert compact.for_model(_int8("qwen2", seed=1, fmt="int8-weights")).native is None
    model = _int8("qwen2", seed=2)
    model.model.layers[1].post_attention_layernorm.eps *= 2
    assert compact.for_model(model).native is None


def test_rotary_table_slices_equal_the_module_at_every_position():
    """The step's table of cos and sin (grown past its first capacity) gives the rotary module's own values, bit
    for bit, for any block of positions; a rotary kind whose frequencies depend on the length has no table."""
    step = compact.for_model(_int8("qwen2"))
    x = torch.zeros(1, 1, 8)
    for start, n in ((0, 1), (5, 5), (511, 1), (600, 7), (3, 1)):
        want = step.rotary_emb(x, torch.arange(start, start + n).unsqueeze(0))
        got = step.rotary(x, start, n)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (start, n)
    assert step._cos.shape[1] >= 607
    step.table, step._cos = False, None
    got, want = step.rotary(x, 2, 3), step.rotary_emb(x, torch.arange(2, 5).unsqueeze(0))
    assert step._cos is None and got[0].shape[1] == 3 and all(torch.equal(g, w) for g, w in zip(got, want))

