"""oneDNN-packed linear layers: same outputs as the dense layers, used where they should be."""

from __future__ import annotations

import copy

import pytest
import torch

from thesis_lib.decoding.greedy import greedy_generate
from thesis_lib.decoding.state import CPU_BUCKETS, ModelState
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.models.packing import PackedLinear, is_packed, pack_linears

from conftest import TINY_VOCAB

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (1, 3, 64)])
def test_packed_linear_matches_dense(bias, shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    packed = PackedLinear(lin)
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)
    assert packed(x).shape == (*shape[:-1], 96)
    torch.testing.assert_close(packed.weight, lin.weight.detach())


def test_pack_linears_packs_float32_only(tiny_models):
    m32 = copy.deepcopy(tiny_models[("f32", "qwen2", "target")])
    m64 = copy.deepcopy(tiny_models[("f64", "qwen2", "target")])
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in m32.modules())
    assert pack_linears(m32) == n_linear == 2 * 7 + 1  # 7 per layer (q, k, v, o, gate, up, down) + head
    assert pack_linears(m64) == 0 and not is_packed(m64)
    assert is_packed(m32) and not any(isinstance(m, torch.nn.Linear) for m in m32.modules())


def test_packed_model_logits_match_dense(tiny_models):
    dense, packed = tiny_models[("f32", "qwen3", "target")], tiny_models[("f32p", "qwen3", "target")]
    ids = torch.tensor([[1, 5, 9, 200, 30]])
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-4)


def test_packed_models_get_no_buckets_and_dense_ones_do(tiny_models):
    assert ModelState(tiny_models[("f32p", "qwen2", "target")]).buckets == {}
    assert ModelState(tiny_models[("f32", "qwen2", "target")]).buckets == CPU_BUCKETS


def test_packed_head_never_picks_padding_rows(tiny_models):
    model = copy.deepcopy(tiny_models[("f32", "qwen2", "target")])
    with torch.no_grad():
        model.lm_head.weight[TINY_VOCAB:] = model.lm_head.weight[:TINY_VOCAB].abs().max() * 50
    pack_linears(model)
    head = DenseGreedyHead.from_model(model, TINY_VOCAB)
    assert head.packed is not None and head.vocab_limit == TINY_VOCAB
    out = greedy_generate(ModelState(model, vocab_limit=TINY_VOCAB), [3, 4, 5], max_new_tokens=12).tokens
    assert max(out) < TINY_VOCAB
    unlimited = greedy_generate(ModelState(model), [3, 4, 5], max_new_tokens=12).tokens
    assert max(unlimited) >= TINY_VOCAB  # the limit is what keeps them out
