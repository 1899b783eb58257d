"""The decoding loops on tiny models: losslessness, stats invariants, EOS and length limits, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thesis_lib.decoding.drafters import ModelDrafter
from thesis_studies.beyond.lookup import HybridDrafter, NgramDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError
from thesis_lib.models.attention import rows_exact

from conftest import TINY_VOCAB, require_rows_exact

#: Exact-equality tests use the float64 models and the packed float32 models with row-exact attention ("f32x",
#: what the loader gives a CPU model: a verified block computes each position as a one-token step does). With
#: plain float32 (MKL can even round differently from one run to the next) or transformers' batched attention,
#: a K-token forward may round differently from K one-token forwards: any divergence from the target-only output
#: must then sit where the target's top-two logits differ by less than this.
NEAR_TIE = 1e-4
DRAFTS = ("same", "close", "loose", "independent")
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _run_both(models, tag, arch, draft, prompt, k, max_new, eos, deferred, buckets=None):
    target = ModelState(models[(tag, arch, "target")], vocab_limit=TINY_VOCAB, buckets=buckets)
    drafter = ModelDrafter(models[(tag, arch, draft)], vocab_limit=TINY_VOCAB)
    ref = greedy_generate(target, prompt, max_new_tokens=max_new, eos_ids=eos)
    spec = speculative_generate(target, drafter, prompt, k=k, max_new_tokens=max_new, eos_ids=eos, schedule="deferred" if deferred else "ordinary")
    return ref, spec


def _top2_gap(model, ids) -> float:
    """Gap between the target's two largest logits (within the tokenizer) after ``ids``, in float64."""
    with torch.inference_mode():
        logits = _f64(model)(torch.tensor([ids])).logits[0, -1, :TINY_VOCAB]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


_F64 = {}


def _f64(model):
    import copy

    if id(model) not in _F64:
        _F64[id(model)] = copy.deepcopy(model).double()
    return _F64[id(model)]


def check_stats(gen, k, max_new):
    s = gen.stats
    assert s.new_tokens == len(gen.tokens) <= max_new
    assert 1 + sum(s.emitted) + s.tail_tokens == len(gen.tokens)  # the first token comes from the prefill
    assert all(0 <= a <= d <= k for a, d in zip(s.accepted, s.drafted))
    assert all(1 <= e <= d + 1 for e, d in zip(s.emitted, s.drafted))
    assert s.tail_tokens <= 1
    assert s.zero_accept_rounds + s.full_accept_rounds <= s.rounds
    assert s.ttft_s > 0 and s.decode_s >= 0
    # the target's calls: a deferred round is one verify forward, and only a last lone token needs an append; an
    # ordinary round verifies or skips, and each emitted round's final token (and a lone last one) is appended
    if s.mode.endswith("_deferred"):
        assert s.verify_calls == s.rounds and s.skipped == 0 and s.append_calls == s.tail_tokens
    else:
        assert s.verify_calls + s.skipped == s.rounds and s.append_calls == s.rounds + s.tail_tokens


prompts = st.lists(st.integers(0, TINY_VOCAB - 1), min_size=1, max_size=24)


@HYP
@given(prompt=prompts, k=st.integers(1, 8), max_new=st.integers(1, 40), draft=st.sampled_from(DRAFTS),
       arch=st.sampled_from(("qwen2", "qwen3")), deferred=st.booleans(), eos_at=st.none() | st.integers(0, 39))
def test_speculative_equals_greedy_exactly_in_float64(tiny_models, prompt, k, max_new, draft, arch, deferred, eos_at):
    eos = ()
    if eos_at is not None:  # make the token at position eos_at of the plain output an EOS token
        plain = greedy_generate(ModelState(tiny_models[("f64", arch, "target")], vocab_limit=TINY_VOCAB), prompt,
                                max_new_tokens=max_new).tokens
        eos = (plain[min(eos_at, len(plain) - 1)],)
    ref, spec = _run_both(tiny_models, "f64", arch, draft, prompt, k, max_new, eos, deferred)
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)
    if eos:
        assert ref.tokens[-1] in eos or len(ref.tokens) == max_new
        assert sum(t in eos for t in spec.tokens) <= 1 and (spec.tokens[-1] in eos) == (ref.stats.stopped_by == "eos")
    s = spec.stats
    if deferred:
        assert s.skipped == 0 and s.verify_calls == s.rounds and s.append_calls <= 1
    else:
        assert s.verify_calls + s.skipped == s.rounds
        # an append after the first token, then after every round except one that ended the output
        expected = 0 if len(spec.tokens) == 1 else s.rounds + (1 if s.tail_tokens else 0)
        assert s.append_calls == expected



class _CheckedDrafter(ModelDrafter):
    """A model drafter that checks, at every proposal, that its cache holds exactly the emitted prefix: its block
    equals the block a fresh drafter (no cache history) proposes from that prefix."""

    def begin(self, context):
        super().begin(context)
        self.prefix, self.fresh, self.checked = list(context), ModelDrafter(self.state.model, vocab_limit=TINY_VOCAB), 0

    def propose(self, k):
        y = super().propose(k)
        self.fresh.begin(self.prefix)
        assert self.fresh.propose(k) == y, ("the draft's cache drifted from the emitted prefix", len(self.prefix))
        self.checked += 1
        return y

    def observe(self, accepted, final_token):
        self.prefix += self._proposed[:accepted] + [final_token]
        super().observe(accepted, final_token)


def _teacher_forced_rounds(draft, prompt, out, k, max_new):
    """The rounds a greedy chain draft must produce on the output ``out``: the draft's own greedy prediction at
    every output position (one forward over prompt + output), walked round by round as the loop walks them
    (blocks of min(K, left - 1), accepted while prediction == output, EOS-cut at the output's end)."""
    with torch.inference_mode():
        logits = draft(torch.tensor([list(prompt) + list(out)])).logits[0, :, :TINY_VOCAB]
    pred = logits.argmax(-1).tolist()[len(prompt) - 1:]  # pred[i]: the draft's token after prompt + out[:i]
    rounds, n, tail = [], 1, 0
    while n < len(out):
        kk = min(k, max_new - n - 1)
        if kk == 0:
            tail = 1
            break
        a = 0
        while a < kk and n + a < len(out) and pred[n + a] == out[n + a]:
            a += 1
        emitted = min(a + 1, len(out) - n)
        rounds.append((kk, min(a, emitted), emitted))
        n += emitted
    return rounds, tail


@HYP
@given(prompt=prompts, k=st.integers(1, 8), max_new=st.integers(1, 40), draft=st.sampled_from(DRAFTS),
       arch=st.sampled_from(("qwen2", "qwen3")), schedule=st.sampled_from(("ordinary", "deferred", "pipelined")),
       eos_at=st.none() | st.integers(0, 39))
def test_the_draft_side_follows_the_output_and_the_counts_follow_the_draft(tiny_models, prompt, k, max_new, draft,
                                                                           arch, schedule, eos_at):
    """Losslessness cannot see a drifted draft (verification corrects every wrong proposal), so the draft side is
    pinned too: at every round the draft's cache holds exactly the emitted prefix, and each round's drafted,
    accepted and emitted counts (and the ordinary schedule's skips) are what the draft's own predictions on the
    output give, EOS-ended outputs included (float64 models)."""
    target = ModelState(tiny_models[("f64", arch, "target")], vocab_limit=TINY_VOCAB)
    eos = ()
    if eos_at is not None:
        plain = greedy_generate(target, prompt, max_new_tokens=max_new).tokens
        eos = (plain[min(eos_at, len(plain) - 1)],)
    drafter = _CheckedDrafter(tiny_models[("f64", arch, draft)], vocab_limit=TINY_VOCAB)
    gen = speculative_generate(target, drafter, prompt, k=k, max_new_tokens=max_new, eos_ids=eos, schedule=schedule)
    s = gen.stats
    rounds, tail = _teacher_forced_rounds(tiny_models[("f64", arch, draft)], prompt, gen.tokens, k, max_new)
    assert list(zip(s.drafted, s.accepted, s.emitted)) == rounds and s.tail_tokens == tail
    assert drafter.checked == len(rounds)
    assert s.skipped == (0 if schedule == "deferred" else sum(a == 0 for _, a, _ in rounds))


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_counts_stop_at_an_eos_inside_an_accepted_block(tiny_models, schedule):
    """An identical draft proposes the EOS token and the tokens after it, and the target accepts them all: the
    round counts the accepted tokens up to the EOS only (what was emitted), not the whole accepted block."""
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    prompt = [5, 6, 7, 8]
    plain = greedy_generate(target, prompt, max_new_tokens=12).tokens
    at = next(i for i in range(2, 6) if plain[i] not in plain[:i])  # an EOS inside the first block of 6
    drafter = ModelDrafter(tiny_models[("f64", "qwen2", "same")], vocab_limit=TINY_VOCAB)
    gen = speculative_generate(target, drafter, prompt, k=6, max_new_tokens=12, eos_ids=(plain[at],),
                               schedule=schedule)
    assert gen.tokens == plain[:at + 1]
    assert (gen.stats.drafted, gen.stats.accepted, gen.stats.emitted) == ([6], [at], [at])

@HYP
@given(prompt=prompts, k=st.integers(1, 8), max_new=st.integers(1, 40), draft=st.sampled_from(DRAFTS),
       arch=st.sampled_from(("qwen2", "qwen3")), deferred=st.booleans(), bucketed=st.booleans(),
       tag=st.sampled_from(("f32", "f32p")))
def test_float32_divergence_only_at_near_ties(tiny_models, prompt, k, max_new, draft, arch, deferred, bucketed, tag):
    ref, spec = _run_both(tiny_models, tag, arch, draft, prompt, k, max_new, (), deferred,
                          buckets=None if bucketed else {})
    check_stats(spec, k, max_new)
    if spec.tokens != ref.tokens:
        j = next(i for i, (a, b) in enumerate(zip(spec.tokens, ref.tokens)) if a != b)
        gap = _top2_gap(tiny_models[("f32", arch, "target")], list(prompt) + ref.tokens[:j])
        assert gap < NEAR_TIE, f"divergence at {j} where the target's top-2 logit gap is {gap:.2e}"


@HYP
@given(prompt=prompts, k=st.integers(1, 8), max_new=st.integers(1, 40), draft=st.sampled_from(DRAFTS),
       arch=st.sampled_from(("qwen2", "qwen3")), deferred=st.booleans())
def test_speculative_equals_greedy_exactly_in_packed_float32_with_exact_attention(tiny_models, prompt, k, max_new,
                                                                                   draft, arch, deferred):
    require_rows_exact(rows_exact(tiny_models[("f32x", arch, "target")]), torch.float32, arch)
    ref, spec = _run_both(tiny_models, "f32x", arch, draft, prompt, k, max_new, (), deferred)
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_identical_draft_accepts_everything(tiny_models, arch, deferred, k):
    ref, spec = _run_both(tiny_models, "f64", arch, "same", [5, 6, 7, 8], k, 40, (), deferred)
    s = spec.stats
    assert spec.tokens == ref.tokens
    assert s.acceptance == 1.0
    assert s.skipped == 0 and s.zero_accept_rounds == 0
    # every full-length round emits K + 1 tokens; only the last may be shorter (max_new_tokens)
    assert all(e == k + 1 for e, d in zip(s.emitted, s.drafted) if d == k)
    assert all(d == k for d in s.drafted[:-1])
    if deferred:
        assert s.append_calls == 0 or (s.append_calls == 1 and s.tail_tokens == 1)


def test_independent_draft_is_still_lossless_and_skips(tiny_models):
    ref, spec = _run_both(tiny_models, "f64", "qwen2", "independent", [1, 2, 3], 4, 30, (), False)
    assert spec.tokens == ref.tokens
    assert spec.stats.skipped > 0 and spec.stats.acceptance < 0.5


def test_deferred_saves_appends(tiny_models):
    _, ordinary = _run_both(tiny_models, "f64", "qwen2", "close", [9, 8, 7], 4, 40, (), False)
    _, deferred = _run_both(tiny_models, "f64", "qwen2", "close", [9, 8, 7], 4, 40, (), True)
    assert ordinary.tokens == deferred.tokens
    assert ordinary.stats.append_calls >= ordinary.stats.rounds  # one per round, plus the first token's
    assert deferred.stats.append_calls <= 1


def test_padding_rows_never_win(tiny_models):
    """Rows of the embedding matrix past the tokenizer's size must never be chosen, by target or draft."""
    import copy

    target = copy.deepcopy(tiny_models[("f64", "qwen2", "target")])
    draft = copy.deepcopy(tiny_models[("f64", "qwen2", "close")])
    for m in (target, draft):
        with torch.no_grad():
            m.lm_head.weight[TINY_VOCAB:] = 50.0  # padding rows would win every argmax if reachable
    t = ModelState(target, vocab_limit=TINY_VOCAB)
    ref = greedy_generate(t, [3, 4, 5], max_new_tokens=20)
    spec = speculative_generate(t, ModelDrafter(draft, vocab_limit=TINY_VOCAB), [3, 4, 5], k=4, max_new_tokens=20)
    assert max(ref.tokens) < TINY_VOCAB and max(spec.tokens) < TINY_VOCAB
    assert spec.tokens == ref.tokens
    unlimited = greedy_generate(ModelState(target), [3, 4, 5], max_new_tokens=5)
    assert max(unlimited.tokens) >= TINY_VOCAB  # the check above can fail: without the limit they do win


def test_bucketed_forward_matches_plain(tiny_models):
    """Padding a 3-token block to 4 (CPU shape bucket) leaves the real positions' outputs and cache as before."""
    model = tiny_models[("f64", "qwen2", "target")]
    plain, padded = ModelState(model, buckets={}), ModelState(model, buckets={3: 4})
    for s in (plain, padded):
        s.greedy([1, 2, 3, 4, 5])
    a, b = plain.hidden([6, 7, 8]), padded.hidden([6, 7, 8])
    assert padded.length == plain.length == 8 and padded.cache.get_seq_length() == 8
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(plain.hidden([9]), padded.hidden([9]))


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined", None])
def test_a_generation_says_why_it_stopped_and_how_long_it_took(tiny_models, schedule):
    """stopped_by names the limit or the EOS that ended the output; the first token's time and the decode time are
    parts of the call's own wall time, in order (a wrong difference of clock readings would not fit inside it)."""
    import time

    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)

    def generate(eos):
        if schedule is None:
            return greedy_generate(target, [5, 6, 7, 8], max_new_tokens=10, eos_ids=eos)
        drafter = ModelDrafter(tiny_models[("f64", "qwen2", "close")], vocab_limit=TINY_VOCAB)
        return speculative_generate(target, drafter, [5, 6, 7, 8], k=3, max_new_tokens=10, eos_ids=eos,
                                    schedule=schedule)

    t0 = time.perf_counter()
    full = generate(())
    wall = time.perf_counter() - t0
    assert full.stats.stopped_by == "max_new_tokens" and len(full.tokens) == 10
    assert 0 < full.stats.ttft_s and 0 < full.stats.decode_s and full.stats.ttft_s + full.stats.decode_s <= wall
    at = next(i for i in range(1, 10) if full.tokens[i] not in full.tokens[:i])
    ended = generate((full.tokens[at],))
    assert ended.stats.stopped_by == "eos" and ended.tokens == full.tokens[:at + 1]


@pytest.mark.parametrize("bad_k", [0, -1, 2.5])
def test_bad_k_is_rejected(tiny_models, bad_k):
    t = ModelState(tiny_models[("f32", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    d = ModelDrafter(tiny_models[("f32", "qwen2", "close")], vocab_limit=TINY_VOCAB)
    with pytest.raises(ConfigError, match="K"):
        speculative_generate(t, d, [1, 2], k=bad_k, max_new_tokens=8)


def test_bad_lengths_are_rejected(tiny_models):
    t = ModelState(tiny_models[("f32", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        greedy_generate(t, [1, 2], max_new_tokens=0)
    with pytest.raises(ConfigError, match=r"^The prompt is empty: at least one token is needed\.$"):
        greedy_generate(t, [], max_new_tokens=4)


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(max_ngram=3)
    d.begin([5, 6, 7, 8, 1, 2, 5, 6])
    assert d.propose(3) == [7, 8, 1]  # [2, 5, 6] never seen before; [5, 6] was, followed by 7, 8, 1
    d.observe(2, 9)
    assert d.history == [5, 6, 7, 8, 1, 2, 5, 6, 7, 8, 9]
    d.begin([1, 2, 3])
    assert d.propose(2) == [3, 3] and d.matched == 1 and d.rounds == 2  # no match: padded with the last token
    d.begin([4, 1, 4])
    assert d.propose(4) == [1, 4, 4, 4]  # the match runs out after two tokens
    with pytest.raises(ValueError, match=r"^need 1 <= min_ngram <= max_ngram, got 2, 1$"):
        NgramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match=r"got 0, 3$"):
        NgramDrafter(max_ngram=3, min_ngram=0)
    one = NgramDrafter(max_ngram=1, min_ngram=1)  # the smallest lookup: the last token alone
    one.begin([4, 7, 9, 4])
    assert one.propose(2) == [7, 9]


@HYP
@given(prompt=prompts, k=st.integers(1, 6), max_new=st.integers(1, 40), deferred=st.booleans())
def test_ngram_drafter_is_lossless(tiny_models, prompt, k, max_new, deferred):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    ref = greedy_generate(target, prompt, max_new_tokens=max_new)
    spec = speculative_generate(target, NgramDrafter(), prompt, k=k, max_new_tokens=max_new, schedule="deferred" if deferred else "ordinary")
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)


@HYP
@given(prompt=prompts, k=st.integers(1, 6), max_new=st.integers(1, 40), deferred=st.booleans())
def test_hybrid_drafter_is_lossless(tiny_models, prompt, k, max_new, deferred):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    ref = greedy_generate(target, prompt + prompt, max_new_tokens=max_new)  # a repeated prompt: lookups happen
    model = ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB)
    hybrid = HybridDrafter(model)
    spec = speculative_generate(target, hybrid, prompt + prompt, k=k, max_new_tokens=max_new, schedule="deferred" if deferred else "ordinary")
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)
    assert hybrid.lookup_rounds + hybrid.model_rounds == spec.stats.rounds


def test_hybrid_drafter_uses_lookup_only_where_text_repeats(tiny_models):
    model = ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB)
    hybrid = HybridDrafter(model, min_ngram=2)
    hybrid.begin([3, 4, 5, 6, 7, 3, 4])
    assert hybrid.propose(3) == [5, 6, 7] and hybrid.lookup_rounds == 1  # [3, 4] seen before
    hybrid.observe(1, 9)  # accepted 5, then 9: the model must be fed the prompt, 5 and 9
    assert model.pending == [3, 4, 5, 6, 7, 3, 4, 5, 9]
    block = hybrid.propose(2)  # [5, 9] never seen: the model drafts
    assert hybrid.model_rounds == 1 and len(block) == 2 and model.pending == []
    single = HybridDrafter(ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB), min_ngram=2)
    single.begin([3, 4, 5, 6, 7, 3, 4])
    assert single.propose(1) == [5] and single.lookup_rounds == 1  # a block of one is looked up too


def test_the_hybrid_modes_look_up_suffixes_of_two_and_three_tokens(tiny_models):
    """The runner's hybrid drafters take the default n-gram lengths: a repeated pair is enough, and a three-token
    match is preferred to a longer one's continuation."""
    def hybrid():
        return HybridDrafter(ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB))

    pair = hybrid()
    pair.begin([1, 2, 9, 5, 1, 2])  # only the pair [1, 2] occurred before
    assert pair.propose(2) == [9, 5] and pair.lookup_rounds == 1
    three = hybrid()
    three.begin([7, 1, 2, 3, 8, 9, 1, 2, 3, 6, 7, 1, 2, 3])  # [7, 1, 2, 3] continues with 8, [1, 2, 3] last with 6
    assert three.propose(3) == [6, 7, 1]
    short = hybrid()  # a match that runs out before K is padded with its last token, as the plain lookup pads
    short.begin([5, 6, 7, 5, 6])
    assert short.propose(5) == [7, 5, 6, 6, 6]


@pytest.mark.parametrize("policy", ["heuristic", "cost"])
def test_adaptive_k_is_lossless_and_follows_its_rule(tiny_models, policy):
    from thesis_studies.beyond import policies

    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    drafter = ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB)
    prompt = [1, 5, 9, 2, 7]
    ref = greedy_generate(target, prompt, max_new_tokens=60)
    verify = {n: 1.0 + 0.05 * n for n in range(1, 14)}
    pol = (policies.HeuristicK(2) if policy == "heuristic"
           else policies.CostModelK(2, draft_step_s=0.2, verify_s=verify, k_max=12))
    spec = speculative_generate(target, drafter, prompt, k=2, max_new_tokens=60, schedule="deferred", k_policy=pol)
    assert spec.tokens == ref.tokens
    d, a = spec.stats.drafted, spec.stats.accepted
    if policy == "heuristic":  # each round's K follows from the previous round (cut only by the end)
        k, e = 2, spec.stats.emitted
        for i in range(len(d)):
            assert d[i] == min(k, 60 - (1 + sum(e[:i])) - 1)
            k = min(16, k + 2) if a[i] == d[i] else max(1, k - 1)
    assert len(set(d)) > 1  # the block length did change


def test_cost_model_k_prefers_long_blocks_when_drafting_is_cheap_and_acceptance_high():
    from thesis_studies.beyond import policies

    verify = {n: 1.0 + 0.02 * n for n in range(1, 14)}
    cheap = policies.CostModelK(4, draft_step_s=0.01, verify_s=verify, k_max=12)
    dear = policies.CostModelK(4, draft_step_s=0.5, verify_s=verify, k_max=12)
    assert cheap.best_k(0.9) > dear.best_k(0.9) >= 1
    assert cheap.best_k(0.95) > cheap.best_k(0.3)  # the alpha asked about, not the running estimate
    assert dear.best_k(0.05) == 1
    for _ in range(10):
        cheap.update(0, 4)  # every first draft rejected: alpha falls
    assert cheap.alpha < 0.1
    with pytest.raises(ConfigError, match=r"verify costs missing for \[2, 3, 4\]\.\.\. tokens \(need 1\.\.13\)"):
        policies.CostModelK(4, draft_step_s=0.1, verify_s={1: 1.0}, k_max=12)



def test_the_cost_model_k_costs_its_own_schedule_s_rounds():
    """Deferred rounds verify K + 1 tokens, ordinary ones K and append one. Where a verify of five tokens costs
    three of four (alpha 0.9, a draft step at 0.05): deferred, K = 3 gives 3.44 tokens for 1.15 and K = 4 gives 4.10
    for 3.2, so 3; ordinary, K = 4 gives 4.10 for 2.2 against 3.44 for 2.15, so 4. K = 1 is a block too."""
    from thesis_studies.beyond import policies

    kw = dict(draft_step_s=0.05, verify_s={n: 1.0 if n <= 4 else 3.0 for n in range(1, 14)}, k_max=12)
    assert policies.CostModelK(4, deferred=True, **kw).best_k(0.9) == 3
    assert policies.CostModelK(4, deferred=False, **kw).best_k(0.9) == 4
    assert policies.CostModelK(1, **kw).first() == 1
    with pytest.raises(ConfigError, match="1 <= K <= k_max"):
        policies.CostModelK(0, **kw)

def test_policies_by_name_and_their_errors():
    """make_policy: each name gives its policy; the cost model without measured costs, and an unknown name, fail
    with a message that says what is missing."""
    from thesis_studies.beyond import policies

    verify = {n: 1.0 + 0.02 * n for n in range(1, 14)}
    fixed = policies.make_policy("fixed", 3)
    assert (fixed.first(), fixed.update(0, 3), fixed.update(3, 3)) == (3, 3, 3)
    heuristic = policies.make_policy("heuristic", 3)
    assert (heuristic.first(), heuristic.update(3, 3), heuristic.update(1, 5), heuristic.first()) == (3, 5, 4, 3)
    flash = policies.make_policy("cost", 3, {"flash_step_s": 0.01, "draft_step_s": 0.5, "verify_s": verify},
                                 draft="flash")
    dense = policies.make_policy("cost", 3, {"draft_step_s": 0.5, "verify_s": verify})
    assert flash.best_k(0.9) > dense.best_k(0.9)  # the FlashHead step's own cost, not the dense one's
    with pytest.raises(ConfigError,
                       match=r"^The cost-model K policy needs measured step costs \(costs\.measure_costs\)\.$"):
        policies.make_policy("cost", 3)
    with pytest.raises(ConfigError, match="Unknown K policy 'eager'"):
        policies.make_policy("eager", 3)


@pytest.mark.parametrize("k", [0, -1, 2.0, "2", None])
def test_a_policy_refuses_a_k_that_is_not_a_whole_number_of_at_least_one(k):
    """K = 1 is the smallest block each policy takes; 0, a negative, a float and a string are refused by name."""
    from thesis_studies.beyond import policies

    assert policies.FixedK(1).first() == 1 and policies.HeuristicK(1, k_max=1).first() == 1
    with pytest.raises(ConfigError, match=r"K=3, k_max=2"):
        policies.HeuristicK(3, k_max=2)
    with pytest.raises(ConfigError, match=r"^K must be an integer >= 1, got "):
        policies.FixedK(k)
    with pytest.raises(ConfigError, match=r"^need 1 <= K <= k_max, got K="):
        policies.HeuristicK(k, k_max=16)


def test_a_one_token_context_has_nothing_to_prefill(tiny_models):
    """A drafter whose context is a single token prefills nothing (the token waits for the first proposal, which
    then feeds it); its proposals are those of a drafter that never prefilled."""
    model = tiny_models[("f64", "qwen2", "close")]
    a, b = ModelDrafter(model, vocab_limit=TINY_VOCAB), ModelDrafter(model, vocab_limit=TINY_VOCAB)
    a.begin([7])
    a.prefill()
    assert a.state.length == 0 and a.pending == [7]
    b.begin([7])
    assert a.propose(3) == b.propose(3)


@HYP
@given(prompt=prompts, k=st.integers(1, 8), max_new=st.integers(1, 40), deferred=st.booleans(),
       stop=st.sampled_from([0.2, 0.5, 0.9]), draft=st.sampled_from(["close", "loose"]))
def test_confidence_stopped_blocks_are_lossless(tiny_models, prompt, k, max_new, deferred, stop, draft):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    ref = greedy_generate(target, prompt, max_new_tokens=max_new)
    drafter = ModelDrafter(tiny_models[("f64", "qwen2", draft)], vocab_limit=TINY_VOCAB, stop_below=stop)
    spec = speculative_generate(target, drafter, prompt, k=k, max_new_tokens=max_new, schedule="deferred" if deferred else "ordinary")
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)


def test_confidence_stop_ends_a_block_at_the_first_unsure_token(tiny_models):
    model = tiny_models[("f64", "qwen2", "loose")]
    plain = ModelDrafter(model, vocab_limit=TINY_VOCAB)
    plain.begin([1, 5, 9, 2, 7])
    block = plain.propose(8)
    # the draft's own probabilities of its 8 greedy tokens, one forward over the prompt and the block
    with torch.inference_mode():
        logits = model(torch.tensor([[1, 5, 9, 2, 7] + block[:-1]])).logits[0, 4:, :TINY_VOCAB].double()
    probs = torch.softmax(logits, -1).amax(-1).tolist()
    assert [int(t) for t in logits.argmax(-1)] == block
    tau = sorted(probs)[3]  # a threshold some of the block's tokens fall below
    first_low = next(i for i, p in enumerate(probs) if p < tau)
    stopper = ModelDrafter(model, vocab_limit=TINY_VOCAB, stop_below=tau)
    stopper.begin([1, 5, 9, 2, 7])
    assert stopper.propose(8) == block[:first_low + 1]  # the unsure token is still proposed, then the block ends
    assert stopper.stopped_early == 1
    stopper.observe(first_low + 1, 3)  # all accepted: the last proposal and the bonus token wait to be fed
    assert stopper.pending == [block[first_low], 3]
    assert stopper.state.length == 5 + first_low


def test_confidence_stop_needs_a_probability_and_a_head_that_gives_one(tiny_models):
    from thesis_studies.beyond.truncated import TruncatedHead

    model = tiny_models[("f64", "qwen2", "loose")]
    for bad in (0.0, 1.0, -0.5, 2):
        with pytest.raises(ConfigError, match="stop_below"):
            ModelDrafter(model, vocab_limit=TINY_VOCAB, stop_below=bad)
    head = TruncatedHead(model.get_output_embeddings().weight, range(20))
    with pytest.raises(ConfigError, match="no confidence"):
        ModelDrafter(model, head=head, vocab_limit=TINY_VOCAB, stop_below=0.5)


class _BadDrafter:
    name = "bad"

    def __init__(self, n):
        self.n = n

    def begin(self, context):
        pass

    def propose(self, k):
        return [1] * (self.n if self.n is not None else k + 1)

    def observe(self, accepted, final_token):
        pass


@pytest.mark.parametrize("n", [0, None])
def test_a_drafter_proposing_too_few_or_too_many_tokens_is_an_error(tiny_models, n):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    with pytest.raises(RuntimeError, match="proposed"):
        speculative_generate(target, _BadDrafter(n), [1, 5, 9], k=3, max_new_tokens=10, schedule="deferred")


@HYP
@given(prompt=prompts, k=st.integers(1, 10), max_new=st.integers(1, 40), deferred=st.booleans())
def test_unpadded_hybrid_with_confidence_stops_is_lossless(tiny_models, prompt, k, max_new, deferred):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    ref = greedy_generate(target, prompt + prompt, max_new_tokens=max_new)
    model = ModelDrafter(tiny_models[("f64", "qwen2", "loose")], vocab_limit=TINY_VOCAB, stop_below=0.5)
    hybrid = HybridDrafter(model, pad=False)
    spec = speculative_generate(target, hybrid, prompt + prompt, k=k, max_new_tokens=max_new, schedule="deferred" if deferred else "ordinary")
    assert spec.tokens == ref.tokens
    check_stats(spec, k, max_new)
    assert hybrid.lookup_rounds + hybrid.model_rounds == spec.stats.rounds


def test_unpadded_lookup_proposes_only_what_matched():
    d = NgramDrafter(pad=False)
    d.begin([2, 5, 6, 7, 8, 1, 4, 5, 6])
    assert d.propose(6) == [7, 8, 1, 4, 5, 6]
    d.observe(0, 3)
    assert d.propose(4) == [3]  # no match: one guess, not a padded block


def test_an_empty_block_is_empty_for_every_drafter(tiny_models):
    """A request for no proposals gets none and changes nothing: the next block is what it would have been."""
    model = tiny_models[("f64", "qwen2", "close")]
    context = [5, 6, 7, 8, 5, 6]
    for make in (lambda: ModelDrafter(model, vocab_limit=TINY_VOCAB), NgramDrafter,
                 lambda: HybridDrafter(ModelDrafter(model, vocab_limit=TINY_VOCAB))):
        fresh, probed = make(), make()
        fresh.begin(context)
        probed.begin(context)
        assert probed.propose(0) == []
        assert probed.propose(3) == fresh.propose(3), type(fresh).__name__


def test_a_generation_s_stats_as_json_carry_its_counts_and_rates(tiny_models):
    """``thesis-lib decode`` prints DecodeStats.to_dict(): the per-round lists, the derived counts consistent
    with them, and the rates, all JSON-able."""
    import json

    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    gen = speculative_generate(target, ModelDrafter(tiny_models[("f32", "qwen3", "loose")]), [3, 1, 4, 1, 5],
                               k=3, max_new_tokens=16)
    d = json.loads(json.dumps(gen.stats.to_dict()))
    assert d["new_tokens"] == len(gen.tokens) == 16 and d["k"] == 3 and d["mode"] == gen.stats.mode
    assert d["rounds"] == len(d["drafted"]) == len(d["accepted"]) == len(d["emitted"]) > 1
    assert sum(d["emitted"]) + d["first_emit"] + d["tail_tokens"] == 16
    assert d["zero_accept_rounds"] == d["accepted"].count(0)
    assert d["full_accept_rounds"] == sum(a == n for a, n in zip(d["accepted"], d["drafted"])) > 0
    assert d["acceptance"] == pytest.approx(sum(d["accepted"]) / sum(d["drafted"]))
    assert d["mean_emitted"] == pytest.approx(sum(d["emitted"]) / d["rounds"])
    assert d["decode_tokens_per_s"] == pytest.approx((16 - d["first_emit"]) / d["decode_s"])
    assert d["tpot_s"] == pytest.approx(d["decode_s"] / (16 - d["first_emit"]))
    assert d["e2e_tokens_per_s"] == pytest.approx(16 / (d["ttft_s"] + d["decode_s"]))


def test_a_16_bit_dense_head_with_a_bias_picks_the_exact_argmax():
    """The bf16 head refines near-ties in float32, bias included: its tokens are the argmax of the unrounded
    h W^T + b (a bias large enough to decide most rows)."""
    from thesis_lib.heads.dense import DenseGreedyHead

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 16, generator=g).bfloat16()
    b = (4 * torch.randn(64, generator=g)).bfloat16()
    h = torch.randn(32, 16, generator=g).bfloat16()
    head = DenseGreedyHead(w, bias=b)
    assert head.refine
    exact = (h.float() @ w.float().T + b.float()).argmax(-1)
    assert torch.equal(head(h), exact)
    assert not torch.equal(exact, (h.float() @ w.float().T - b.float()).argmax(-1))  # the bias decides rows


def test_a_16_bit_dense_head_keeps_a_maximum_logit_of_zero():
    """Near-ties are taken relative to the maximum logit; at a maximum of exactly zero the relative margin is
    zero, and the rows scoring zero must still be the candidates: the lowest of them wins, not a row below."""
    from thesis_lib.heads.dense import DenseGreedyHead

    w = torch.tensor([[-0.5, 0.0], [0.0, 1.0], [0.0, 2.0], [-0.25, 3.0]]).bfloat16()
    h = torch.tensor([[1.0, 0.0]]).bfloat16()  # logits -0.5, 0, 0, -0.25
    head = DenseGreedyHead(w)
    assert head.refine and head(h).tolist() == [1]


def test_prompt_lookup_takes_no_ngram_shorter_than_its_least_and_begins_with_nothing_pending():
    """With min_ngram 2, a repeated single token is no match (the block is the last token repeated); a
    generation's begin drops a proposal the last one left pending, so accepting from it is an error."""

    d = NgramDrafter(max_ngram=3, min_ngram=2)
    d.begin([5, 7, 9, 5])
    assert d.lookup(2) == [] and d.propose(2) == [5, 5] and d.matched == 0
    d.begin([5, 7, 9, 5, 7])
    assert d.propose(2) == [9, 5] and d.matched == 1
    d.begin([1, 2])
    with pytest.raises(ValueError, match=r"accepted=2 outside 0\.\.0"):
        d.observe(2, 3)


def test_greedy_decoding_times_its_phases_on_the_callers_clock():
    """The clock a caller passes times the target-only loop (seed-6 survivor: a loop that made its own clock left
    the caller's empty). On a clock that reads the target's cached positions (one "second" per token fed), the
    prefill phase holds the 3 prompt tokens and is the whole TTFT, the decode time is the 5 one-token steps after
    it, and the two add up to all the work done."""
    from thesis_lib.decoding.clocks import PhaseClock
    from thesis_lib.models import tiny

    target = ModelState(tiny.tiny_model("qwen2", seed=0), vocab_limit=TINY_VOCAB)

    class TokenClock(PhaseClock):
        def now(self, devices=None):
            return float(target.length)

    clock = TokenClock()
    stats = greedy_generate(target, [3, 4, 5], max_new_tokens=6, clock=clock).stats
    assert clock.as_dict() == stats.phase_s == {"prefill": 3.0} and clock.calls == {"prefill": 1}
    assert (stats.ttft_s, stats.decode_s) == (3.0, 5.0)
    assert stats.ttft_s + stats.decode_s == target.length == 8


def test_the_cost_model_counts_a_failure_only_in_rounds_that_reject():
    """The running acceptance estimate: hits over trials, a round of ``accepted`` successes adding one failure
    only when a proposal was rejected (forget = 1: no decay). From the prior (2.4 hits in 4 trials), a full round
    of 4 gives 6.4 / 8, a round accepting 1 of 4 then 7.4 / 10 (seed-6 survivor: a failure counted at full
    acceptance)."""
    from thesis_studies.beyond import policies

    verify = {n: 1.0 + 0.02 * n for n in range(1, 14)}
    p = policies.CostModelK(4, draft_step_s=0.1, verify_s=verify, k_max=12, alpha0=0.6, prior=4.0, forget=1.0)
    p.first()
    p.update(4, 4)
    assert p.alpha == pytest.approx(6.4 / 8)
    p.update(1, 4)
    assert p.alpha == pytest.approx(7.4 / 10)
    with pytest.raises(ConfigError, match="draft_step_s >= 0"):
        policies.CostModelK(4, draft_step_s=-1, verify_s=verify, k_max=12)
