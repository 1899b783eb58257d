"""Row-exact attention: a block of new tokens after a cache gives, bit for bit, what one-token steps give."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError
from thesis_lib.models import attention, loading, tiny
from thesis_lib.models.packing import pack_linears

from conftest import TINY_VOCAB, require_rows_exact


def _packed(arch: str, exact: bool = True, **kw):
    """A tiny model with packed layers and the row-exact attention (``exact``) or transformers' batched SDPA."""
    model = tiny.tiny_model(arch, seed=0, **kw)
    pack_linears(model)
    if exact:
        attention.use(model)
    else:
        model.set_attn_implementation("sdpa")
    return model


def _block_and_steps(model, prompt, block):
    """Final hidden states of ``block`` fed at once after ``prompt``, and fed one token at a time."""
    with torch.inference_mode():
        s = ModelState(model, vocab_limit=TINY_VOCAB)
        s.hidden(prompt)
        at_once = s.hidden(block)
        s.crop(len(block))
        one_by_one = torch.cat([s.hidden([t]) for t in block])
    return at_once, one_by_one


@pytest.mark.parametrize("arch,kw", [("qwen2", {}), ("qwen3", {}), ("qwen3", {"tied": True}),
                                     ("qwen2", {"heads": 4, "kv_heads": 4})])
def test_a_verified_block_equals_one_token_steps_bit_for_bit(arch, kw):
    """With oneDNN-packed float32 layers (row-exact on the AVX2 EPYC, probed here). The check has teeth: with
    transformers' batched SDPA instead, every one of these blocks differed in its last bits on the 2-core AVX2
    EPYC (60 of 60 random blocks, measured while writing this module)."""
    model = _packed(arch, **kw)
    require_rows_exact(attention.rows_exact(model, head=False), torch.float32, arch)  # hidden states: the body only
    gen = torch.Generator().manual_seed(1)
    for n_prompt, n_block in ((1, 2), (7, 5), (19, 9), (30, 13)):
        ids = torch.randint(0, TINY_VOCAB, (n_prompt + n_block,), generator=gen).tolist()
        at_once, one_by_one = _block_and_steps(model, ids[:n_prompt], ids[n_prompt:])
        assert torch.equal(at_once, one_by_one), (arch, kw, n_prompt, n_block)


def test_exact_attention_computes_what_sdpa_computes_and_keeps_a_restricting_mask():
    """Up to rounding the same numbers as transformers' SDPA, a prefill included; a mask that hides a position
    (left padding) still hides it in a block."""
    exact, sdpa = _packed("qwen2"), _packed("qwen2", exact=False)
    ids = torch.randint(0, TINY_VOCAB, (1, 14), generator=torch.Generator().manual_seed(2))
    hide = torch.ones(1, 14, dtype=torch.long)
    hide[0, 0] = 0
    outs = {}
    for name, model in (("exact", exact), ("sdpa", sdpa)):
        for block_hides in (False, True):  # the prefill always hides position 0; the block's mask may forget it
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                first = model(ids[:, :8], attention_mask=hide[:, :8], past_key_values=cache).logits
                block = model(ids[:, 8:], attention_mask=hide if block_hides else torch.ones_like(hide),
                              past_key_values=cache).logits
            outs[name, block_hides] = torch.cat([first, block], dim=1)
    for block_hides in (False, True):
        torch.testing.assert_close(outs["exact", block_hides], outs["sdpa", block_hides], rtol=1e-5, atol=1e-5)
    assert (outs["exact", True][0, 8:] - outs["exact", False][0, 8:]).abs().max() > 1e-3  # the block kept the mask


class _BatchDependent(torch.nn.Module):
    """A linear layer whose rows depend on how many rows it is given (as a kernel choosing by shape may)."""

    def __init__(self, linear):
        super().__init__()
        self.linear, self.in_features = linear, linear.in_features

    def forward(self, x):
        return self.linear(x) * (1 + 1e-6 * (x.shape[0] > 1))


class _RowByRow(torch.nn.Module):
    """A linear layer that computes each row alone: row-exact by construction (the wrapped layer is held, not
    registered, so the probe sees this module only)."""

    def __init__(self, linear):
        super().__init__()
        object.__setattr__(self, "linear", linear)
        self.in_features = linear.in_features

    def forward(self, x):
        return torch.cat([self.linear(x[i:i + 1]) for i in range(x.shape[0])])


def _probed_model(wrap):
    """A tiny model whose probed layers compute rows one by one (row-exact by construction), except its first
    block's up projection, which ``wrap`` makes."""
    model = tiny.tiny_model("qwen2", seed=0)
    layer = model.model.layers[0]
    for parent in (layer.self_attn, layer.mlp):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, _RowByRow(child))
    model.lm_head = _RowByRow(model.lm_head)
    layer.mlp.up_proj = wrap(layer.mlp.up_proj.linear)
    return model

def test_the_row_probe_passes_a_row_exact_layer_and_fails_a_batch_dependent_one():
    """Positive control: every probed layer computing rows one by one is row-exact. Negative control: one layer
    whose rows depend on the block's size makes the probe fail, whatever the others do."""
    for wrap, want in ((_RowByRow, True), (_BatchDependent, False)):
        assert attention.rows_exact(_probed_model(wrap)) is want, wrap.__name__


def test_the_loader_records_the_attention_it_set(tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path))
    default = loading.load_model("tiny:target", progress=False)
    assert default.info["attention"].startswith("row-exact")
    assert default.model.config._attn_implementation == attention.NAME
    assert isinstance(default.info["rows_exact"], bool)
    assert loading.resolved_attention("cpu") == "exact" and loading.resolved_attention("cuda:0") == "model"
    default.model.set_attn_implementation("sdpa")
    assert attention.use(default.model).startswith("row-exact")
    assert default.model.config._attn_implementation == attention.NAME


def test_the_loader_records_the_rows_floor(tmp_path, monkeypatch):
    """float32 products are padded to this CPU's float32 floor (5 with AVX-512 kernels, else 1); bf16 ones, where
    oneDNN packs them, to BF16_ROWS_FLOOR."""
    from thesis_lib.models.packing import BF16_ROWS_FLOOR, PackedLinear, bf16_packing_available, float32_rows_floor

    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path))
    wants = {"float32": float32_rows_floor()}
    if bf16_packing_available():  # without native bf16 dot products bf16 is not packed, so not padded
        wants["bfloat16"] = BF16_ROWS_FLOOR
    for dtype, want in wants.items():
        lm = loading.load_model("tiny:target", progress=False, dtype=dtype)
        assert lm.info["rows_floor"] == want and (f"padded to {want}" in lm.info["cpu_kernels"]) == (want > 1)
        assert {m.min_rows for m in lm.model.modules() if isinstance(m, PackedLinear)} == {want}


class _InexactAt(torch.nn.Module):
    """A layer whose rows equal single rows except in a block of exactly ``n`` rows (one rounding step off)."""

    def __init__(self, linear, n: int):
        super().__init__()
        object.__setattr__(self, "linear", linear)
        self.in_features, self.n = linear.in_features, n

    def forward(self, x):
        y = torch.cat([self.linear(x[i:i + 1]) for i in range(x.shape[0])])
        return torch.nextafter(y, y + 1) if x.shape[0] == self.n else y


@pytest.mark.parametrize("n", [3, 4, 7, 12])
def test_the_row_probe_covers_every_block_size_a_run_can_verify(n):
    """A layer that is off at one block size only fails the probe at that size and no other; sizes 3, 4, 7 and 12
    are blocks real runs verify (K = 4 ordinary, K sweeps, the policies' K_MAX) that a probe of 2, 5, 9 and 13
    rows never looked at."""
    model = _probed_model(lambda linear: _InexactAt(linear, n))
    by_size = attention.rows_exact_by_size(model)
    assert sorted(by_size) == list(range(2, attention.PROBED_BLOCK + 1))
    assert [m for m, ok in by_size.items() if not ok] == [n]
    assert attention.rows_exact(model) is False


def test_a_run_records_the_probe_of_every_block_it_can_verify(tmp_path, monkeypatch):
    """The loader probes blocks of 2 to PROBED_BLOCK rows at the current threads; a run whose K reaches further
    probes again up to its largest verify block (K + 1, the deferred schedule's carried token)."""
    from thesis_lib.bench import protocol

    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    lm = loading.load_model("tiny:target", progress=False)
    assert lm.info["rows_probed"]["sizes"] == [2, attention.PROBED_BLOCK]
    assert lm.info["rows_probed"]["threads"] == torch.get_num_threads()
    cfg = protocol.BenchConfig(target="tiny:target", draft="tiny:draft", modes=("baseline", "dense_deferred@k16"),
                               k=4, k_max=12, max_new_tokens=4, prompts=1, warmup=0, out=str(tmp_path / "runs"),
                               name="probe", costs=False)
    run = protocol.run(cfg, progress=False)
    for role in ("target", "draft"):
        probed = run.environment["models"][role]["rows_probed"]
        assert probed["sizes"] == [2, 17] and isinstance(run.environment["models"][role]["rows_exact"], bool)
