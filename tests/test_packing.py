"""oneDNN-packed linear layers: same outputs as the dense layers, used where they should be."""

from __future__ import annotations

import copy

import pytest
import torch

from thesis_lib.decoding.greedy import greedy_generate
from thesis_lib.decoding.state import CPU_BUCKETS, ModelState
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.errors import ConfigError
from thesis_lib.models.packing import PackedLinear, bf16_packing_available, is_packed, pack_linears

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
    torch.testing.assert_close(packed.weight, lin.weight.detach(), rtol=0, atol=0)  # the packed copy loses nothing
    # the bias as the greedy head reads it: the layer's own, or none
    if bias:
        torch.testing.assert_close(packed.packed_bias, lin.bias.detach(), rtol=0, atol=0)
    else:
        assert packed.packed_bias is None
    assert not packed.state_dict()  # oneDNN's layout on this machine is no part of a model's saved state


def test_pack_linears_keeps_the_model(tiny_models):
    m = copy.deepcopy(tiny_models[("f32", "qwen2", "target")])
    ids = torch.tensor([[1, 5, 9, 200, 30]])
    with torch.inference_mode():
        dense = m(ids).logits
    pack_linears(m)
    with torch.inference_mode():
        torch.testing.assert_close(m(ids).logits, dense, rtol=1e-4, atol=1e-4)


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


needs_bf16 = pytest.mark.skipif(not bf16_packing_available(), reason="this CPU has no native bf16 dot products")


@needs_bf16
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (1, 3, 64)])
def test_bf16_packed_linear_matches_float32_within_bf16_rounding(bias, shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=bias).to(torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    packed = PackedLinear(lin)
    y = packed(x)
    assert y.dtype == torch.bfloat16 and y.shape == (*shape[:-1], 96)
    # the exact product of the same bf16 numbers, in float64: the packed layer is off by its output rounding only
    exact = x.double() @ lin.weight.double().T + (lin.bias.double() if bias else 0)
    torch.testing.assert_close(y.double(), exact, rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(packed.weight, lin.weight.detach(), rtol=0, atol=0)  # the packed copy loses nothing


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_bf16), torch.float32])
def test_products_of_few_rows_are_padded_and_each_row_ignores_the_others(dtype):
    """A packed product of fewer than its floor's rows (5, bf16's and AVX-512 float32's) runs padded to it: the
    padding's outputs are dropped, each row's output equals that row's inside a full block of as many rows whatever
    the block's other rows hold (so padding picks a kernel, it does not change what a row computes), and it stays
    within rounding of the unpadded product. Fewer than one row is refused."""
    floor = 5
    torch.manual_seed(0)
    lin = torch.nn.Linear(1536, 896, bias=True).to(dtype)
    padded, plain = PackedLinear(lin, min_rows=floor), PackedLinear(lin)
    assert "padded" in repr(padded) and "padded" not in repr(plain)
    block = torch.randn(floor, 1536, dtype=dtype)
    full = padded(block)
    tol = dict(rtol=2 ** -7, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for rows in range(1, floor):
        x = torch.randn(rows, 1536, dtype=dtype)
        y = padded(x)
        assert y.shape == (rows, 896)
        mixed = torch.cat([x, block[rows:]])  # the same rows among other rows, in a block of the floor's size
        assert torch.equal(y, padded(mixed)[:rows]) and torch.equal(y, plain(mixed)[:rows])
        torch.testing.assert_close(y.double(), plain(x).double(), **tol)
    assert torch.equal(full, plain(block))  # a block of the floor's size or more runs as it comes
    with torch.profiler.profile(record_shapes=True) as prof:  # what the kernel is handed: the padded block
        padded(torch.randn(1, 1536, dtype=dtype))
        plain(torch.randn(1, 1536, dtype=dtype))
    shapes = [e.input_shapes[0] for e in prof.events() if e.name == "mkldnn::_linear_pointwise"]
    assert shapes == [[floor, 1536], [1, 1536]], shapes
    assert padded(torch.randn(2, 3, 1536, dtype=dtype)).shape == (2, 3, 896)


def test_the_rows_floor_follows_the_dtype_and_the_cpu(monkeypatch):
    """bf16 products are padded to BF16_ROWS_FLOOR; float32 ones to F32_ROWS_FLOOR_AVX512 only where torch runs
    AVX-512 kernels (on AVX2 a one-row product is the cheapest: no padding there); other dtypes are never padded."""
    from thesis_lib.models import packing
    from thesis_lib.models.packing import BF16_ROWS_FLOOR, F32_ROWS_FLOOR_AVX512, rows_floor

    assert BF16_ROWS_FLOOR > 1 and F32_ROWS_FLOOR_AVX512 > 1
    for capability, f32 in (("AVX512", F32_ROWS_FLOOR_AVX512), ("AVX2", 1), ("DEFAULT", 1)):
        monkeypatch.setattr(packing.torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert rows_floor(torch.float32) == f32 and rows_floor(torch.bfloat16) == BF16_ROWS_FLOOR
        assert rows_floor(torch.float16) == 1
    with pytest.raises(ConfigError, match=">= 1"):
        PackedLinear(torch.nn.Linear(64, 32), min_rows=0)


def _file_rss_kb(path) -> int:
    """This process' resident kB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps", encoding="utf-8"):
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and first == "Rss:":
            total += int(line.split()[1])
    return total


@needs_bf16
def test_packing_hands_back_the_file_pages_of_rows_read_a_few_at_a_time(tmp_path):
    """A bf16 model loaded from safetensors (memory-mapped): after packing, the pages of its input embedding and of
    its head's dense rows leave the resident set (the packed weights' pages already did), and the rows read back
    from the file are unchanged."""
    from transformers import AutoModelForCausalLM

    from thesis_lib.models import tiny

    tiny.tiny_model("qwen2", seed=1, hidden=256, vocab_size=4096, dtype=torch.bfloat16).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    saved = (emb.detach().clone(), head.detach().clone())
    before = _file_rss_kb(tmp_path / "model.safetensors")
    assert before >= 2 * 4096 * 256 * 2 // 1024 * 0.9  # embedding and head (4 MiB) resident after loading
    assert pack_linears(model) > 0
    after = _file_rss_kb(tmp_path / "model.safetensors")
    assert after < 0.1 * before, (before, after)
    assert torch.equal(emb, saved[0]) and torch.equal(model.get_output_embeddings().weight, saved[1])
    assert _file_rss_kb(tmp_path / "model.safetensors") > after  # read back from the file as they were touched


@needs_bf16
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tied_head_keeps_its_pages_where_it_reads_them_all(tmp_path, dtype):
    """A head tied to the input embedding: in bf16 its packed copy does the products, so the embedding's pages
    leave like an untied model's; in float32 the head is that embedding, read in full at every step (not packed),
    so its pages stay. Either way the head stays tied and its values unchanged."""
    from transformers import AutoModelForCausalLM

    from thesis_lib.models import tiny

    tiny.tiny_model("qwen3", seed=2, hidden=256, vocab_size=4096, tied=True, dtype=dtype).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype)
    emb = model.get_input_embeddings().weight
    saved = emb.detach().clone()
    before = _file_rss_kb(tmp_path / "model.safetensors")
    assert before >= 4096 * 256 * emb.element_size() // 1024 * 0.9
    assert pack_linears(model) > 0
    after = _file_rss_kb(tmp_path / "model.safetensors")
    if dtype == torch.bfloat16:
        assert after < 0.1 * before and model.get_output_embeddings().weight is emb, (before, after)
    else:
        assert after >= 4096 * 256 * 4 // 1024 * 0.9 and model.get_output_embeddings().weight is emb, (before, after)
    assert torch.equal(emb, saved)


@needs_bf16
def test_bf16_packing_keeps_a_tied_head_tied():
    from thesis_lib.models import tiny

    model = tiny.tiny_model("qwen3", seed=2, tied=True, dtype=torch.bfloat16)
    emb = model.get_input_embeddings().weight
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert pack_linears(model) == n_linear  # the tied head too (bf16: a packed copy beside the embedding)
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight is emb  # FlashHead clusters the embedding itself
    h = torch.randn(3, emb.shape[1], dtype=torch.bfloat16)
    torch.testing.assert_close(head(h).double(), h.double() @ emb.double().T, rtol=2 ** -7, atol=1e-2)


#: bfloat16's near tie: a forward over a block of K + 1 tokens rounds the hidden states differently from one-token
#: steps (bf16 keeps 8 significant bits), so greedy choices may part where the top two unrounded logits lie within
#: this fraction of the top logit's magnitude (four bf16 rounding steps). Seen on tiny models: 0.18 %.
BF16_NEAR_TIE = 2.0 ** -6


def exact_top2(model, ids, limit):
    """The top two unrounded logits (float32 products of the bf16 head rows and the bf16 final hidden state)
    after ``ids``, from one forward over the whole prefix."""
    with torch.inference_mode():
        h = ModelState(model, vocab_limit=limit).hidden(ids)[-1].float()
        w = model.get_output_embeddings().weight[:limit].float()
        return torch.topk(w @ h, 2).values.tolist()


@needs_bf16
@pytest.mark.parametrize("deferred", [False, True])
def test_bf16_packed_speculative_decoding_equals_target_only_up_to_near_ties(deferred):
    """Packed bf16 target and draft: speculative output is the target's own greedy output token for token, or parts
    from it only where the target's top two unrounded logits are within :data:`BF16_NEAR_TIE`."""
    from thesis_lib.decoding.drafters import ModelDrafter
    from thesis_lib.decoding.greedy import speculative_generate
    from thesis_lib.models import tiny

    target = tiny.tiny_model("qwen2", seed=0, dtype=torch.bfloat16)
    draft = tiny.noisy_copy(target, 0.02, seed=3)
    for m in (target, draft):
        assert pack_linears(m) > 0
    t = ModelState(target, vocab_limit=TINY_VOCAB)
    equal = 0
    for prompt in ([3, 4, 5], [17, 2, 99, 41, 8], [250, 1, 1, 7], [60, 61, 62, 63, 64, 65]):
        ref = greedy_generate(t, prompt, max_new_tokens=24).tokens
        got = speculative_generate(t, ModelDrafter(draft, vocab_limit=TINY_VOCAB), prompt, k=4, max_new_tokens=24,
                                   schedule="deferred" if deferred else "ordinary")
        assert got.stats.acceptance > 0.3
        if got.tokens == ref:
            equal += 1
            continue
        j = next(i for i, (a, b) in enumerate(zip(got.tokens, ref)) if a != b)
        top1, top2 = exact_top2(target, prompt + ref[:j], TINY_VOCAB)
        assert top1 - top2 < BF16_NEAR_TIE * abs(top1), (prompt, j, top1, top2)
    assert equal >= 2  # a broken verification would part on every prompt, not only at a rare near tie


def _near_tied_bf16_head(d: int = 64):
    """Rows of two tokens whose bf16 logits round to the same value while token 3's unrounded one is larger."""
    w = torch.zeros(5, d, dtype=torch.bfloat16)
    w[1, 0], w[3, 0] = 20.0, 20.0
    w[3, 1] = 0.0078125  # 2^-7: adds 2^-7 to token 3's logit, far below bf16's spacing of 1/8 at 20
    h = torch.zeros(1, d, dtype=torch.bfloat16)
    h[0, 0], h[0, 1] = 1.0, 1.0
    return w, h


def test_refined_bf16_head_picks_the_unrounded_argmax():
    """Two tokens whose logits round to the same bf16 value: the refined head picks the larger unrounded one,
    where the rounded argmax takes the lower id. Arithmetic, not hardware: it runs on every CPU (bf16 tensors
    compute everywhere; only packing them needs native bf16, the next test)."""
    w, h = _near_tied_bf16_head()
    assert float(torch.nn.functional.linear(h, w)[0, 1]) == float(torch.nn.functional.linear(h, w)[0, 3])
    rounded = DenseGreedyHead(w, refine=False)
    refined = DenseGreedyHead(w)
    assert refined.refine and int(rounded(h)) == 1 and int(refined(h)) == 3
    w[3, 1] = 0.0  # an exact tie: the lowest id, as argmax
    assert int(DenseGreedyHead(w)(h)) == 1


@needs_bf16
def test_the_refined_head_reads_a_packed_bf16_head():
    w, h = _near_tied_bf16_head()
    d = w.shape[1]
    w[3, 1] = 0.0
    packed = torch.nn.Linear(d, 5, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        packed.weight.copy_(w)
        packed.weight[3, 1] = 0.0078125
    m = torch.nn.Module()
    m.lm_head = packed
    m.get_output_embeddings = lambda: m.lm_head
    pack_linears(m)
    assert isinstance(m.lm_head, PackedLinear) and int(DenseGreedyHead.from_model(m)(h)) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_read_probe_imitates_one_layer_of_the_model_it_is_given(tiny_models, dtype):
    """precision-bench's plain-sum read (timed beside the steps): one decoder layer's linear shapes, the head's
    excepted, in the asked precision, repeated past ``min_bytes``; a packed model gives the same shapes as its
    dense self."""
    from thesis_studies.precision.bench import read_probe

    dense, packed = tiny_models[("f32", "qwen2", "target")], tiny_models[("f32p", "qwen2", "target")]
    layer = dense.model.layers[0]
    per = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    size = torch.empty((), dtype=dtype).element_size()
    for model in (dense, packed):
        nbytes, secs = read_probe(model, dtype, min_bytes=10 * per * size + 1)()
        assert nbytes == 11 * per * size and secs > 0
