"""The lookahead walk (thesis_lib.lookahead) against the real decoding loop on tiny float64 models: the recorded
continuations are the draft's, and a simulated policy has exactly the rounds, drafted and accepted tokens
the loop has."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thesis_studies.beyond import lookahead as la
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_studies.beyond.lookup import HybridDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError
from thesis_lib.heads.dense import DenseGreedyHead

from conftest import TINY_VOCAB

HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DEPTH = 6
#: Costs that make every round's choice matter (draft steps are not free, bigger verifies cost more).
STEP_MS, VERIFY_MS = 3.0, {1: 10.0, 2: 12.0, 3: 13.0, 4: 15.0, 5: 15.5, 6: 17.0, 7: 18.0}


def _draft(tiny_models):
    model = tiny_models[("f64", "qwen2", "loose")]
    return model, DenseGreedyHead.from_model(model, TINY_VOCAB)


def _sequences(tiny_models, prompts, n):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    return [(p, greedy_generate(target, p, max_new_tokens=n).tokens) for p in prompts]


PROMPTS = [[1, 5, 9, 2, 7], [3, 3, 4, 3, 3, 4, 3], [200, 17, 45, 200, 17, 45, 200, 17]]


@pytest.fixture(scope="module")
def rows(tiny_models):
    model, head = _draft(tiny_models)
    return la.draft_lookahead(model, head, _sequences(tiny_models, PROMPTS, 30), depth=DEPTH,
                              vocab_limit=TINY_VOCAB, progress=False)


def test_recorded_continuations_are_the_drafts_from_scratch(tiny_models, rows):
    model, _ = _draft(tiny_models)
    for (prompt, out), r in zip(_sequences(tiny_models, PROMPTS, 30), rows):
        assert r["target"] == out and len(r["tokens"]) == len(out)
        for t in range(0, len(out), 3):
            ids = prompt + out[:t]
            fresh = ModelDrafter(model, vocab_limit=TINY_VOCAB)
            fresh.begin(ids)
            assert r["tokens"][t] == fresh.propose(DEPTH)
            with torch.inference_mode():
                logits = model(torch.tensor([ids + r["tokens"][t][:-1]])).logits[0, len(ids) - 1:, :TINY_VOCAB]
            expect = torch.softmax(logits.double(), -1).amax(-1).tolist()
            assert r["probs"][t] == pytest.approx(expect, rel=1e-5)  # computed in float32


def test_the_lookup_proposal_is_recorded(tiny_models, rows):
    from thesis_studies.beyond.lookup import NgramDrafter

    # the third prompt repeats itself: its last three tokens (45, 200, 17) occurred before, followed by them
    assert rows[2]["lookup"][0] == [45, 200, 17]
    for (prompt, out), r in zip(_sequences(tiny_models, PROMPTS, 30), rows):
        for t in range(len(out)):
            d = NgramDrafter(min_ngram=2, max_ngram=3, pad=False)
            d.begin(prompt + out[:t])
            assert r["lookup"][t] == d.lookup(DEPTH)


def _loop_totals(gens):
    return {"rounds": sum(g.stats.rounds for g in gens), "drafted": sum(sum(g.stats.drafted) for g in gens),
            "accepted": sum(sum(g.stats.accepted) for g in gens)}


@pytest.mark.parametrize("k", [1, 3, 6])
def test_a_fixed_k_walk_has_the_loops_rounds(tiny_models, rows, k):
    model, _ = _draft(tiny_models)
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    gens = [speculative_generate(target, ModelDrafter(model, vocab_limit=TINY_VOCAB), p, k=k, max_new_tokens=30,
                                 schedule="deferred") for p in PROMPTS]
    sim = la.simulate(rows, la.fixed_policy(k), step_ms=STEP_MS, verify_ms=VERIFY_MS)
    assert {key: sim[key] for key in ("rounds", "drafted", "accepted")} == _loop_totals(gens)
    assert sim["tokens"] == sum(len(g.tokens) - 1 for g in gens)
    # the time is the rounds' draft steps and verify forwards (and the one-token tail forwards)
    assert sim["draft_ms"] == pytest.approx(STEP_MS * sim["drafted"])
    assert sim["ms"] == pytest.approx(sim["draft_ms"] + sim["verify_ms"])
    tails = sum(g.stats.tail_tokens for g in gens)
    assert sim["verify_ms"] == pytest.approx(sum(VERIFY_MS[d + 1] for g in gens for d in g.stats.drafted)
                                             + tails * VERIFY_MS[1])


@pytest.mark.parametrize("tau", [0.3, 0.6, 0.9])
@pytest.mark.parametrize("lookup", [False, True])
def test_a_threshold_walk_has_the_loops_rounds(tiny_models, rows, tau, lookup):
    model, _ = _draft(tiny_models)
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    gens = []
    for p in PROMPTS:
        d = ModelDrafter(model, vocab_limit=TINY_VOCAB, stop_below=tau)
        if lookup:
            d = HybridDrafter(d, pad=False)
        gens.append(speculative_generate(target, d, p, k=DEPTH, max_new_tokens=30, schedule="deferred"))
    sim = la.simulate(rows, la.threshold_policy(tau, DEPTH), step_ms=STEP_MS, verify_ms=VERIFY_MS, lookup=lookup)
    assert {key: sim[key] for key in ("rounds", "drafted", "accepted")} == _loop_totals(gens)


@HYP
@given(k=st.integers(1, DEPTH), tau=st.floats(0.05, 0.95), step=st.floats(0.0, 20.0), lookup=st.booleans())
def test_no_policy_beats_the_oracle(rows, k, tau, step, lookup):
    best = la.oracle(rows, step_ms=step, verify_ms=VERIFY_MS, k_max=DEPTH, lookup=lookup)["ms"]
    for policy in (la.fixed_policy(k), la.threshold_policy(tau, DEPTH)):
        assert best <= la.simulate(rows, policy, step_ms=step, verify_ms=VERIFY_MS, lookup=lookup)["ms"] + 1e-9
    plain_target = sum(len(r["target"]) - 1 for r in rows) * VERIFY_MS[1]
    assert best <= plain_target + 1e-9
    if lookup:  # more choices can only help
        assert best <= la.oracle(rows, step_ms=step, verify_ms=VERIFY_MS, k_max=DEPTH)["ms"] + 1e-9


def _whole_block_rounds(row: dict, k_max: int) -> int:
    """Rounds of a walk over ``row`` that drafts the longest block allowed every round (k_max, and one token short
    of the output's end), its accepted prefix counted token by token."""
    out, t, rounds = row["target"], 1, 0
    while t < len(out):
        k, n = min(k_max, len(out) - t - 1), 0
        while n < k and row["tokens"][t][n] == out[t + n]:
            n += 1
        t, rounds = t + n + 1, rounds + 1
    return rounds


@pytest.mark.parametrize("k_max", [1, 3, DEPTH])
def test_free_perfect_drafting_makes_the_oracle_draft_whole_blocks(rows, k_max):
    """Free draft steps and verifies that cost one target step whatever their size: the oracle drafts whole blocks.
    A draft that is always right needs ceil((n - 1) / (k_max + 1)) rounds for n tokens; on the recorded drafts, the
    oracle's time is that of a walk that always drafts the longest block allowed."""
    flat = {n: 10.0 for n in range(1, DEPTH + 2)}
    for n_tok in (1, 2, 3, k_max + 1, k_max + 2, k_max + 3, 22, 31):
        out = list(range(100, 100 + n_tok))
        perfect = {"target": out, "tokens": [out[t:t + DEPTH] for t in range(n_tok)],
                   "probs": [[1.0] * DEPTH] * n_tok, "lookup": [[]] * n_tok}
        o = la.oracle([perfect], step_ms=0.0, verify_ms=flat, k_max=k_max)
        assert o == {"ms": 10.0 * math.ceil((n_tok - 1) / (k_max + 1)), "tokens": max(0, n_tok - 1)}, n_tok
    whole = sum(_whole_block_rounds(r, k_max) for r in rows)
    tokens = sum(len(r["target"]) - 1 for r in rows)
    assert whole < tokens  # the recorded drafts get blocks accepted: one round per token would not do
    assert la.oracle(rows, step_ms=0.0, verify_ms=flat, k_max=k_max) == {"ms": pytest.approx(10.0 * whole),
                                                                         "tokens": tokens}


def test_bad_policy_and_depth_are_refused(tiny_models):
    with pytest.raises(ConfigError):
        la.fixed_policy(0)
    with pytest.raises(ConfigError):
        la.threshold_policy(1.0, 4)
    model, head = _draft(tiny_models)
    with pytest.raises(ConfigError, match="depth"):
        la.draft_lookahead(model, head, [([1, 2], [3])], depth=0, progress=False)


@pytest.mark.parametrize("policy", ["k2", "k4", "k6", "tau0.6", "tau0.6+lookup"])
def test_a_walk_over_outputs_that_eos_ended_has_the_loops_rounds_given_the_limit(tiny_models, rows, policy):
    """Outputs that end at an EOS token before the limit: the loop, not knowing where they end, drafts full blocks
    up to the limit, so the walk matches its rounds, drafted and accepted tokens given ``max_new_tokens`` (fixed
    K, the confidence stop, and the confidence stop with the lookup); capping blocks at the output's own end
    instead (the walk without the limit) drafts fewer tokens than the loop did. An output longer than the limit
    it is walked with is refused."""
    model, _ = _draft(tiny_models)
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    tau = 0.6 if policy.startswith("tau") else None
    k = DEPTH if tau else int(policy[1:])
    walk = la.threshold_policy(tau, DEPTH) if tau else la.fixed_policy(k)
    gens, cut = [], []
    for p, r in zip(PROMPTS, rows):
        eos = r["target"][18]  # a token of the output: the output ends where it first occurs
        d = ModelDrafter(model, vocab_limit=TINY_VOCAB, stop_below=tau)
        if policy.endswith("lookup"):
            d = HybridDrafter(d, pad=False)
        gen = speculative_generate(target, d, p, k=k, max_new_tokens=30, eos_ids=[eos], schedule="deferred")
        end = r["target"].index(eos) + 1
        assert gen.tokens == r["target"][:end] and end < 30  # it did end at EOS, before the limit
        gens.append(gen)
        cut.append({key: r[key][:end] for key in ("tokens", "probs", "lookup", "target")})
    kw = dict(step_ms=STEP_MS, verify_ms=VERIFY_MS, lookup=policy.endswith("lookup"))
    sim = la.simulate(cut, walk, max_new_tokens=30, **kw)
    assert {key: sim[key] for key in ("rounds", "drafted", "accepted")} == _loop_totals(gens)
    assert la.simulate(cut, walk, **kw)["drafted"] < sim["drafted"]
    with pytest.raises(ConfigError, match="longer than the limit"):
        la.simulate(rows, walk, max_new_tokens=12, **kw)
