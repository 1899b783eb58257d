"""Low-byte layers (models.weight_only): bfloat16 or int8 weights with float32 products, or int8 weights by int8
activations rounded per block of 32 (int8-dynamic); every row of a block as that row alone, and greedy speculative
output equal to target-only output on models made of them."""

from __future__ import annotations

import pytest
import torch

from thesis_lib.errors import ConfigError
from thesis_lib.models import weight_only as wo

from conftest import TINY_VOCAB

needs_kernel = pytest.mark.skipif(not wo.available(), reason="the weight-only kernel cannot be built here")
pytestmark = needs_kernel

#: the kernel's paths this CPU can run: its own, and AVX2 forced where its own is AVX-512
PATHS = ["own", "avx2"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "avx2":
        monkeypatch.setenv(wo.FORCED_PATH_ENV, "avx2")
    return request.param


def _reference(lin: torch.nn.Linear, fmt: str) -> torch.Tensor:
    """The weights the format stores, in float64: bf16-rounded, or int8 levels times their row's scale."""
    if fmt == "bfloat16-weights":
        return lin.weight.detach().to(torch.bfloat16).double()
    if fmt == "int4-dynamic":
        q, scale = wo.quantize_int4(lin.weight)
        n, k = q.shape
        return (q.double().view(n, k // 32, 32) * scale.double()[..., None]).view(n, k)
    q, scale = wo.quantize_int8(lin.weight)
    return q.double() * scale.double()[:, None]


def _rounded_input(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """What the format multiplies, in float64: x itself, or (int8-dynamic) x rounded per block of 32 values to
    levels of the block's largest magnitude over 127 (x times 127 / amax in float32, rounded half to even: the
    kernel's own arithmetic, in torch)."""
    if fmt not in wo.DYNAMIC:
        return x.double()
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    levels = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    return (levels.double() * (amax / 127).double()).reshape(x.shape)


@pytest.mark.parametrize("fmt", list(wo.FORMATS))
@pytest.mark.parametrize("out_features", [40, 42, 257])  # a multiple of the kernel's 4-row blocks, and not
def test_products_match_float64_of_the_stored_weights(fmt, out_features, path):
    torch.manual_seed(out_features)
    lin = torch.nn.Linear(96, out_features, bias=True)
    layer = wo.WeightOnlyLinear(lin, fmt)
    assert layer.path == (1 if path == "avx2" else 0)
    x = torch.randn(2, 5, 96)
    y = layer(x)
    ref = _rounded_input(x, fmt) @ _reference(lin, fmt).T + lin.bias.double()
    assert y.dtype == torch.float32 and y.shape == (2, 5, out_features)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", list(wo.FORMATS))
def test_every_row_of_a_block_equals_that_row_alone(fmt, path):
    """Blocks of 1 to 13 rows (the kernel groups rows by up to six): each row's output is the one-row product's,
    bit for bit, at the shapes of the embedded target's layers."""
    torch.manual_seed(1)
    for n_in, n_out in ((1536, 256), (8960, 64)):
        layer = wo.WeightOnlyLinear(torch.nn.Linear(n_in, n_out), fmt)
        x = torch.randn(13, n_in)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(13)])
        ref = (_rounded_input(x, fmt) @ wo.unpack(layer.packed_weight, n_out, n_in, layer.scale, fmt).double().T
               + layer.packed_bias.double())
        torch.testing.assert_close(alone.double(), ref, rtol=1e-4, atol=1e-3)  # the right products, not just equal
        for n in range(1, 14):
            assert torch.equal(layer(x[:n]), alone[:n]), (n_in, n)


def _on_both_paths(fmt: str, seed: int, monkeypatch) -> tuple:
    """A 1536 -> 96 layer in ``fmt`` on the CPU's own path and on the forced AVX2 path, and its linear layer."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(1536, 96)
    own = wo.WeightOnlyLinear(lin, fmt)
    monkeypatch.setenv(wo.FORCED_PATH_ENV, "avx2")
    return lin, own, wo.WeightOnlyLinear(lin, fmt)


def test_the_two_paths_differ_only_in_rounding(monkeypatch):
    """AVX-512 sums 16 lanes, AVX2 8: the same products to within float32 rounding (not bit for bit)."""
    lin, own, avx2 = _on_both_paths("bfloat16-weights", 2, monkeypatch)
    x = torch.randn(3, 1536)
    torch.testing.assert_close(own(x), avx2(x), rtol=1e-5, atol=1e-5)
    ref = x.double() @ lin.weight.detach().to(torch.bfloat16).double().T + lin.bias.detach().double()
    torch.testing.assert_close(avx2(x).double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not wo.available() or not wo.kernel().vnni_path(), reason="this CPU has one int8-dynamic path")
@pytest.mark.parametrize("fmt", wo.DYNAMIC)
def test_dynamic_formats_compute_alike_on_both_paths(fmt, monkeypatch):
    """Exact integer sums and one fixed chain of block additions: the AVX2 path equals AVX-512 VNNI's bit for bit."""
    lin, own, avx2 = _on_both_paths(fmt, 4, monkeypatch)
    x = torch.randn(7, 1536) * torch.linspace(0.01, 30, 1536)  # blocks of very different magnitudes
    assert own.path == 0 and avx2.path == 1
    assert torch.equal(own(x), avx2(x))
    torch.testing.assert_close(own(x).double(), _rounded_input(x, fmt) @ _reference(lin, fmt).T
                               + lin.bias.detach().double(), rtol=1e-5, atol=1e-4)


def test_int4_rounds_each_block_of_a_row_by_its_own_magnitude():
    """Fifteen levels per block of 32 inputs: a block a thousand times smaller than its neighbour keeps its own
    resolution; levels stay in -7..7; the packed layout unpacks to levels times scales; half the int8 bytes and
    a sixteenth more for the bfloat16 scales."""
    w = torch.randn(64, 96)
    w[:, 32:64] *= 1e-3
    q, scale = wo.quantize_int4(w)
    assert q.abs().max() == 7 and (q.abs().amax(-1) > 0).all()
    deq = (q.float().view(64, 3, 32) * scale[..., None]).view(64, 96)
    assert ((deq - w).abs() <= scale.repeat_interleave(32, dim=1) / 2 + 1e-7).all()
    assert ((deq - w)[:, 32:64].abs().max() < 1e-3 * w[:, :32].abs().max() / 7)
    packed, ws = wo.pack_int4(q[:42], scale[:42])  # 42 rows: the last group padded
    assert torch.equal(wo.unpack(packed, 42, 96, ws, "int4-dynamic"), deq[:42])
    layer = wo.WeightOnlyLinear(torch.nn.Linear(96, 64), "int4-dynamic")
    assert layer.weight_bytes() == 64 * 96 // 2 + 64 * 3 * 2
    # a block of subnormal weights: its scale, rounded to bfloat16 far coarser than 2^-8, leaves a weight about ten
    # levels out; the levels still stay in -7..7 (the layout stores level + 8 in a nibble from 1 to 15)
    tiny = torch.zeros(1, 32)
    tiny[0, 0], tiny[0, 1] = -9e-40, 9e-40
    q, scale = wo.quantize_int4(tiny)
    assert float(tiny[0, 0] / scale.float()[0, 0]) < -8.5 and q.min() == -7 and q.max() == 7


def test_int8_dynamic_rounds_each_block_by_its_own_magnitude():
    """An identity-like weight reads the rounded inputs back: a block of small values keeps its own resolution
    beside a block a thousand times larger; a block of zeros stays zero."""
    k = 64
    lin = torch.nn.Linear(k, k, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(k))
    layer = wo.WeightOnlyLinear(lin, "int8-dynamic")
    x = torch.zeros(2, k)
    x[0, :32] = torch.linspace(-1e-3, 1e-3, 32)
    x[0, 32:] = torch.linspace(-1.0, 1.0, 32)
    x[1, 32:] = torch.linspace(0.0, 5.0, 32)
    y = layer(x)
    assert torch.equal(y[1, :32], torch.zeros(32))
    assert (y[0, :32] - x[0, :32]).abs().max() <= 1e-3 / 127 / 2 * 1.001  # half a level of the small block
    assert (y[0, 32:] - x[0, 32:]).abs().max() <= 1.0 / 127 / 2 * 1.001
    assert (y[0, :32] != 0).sum() >= 30  # not flushed to zero by the larger block


def test_int8_dynamic_keeps_non_finite_and_tiny_blocks_honest(path):
    """A block holding NaN or an infinity makes NaN outputs (as float32 products would); a block too small for its
    scale's reciprocal to be finite counts as zero; the other blocks are untouched."""
    torch.manual_seed(5)
    lin = torch.nn.Linear(96, 8, bias=False)
    layer = wo.WeightOnlyLinear(lin, "int8-dynamic")
    x = torch.randn(5, 96)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    x[3, 70] = -float("inf")
    x[4, 64:] = 1e-38  # 127 / 1e-38 overflows float32
    y = layer(x)
    assert torch.isnan(y[1:4]).all()
    tail = x[4].clone()
    tail[64:] = 0
    assert torch.equal(y[4], layer(tail[None])[0]) and torch.isfinite(y[[0, 4]]).all()
    with pytest.raises(RuntimeError, match="-127..127"):
        wo.kernel().pack_dynamic(torch.full((4, 32), -128, dtype=torch.int8))


def test_pack_and_unpack_invert_each_other():
    k = wo.kernel()
    q = torch.randint(-127, 128, (42, 64), dtype=torch.int8)
    packed = k.pack(q)
    assert packed.numel() == 44 * 64  # rows padded to a multiple of four
    assert torch.equal(wo.unpack(packed, 42, 64), q.float())
    w = torch.randn(8, 32).to(torch.bfloat16)
    assert torch.equal(wo.unpack(k.pack(w), 8, 32), w.float())
    dyn = k.pack_dynamic(q)
    assert dyn.numel() == 64 * 64 and dyn.dtype == torch.uint8  # rows padded to a multiple of 32
    scale = torch.rand(42) + 0.5
    assert torch.equal(wo.unpack(dyn, 42, 64, scale, "int8-dynamic"), q.float() * scale[:, None])


def test_int8_rows_are_scaled_by_their_largest_magnitude():
    w = torch.tensor([[127.0, -63.6, 0.4, 1.0], [0.0, 0.0, 0.0, 0.0], [-2.54, 1.27, 0.0, 0.01]])
    q, scale = wo.quantize_int8(w)
    assert scale.tolist() == pytest.approx([1.0, 1.0, 0.02])
    assert q.tolist() == [[127, -64, 0, 1], [0, 0, 0, 0], [-127, 64, 0, 0]]  # 0.01 / 0.02 = 0.5 rounds to even


def test_bad_layers_and_paths_are_refused(monkeypatch):
    with pytest.raises(ConfigError, match="divisible by 16"):
        wo.WeightOnlyLinear(torch.nn.Linear(40, 8), "int8-weights")
    with pytest.raises(ConfigError, match="divisible by 32"):
        wo.WeightOnlyLinear(torch.nn.Linear(48, 8), "int8-dynamic")
    with pytest.raises(ConfigError, match="Unknown weight-only format"):
        wo.WeightOnlyLinear(torch.nn.Linear(32, 8), "int4-weights")
    monkeypatch.setenv(wo.FORCED_PATH_ENV, "sse")
    with pytest.raises(ConfigError, match="only path that can be forced"):
        wo.WeightOnlyLinear(torch.nn.Linear(32, 8), "int8-weights")


def test_a_weight_only_format_on_a_gpu_is_refused_before_loading():
    from thesis_lib.models.loading import weight_format

    with pytest.raises(ConfigError, match="CPU format"):
        weight_format("int8-weights", "cuda")
    assert weight_format("bfloat16", "cpu") is None and weight_format("int8-weights", "cpu") == "int8-weights"


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_picks_int8_dynamic_where_the_kernel_builds(monkeypatch, native_bf16):
    """int8 weights by rounded int8 activations wherever the kernel builds, whatever the CPU's bf16; without the
    kernel, bfloat16 where bf16 is native and oneDNN packs it, else float32."""
    from thesis_lib.models import auto, packing

    monkeypatch.setattr(auto, "fast_bf16", lambda: native_bf16)
    monkeypatch.setattr(packing, "bf16_packing_available", lambda: native_bf16)
    name, why = auto.auto_precision()
    assert name == "int8-dynamic" and ("no native bf16" in why) != native_bf16
    monkeypatch.setattr(wo, "available", lambda: False)
    assert auto.auto_precision()[0] == ("bfloat16" if native_bf16 else "float32")


@pytest.mark.parametrize("fmt", list(wo.FORMATS))
@pytest.mark.parametrize("deferred", [False, True])
def test_speculative_decoding_on_weight_only_models_equals_target_only(fmt, deferred, path):
    """Tiny target and draft converted to a weight-only format, row-exact attention: every prompt's speculative
    output is the target's greedy output token for token (no near-tie allowance)."""
    from thesis_lib.decoding.drafters import ModelDrafter
    from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
    from thesis_lib.decoding.state import ModelState
    from thesis_lib.models import attention, tiny

    target = tiny.tiny_model("qwen2", seed=0)
    draft = tiny.noisy_copy(target, 0.01, seed=3)  # close enough that every prompt's rounds accept and reject
    # a 4-bit draft runs beside an int8-dynamic target (4-bit rounding of both would part them too far)
    for m, f, rows in ((target, "int8-dynamic" if fmt == "int4-dynamic" else fmt, False), (draft, fmt, True)):
        assert wo.convert(m, f, head_rows=rows) > 0  # the target's head as load_pair gives it (no dense rows)
        attention.use(m)
        assert m.dtype == torch.float32
        assert attention.rows_exact(m)
    t = ModelState(target, vocab_limit=TINY_VOCAB)
    for prompt in ([3, 4, 5], [17, 2, 99, 41, 8], [250, 1, 1, 7], [60, 61, 62, 63, 64, 65]):
        ref = greedy_generate(t, prompt, max_new_tokens=24).tokens
        got = speculative_generate(t, ModelDrafter(draft, vocab_limit=TINY_VOCAB), prompt, k=4, max_new_tokens=24,
                                   schedule="deferred" if deferred else "ordinary")
        st = got.stats  # rounds that accept and rounds that reject, so both paths ran
        assert any(st.accepted) and any(a < d for a, d in zip(st.accepted, st.drafted)), prompt
        if fmt != "int4-dynamic":  # a tiny random model rounded to 4 bits keeps few of its greedy choices
            assert 0.3 < st.acceptance < 1
        assert got.tokens == ref, prompt


def test_flashhead_keeps_a_weight_only_head_s_own_bfloat16_rows(tok):
    """A FlashHead for an int8 model takes its candidates from the output layer's own bfloat16 rows (half the bytes
    of their float32 widening, the same values): the same tokens as a FlashHead over the float32 rows; a caller's
    weight that is not those rows is used as given."""
    from thesis_lib.heads.flashhead import FlashHead
    from thesis_lib.heads.for_model import clustering_for, flashhead_for
    from thesis_lib.models import tiny
    from thesis_lib.models.loading import LoadedModel

    model = tiny.tiny_model("qwen2", seed=2, tied=False)
    wo.convert(model, "int8-dynamic")
    loaded = LoadedModel(spec="tiny:int8", model=model, tokenizer=tok, path=None, device="cpu", dtype="float32")
    out = model.get_output_embeddings()
    head = flashhead_for(loaded, n_clusters=17, n_probes=4, progress=False)
    assert head.weight_perm.dtype == torch.bfloat16 and head.special_weight.dtype == torch.bfloat16
    wide = FlashHead(out.weight.detach(), clustering_for(loaded, out.weight.detach(), n_clusters=17, progress=False),
                     special_ids=head.special_ids.tolist(), vocab_limit=loaded.vocab_limit, n_probes=4)
    assert wide.weight_perm.dtype == torch.float32 and torch.equal(wide.weight_perm, head.weight_perm.float())
    h = torch.randn(40, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(head(h), wide(h))
    other = out.weight.detach() * 2
    assert flashhead_for(loaded, n_clusters=17, progress=False, weight=other).weight_perm.dtype == torch.float32


@pytest.mark.parametrize("fmt,want", [("int8-dynamic", "int8-dynamic"), ("int4-dynamic", "int8-dynamic"),
                                      ("int8-weights", "int8-weights"), ("bfloat16-weights", "bfloat16-weights")])
def test_a_target_head_takes_the_body_format_and_a_draft_head_keeps_its_rows(fmt, want):
    """Without its rows (a target's) the head is in the body's format, int8-dynamic under a 4-bit body; with them
    (a draft's) in bfloat16 weights beside its dense rows."""
    from thesis_lib.models import tiny

    target, draft = tiny.tiny_model("qwen2", seed=6), tiny.tiny_model("qwen2", seed=6)
    rows = draft.get_output_embeddings().weight.detach().clone()
    wo.convert(target, fmt, head_rows=False)
    wo.convert(draft, fmt)
    t_head, d_head = target.get_output_embeddings(), draft.get_output_embeddings()
    assert (t_head.fmt, t_head.dense_weight) == (want, None)
    assert d_head.fmt == "bfloat16-weights" and torch.equal(d_head.dense_weight, rows.to(torch.bfloat16))
    assert target.model.layers[0].mlp.down_proj.fmt == fmt
    x = torch.randn(3, t_head.in_features, generator=torch.Generator().manual_seed(1))
    exact = x.double() @ rows.double().T
    assert (t_head(x).double() - exact).abs().max() < 0.03 * exact.abs().max()  # the head's logits, rounded
    if want in ("int8-dynamic", "int8-weights"):  # half the bfloat16 head's bytes (and no rows beside them)
        assert t_head.weight_bytes() < 0.6 * d_head.weight_bytes()


@needs_kernel
def test_a_head_tied_to_the_embedding_is_swapped_like_the_body_and_an_untied_one_as_a_head():
    """A tied head (Qwen3-0.6B's) gets the body's format and no dense rows, its embedding staying float32 for the
    lookup; an untied head gets the output layer's format (:func:`head_format`) with its dense rows."""
    from thesis_lib.models import tiny

    tied = tiny.tiny_model("qwen3", seed=1, tied=True)
    swapped = wo.convert(tied, "int4-dynamic")
    out, emb = tied.get_output_embeddings(), tied.get_input_embeddings()
    assert isinstance(out, wo.WeightOnlyLinear) and out.fmt == "int4-dynamic" and out.dense_weight is None
    assert type(emb) is torch.nn.Embedding and emb.weight.dtype == torch.float32
    untied = tiny.tiny_model("qwen3", seed=1, tied=False)
    assert wo.convert(untied, "int4-dynamic") == swapped
    head = untied.get_output_embeddings()
    assert head.fmt == wo.head_format("int4-dynamic") == "bfloat16-weights" and head.dense_weight is not None
