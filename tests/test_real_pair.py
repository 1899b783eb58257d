"""The embedded Qwen2.5-Coder pair: real speculative decoding equals target-only greedy decoding."""

from __future__ import annotations

import json

import pytest

from thesis_lib.bench import prompts
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.models import specs

pytestmark = pytest.mark.real

#: The models run in the precision ``DTYPE: auto`` picks (bfloat16 on a CPU with AVX-512 BF16, else float32),
#: with row-exact attention (models.attention). Where the packed layers compute a block's rows as single
#: rows (the loader probes it: info["rows_exact"]; measured true where models.cpu.rows_exact_expected says, and a
#: probe that fails there fails these tests), a verified block then computes what
#: one-token steps compute, so speculative output must equal target-only output token for token. Packed bfloat16
#: does so padded (models.packing.BF16_ROWS_FLOOR: the probe holds on the AVX-512 BF16 EPYC); unpadded it did not
#: (a few outputs of a block of 2 to 17 rows one bf16 rounding step off single rows). Where the probe fails, a
#: divergence is allowed only at a near tie of the target's top two
#: unrounded logits (magnitude ~10 to 30 here), closer than BF16_NEAR_TIE of the top logit (four bf16 rounding
#: steps of the hidden state; the greedy head re-scores near-tied tokens unrounded, heads.dense). REAL_NEAR_TIE
#: is float32's allowance under transformers' batched attention, kept for that case.
REAL_NEAR_TIE = 2e-3
BF16_NEAR_TIE = 2.0 ** -6


def _near_tie(lm, ids) -> tuple[float, float]:
    """The gap between the target's top two unrounded logits after ``ids`` (float32 products of its head rows and
    its final hidden state), and the gap this precision allows."""
    import torch

    with torch.inference_mode():
        h = ModelState(lm.model, vocab_limit=lm.vocab_limit).hidden(ids)[-1].float()
        w = lm.model.get_output_embeddings().weight[: lm.vocab_limit]
        top = torch.topk(torch.mv(w.float(), h) if w.dtype != torch.float32 else torch.mv(w, h), 2).values
    gap = float(top[0] - top[1])
    return gap, (BF16_NEAR_TIE * abs(float(top[0])) if lm.dtype == "bfloat16" else REAL_NEAR_TIE)


def test_embedded_models_are_the_pinned_files(real_pair):
    for lm, spec in zip(real_pair, (specs.DEFAULT_TARGET, specs.DEFAULT_DRAFT)):
        info = json.loads((lm.path / "thesis_lib.json").read_text())
        assert info["gguf_sha256"] == specs.resolve(spec).embedded.sha256
    target, draft = real_pair
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    assert target.model.config.num_hidden_layers == 28 and draft.model.config.num_hidden_layers == 24


def test_the_pair_runs_in_the_precision_this_cpu_supports(real_pair):
    """int8 weights by int8 activations rounded per block (int8-dynamic) wherever the project's kernel builds (the
    draft's body then in 4 bits, int4-dynamic); without it bfloat16 (oneDNN-packed,
    tied heads included) where the CPU has native bf16 dot products, else float32; the converted files are stored
    in bfloat16 for the first two (no float32 copy), in float32 for float32."""
    from thesis_lib.models import weight_only
    from thesis_lib.models.cpu import fast_bf16
    from thesis_lib.models.packing import PackedLinear

    want = "int8-dynamic" if weight_only.available() else ("bfloat16" if fast_bf16() else "float32")
    layer = weight_only.WeightOnlyLinear if want == "int8-dynamic" else PackedLinear
    for lm, asked in zip(real_pair, (want, "int4-dynamic" if want == "int8-dynamic" else want)):  # DRAFT_DTYPE auto
        assert lm.info["dtype_requested"] == asked and asked in lm.info["dtype_reason"]
        assert lm.dtype == ("bfloat16" if want == "bfloat16" else "float32")
        assert lm.info["stored_dtype"] == ("float32" if want == "float32" else "bfloat16")
        assert lm.info["attention"].startswith("row-exact")
        assert isinstance(lm.model.model.layers[0].mlp.down_proj, layer)
        tied = lm.model.config.tie_word_embeddings
        assert isinstance(lm.model.get_output_embeddings(), layer) == (want == "bfloat16" or not tied)
        assert (lm.model.get_output_embeddings().weight is lm.model.get_input_embeddings().weight) == tied


def _check_lossless(target, ids, ref, got, what):
    """``got`` equals target-only ``ref`` where attention is row-exact and the loader's probe found the layers'
    block rows equal to single rows; elsewhere it may instead part from it where the target's top two logits nearly
    tie."""
    from thesis_lib.models.cpu import rows_exact_expected

    exact = target.info["attention"].startswith("row-exact") and target.info["rows_exact"]
    assert exact or not rows_exact_expected(target.model.dtype), (what, "this kind of CPU was measured row-exact",
                                                                  target.info.get("rows_probed"))
    if exact:
        assert got == ref, (what, target.tokenizer.decode(got), target.tokenizer.decode(ref))
    if got == ref:
        return
    j = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
    assert j is not None, f"{what}: one output is a strict prefix of the other"
    gap, allowed = _near_tie(target, ids + ref[:j])
    assert gap < allowed, (what, j, gap, allowed, target.tokenizer.decode(got))


#: the library's own loop functions (not the runner) on a demo prompt, 32 new tokens, for the dense draft's two
#: schedules; every mode through the runner is below
@pytest.mark.parametrize("qid", ["demo-translation-1"])
def test_dense_draft_equals_target_only_greedy(real_pair, qid):
    target, draft = real_pair
    prompt = next(p for p in prompts.demo_prompts() if p.question_id == qid)
    ids = prompts.encode(target.tokenizer, prompt.text)
    t = ModelState(target.model, vocab_limit=target.vocab_limit)
    d = ModelDrafter(draft.model, vocab_limit=draft.vocab_limit)
    ref = greedy_generate(t, ids, max_new_tokens=32, eos_ids=target.eos_ids)
    assert len(ref.tokens) == 32 or ref.tokens[-1] in target.eos_ids
    for deferred in (False, True):
        spec = speculative_generate(t, d, ids, k=4, max_new_tokens=32, eos_ids=target.eos_ids, schedule="deferred" if deferred else "ordinary")
        _check_lossless(target, ids, ref.tokens, spec.tokens, (qid, deferred))
        assert spec.stats.acceptance > 0.2  # a real same-family draft agrees often (a broken loop would not)


#: Every greedy mode the command line accepts, by name (the thesis' drafts and schedules; chapter 6's drafters and
#: block-length policies; chapter 8's token trees), and transformers' greedy ``generate()``: each through the runner
#: the benchmark uses, on one prompt of each of five categories of the project's set, 24 new tokens, K = 4.
CATEGORIES, NEW_TOKENS = ("coding", "conversation", "math_reasoning", "qa", "translation"), 24
#: the token trees at a width and at a node count (a beam; the most probable nodes under the prior)
TREE_SHAPES = ("flash_tree@k4w2", "dense_tree@n6")


def greedy_modes() -> tuple[str, ...]:
    from thesis_lib.bench.modes import all_modes, parse

    return tuple(m for m in all_modes() if parse(m).speculative)


@pytest.fixture(scope="module")
def every_greedy_mode(real_pair):
    """Per prompt: its question id, ids, target-only greedy tokens and every greedy mode's generation (with
    ``hf_greedy``); and the FlashHead head (its default probes)."""
    from collections import Counter

    from thesis_lib.bench.runner import Runner
    from thesis_studies.beyond.adaptive import AdaptiveFlashHead
    from thesis_studies.beyond.truncated import frequency_head
    from thesis_lib.heads.for_model import flashhead_for

    target, draft = real_pair
    head = flashhead_for(draft, progress=False)
    pool = prompts.load_prompts("project")
    # the frequency head's counts from the prompt set's own tokens (the study counts generated ones; any counts do here)
    counts = Counter(t for p in pool for t in prompts.encode(target.tokenizer, p.text))
    freq = frequency_head(draft, counts, head.n_probes * head.cluster_size, head.special_ids.tolist())
    runner = Runner(target, draft, k=4, max_new_tokens=NEW_TOKENS, flash_head=head, k_max=8, stop_below=0.6,
                    extra_heads={"adaflash": AdaptiveFlashHead(head, margin=0.12, min_probes=8), "freq": freq})
    chosen = prompts.select(pool, categories=list(CATEGORIES), per_category=1)
    assert sorted(p.category for p in chosen) == sorted(CATEGORIES)
    runs = []
    for p in chosen:
        ids = prompts.encode(target.tokenizer, p.text)
        runs.append((p.question_id, ids, runner.run("baseline", ids).tokens,
                     {mode: runner.run(mode, ids) for mode in (*greedy_modes(), *TREE_SHAPES, "hf_greedy")}))
    return runs, head


def test_every_greedy_mode_equals_target_only_greedy(real_pair, every_greedy_mode):
    """Each greedy mode's output is target-only greedy output on every prompt (or parts from it only where the
    target's top two logits nearly tie), and a drafter with a model agrees often."""
    target, _ = real_pair
    runs, _ = every_greedy_mode
    assert len(greedy_modes()) >= 25 and {"shared_deferred", "flash_ordinary_sk", "freq_deferred"} <= set(greedy_modes())
    for qid, ids, ref, gens in runs:
        assert len(ref) == NEW_TOKENS or ref[-1] in target.eos_ids
        for mode, gen in gens.items():
            if mode != "hf_greedy":
                _check_lossless(target, ids, ref, gen.tokens, (qid, mode))
    accepted = {m: sum(sum(gens[m].stats.accepted) for *_, gens in runs) /
                max(1, sum(sum(gens[m].stats.drafted) for *_, gens in runs)) for m in (*greedy_modes(), *TREE_SHAPES)}
    assert all(a > 0.2 for m, a in accepted.items() if m.startswith(("dense", "flash", "shared", "adaflash"))), accepted


def test_transformers_greedy_decoding_is_the_modes_reference(real_pair, every_greedy_mode):
    """transformers' own greedy ``generate()`` on the same model gives the target-only tokens every mode is compared
    with (or parts from them only at a near tie of the target's top two logits)."""
    target, _ = real_pair
    for qid, ids, ref, gens in every_greedy_mode[0]:
        got = gens["hf_greedy"].tokens
        if got != ref:
            j = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
            assert j is not None, f"{qid}: one output is a strict prefix of the other"
            gap, allowed = _near_tie(target, ids + ref[:j])
            assert gap < allowed, (qid, j, gap, allowed)


def test_flashhead_draft_is_lossless_and_exact_with_all_probes(real_pair, every_greedy_mode):
    """The FlashHead draft (our cached clustering of the real draft head, C = 9496, default 593 probes): both
    schedules give exactly target-only greedy output; on the draft's real hidden states all probes give the
    dense argmax and the default probes nearly always do."""
    import torch

    from thesis_lib.heads.dense import DenseGreedyHead

    target, draft = real_pair
    runs, head = every_greedy_mode
    _, ids, ref, gens = next(r for r in runs if r[0].startswith("tc-code"))
    assert (head.n_clusters, head.cluster_size, head.n_probes) == (9496, 16, 593)
    for mode in ("flash_ordinary", "flash_deferred"):
        assert gens[mode].tokens == ref, mode
        assert gens[mode].stats.acceptance > 0.2, mode
    # on the draft's real hidden states: all probes = the dense argmax; default probes agree on nearly all
    state = ModelState(draft.model, vocab_limit=draft.vocab_limit)
    with torch.inference_mode():
        h = state.hidden(ids + ref)
        dense = DenseGreedyHead.from_model(draft.model, draft.vocab_limit)(h)
        assert (torch.cat([head(h[i : i + 1]) for i in range(h.shape[0])]) == dense).float().mean() > 0.9
        head.with_probes(head.n_clusters)
        full = torch.cat([head(h[i : i + 1]) for i in range(h.shape[0])])
        head.with_probes(593)
    if not torch.equal(full, dense):  # only a float near-tie may differ (fused vs oneDNN summation order)
        w = draft.model.get_output_embeddings().weight.detach()[: draft.vocab_limit]
        for i in torch.nonzero(full != dense).flatten().tolist():
            top = torch.topk(torch.mv(w.float(), h[i].float()), 2).values
            allowed = BF16_NEAR_TIE * abs(float(top[0])) if draft.dtype == "bfloat16" else REAL_NEAR_TIE
            assert float(top[0] - top[1]) < allowed


def test_batched_speculative_decoding_is_lossless_per_row(real_pair, every_greedy_mode):
    """Three demo prompts decoded at once (decoding.batched), the FlashHead draft deferred and the dense draft
    ordinary, 12 new tokens, one row ended early by a token of its own output taken as end-of-sequence: every row
    is its prompt's one-row target-only output, and the rows' rounds differ."""
    from thesis_studies.serving.loops import batched_greedy, batched_speculative
    from thesis_lib.decoding.rounds import cut_at_eos

    target, draft = real_pair
    head = every_greedy_mode[1]
    ids = [prompts.encode(target.tokenizer, p.text) for p in prompts.demo_prompts()[:3]]
    t = ModelState(target.model, vocab_limit=target.vocab_limit)
    plain = [greedy_generate(t, x, max_new_tokens=12, eos_ids=target.eos_ids).tokens for x in ids]
    eos = frozenset(target.eos_ids) | {plain[1][4]}  # the second row ends at its fifth token (or before)
    refs = [cut_at_eos(r, eos)[0] for r in plain]
    assert len(refs[1]) <= 5 < max(map(len, refs))
    assert [g.tokens for g in batched_greedy(t, ids, max_new_tokens=12, eos_ids=eos).generations] == refs
    for name, h, schedule in (("flash", head, "deferred"), ("dense", None, "ordinary")):
        d = ModelState(draft.model, head=h, vocab_limit=draft.vocab_limit)
        run = batched_speculative(t, d, ids, k=4, max_new_tokens=12, eos_ids=eos, schedule=schedule, name=name)
        for x, ref, g in zip(ids, refs, run.generations):
            _check_lossless(target, x, ref, g.tokens, (name, schedule, "batched"))
        assert sum(sum(g.stats.accepted) for g in run.generations) > 0.2 * sum(sum(g.stats.drafted) for g in run.generations)
        assert len({tuple(g.stats.accepted) for g in run.generations}) > 1
