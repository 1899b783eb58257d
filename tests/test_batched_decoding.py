"""Batched greedy decoding (decoding.batched): B prompts at once, each row accepting its own tokens per round;
every row's output is its prompt's one-row target-only output, and its rounds are the one-row loop's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thesis_studies.serving.loops import BatchState, RaggedCache, batched_greedy, batched_speculative
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError

from conftest import TINY_VOCAB, int8_pair

@pytest.fixture(scope="module")
def pair():
    """A tiny target and a close draft in int8-dynamic (each row computed alone by construction), row-exact
    attention; the draft with its dense head and with a FlashHead head (17 clusters, 2 probes)."""
    target, draft, flash = int8_pair()
    return {"target": ModelState(target, vocab_limit=TINY_VOCAB),
            "dense": (draft, None), "flash": (draft, flash)}


HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
prompt = st.lists(st.integers(0, TINY_VOCAB - 1), min_size=1, max_size=12)


@HYP
@given(prompts=st.lists(prompt, min_size=1, max_size=5), k=st.integers(1, 6), max_new=st.integers(1, 30),
       schedule=st.sampled_from(["ordinary", "deferred"]), name=st.sampled_from(["dense", "flash"]),
       stop=st.integers(0, 40))
def test_every_row_is_its_prompts_target_only_output_and_its_rounds_the_one_row_loops(pair, prompts, k, max_new,
                                                                                      schedule, name, stop):
    """Random batches: each row equals one-row target-only greedy output, also where an EOS (a token of one
    row's reference output, ``stop`` picks it) ends rows early; and each row's rounds (accepted per round,
    verify, append and skip counts) are the one-row speculative loop's, with the same draft."""
    target = pair["target"]
    model, head = pair[name]
    first = greedy_generate(target, prompts[0], max_new_tokens=max_new).tokens
    eos = [first[stop % len(first)]] if stop < 30 else []
    refs = [greedy_generate(target, p, max_new_tokens=max_new, eos_ids=eos).tokens for p in prompts]
    assert [g.tokens for g in batched_greedy(target, prompts, max_new_tokens=max_new, eos_ids=eos).generations] == refs
    run = batched_speculative(target, ModelState(model, head=head, vocab_limit=TINY_VOCAB), prompts, k=k,
                              max_new_tokens=max_new, eos_ids=eos, schedule=schedule, name=name)
    assert [g.tokens for g in run.generations] == refs
    for p, g in zip(prompts, run.generations):
        one = speculative_generate(target, ModelDrafter(model, head=head, vocab_limit=TINY_VOCAB), p, k=k,
                                   max_new_tokens=max_new, eos_ids=eos, schedule=schedule).stats
        got = g.stats
        assert (got.accepted, got.drafted, got.emitted) == (one.accepted, one.drafted, one.emitted)
        assert (got.verify_calls, got.append_calls, got.skipped, got.tail_tokens) == (
            one.verify_calls, one.append_calls, one.skipped, one.tail_tokens)
        assert (got.mode, got.k) == (f"{name}_{schedule}", k)  # each row's record names its mode and K


def test_rows_accept_differently_and_end_at_different_times(pair):
    """The case the ragged cache exists for, pinned: in one batch some rounds accept everything and others
    nothing, and one row hits its EOS rounds before the others finish; every row still equals its reference."""
    target = pair["target"]
    model, _ = pair["dense"]
    prompts = [[3, 4, 5], [17, 2, 99, 41, 8], [250, 1, 1, 7], [60, 61, 62, 63, 64, 65]]
    plain = greedy_generate(target, prompts[1], max_new_tokens=24).tokens
    eos = [plain[5]]
    refs = [greedy_generate(target, p, max_new_tokens=24, eos_ids=eos).tokens for p in prompts]
    assert len(refs[1]) == 6 and max(map(len, refs)) == 24
    for schedule in ("ordinary", "deferred"):
        run = batched_speculative(target, ModelState(model, vocab_limit=TINY_VOCAB), prompts, k=4,
                                  max_new_tokens=24, eos_ids=eos, schedule=schedule)
        assert [g.tokens for g in run.generations] == refs
        accepted = [a for g in run.generations for a in g.stats.accepted]
        assert 0 in accepted and 4 in accepted
        assert run.generations[1].stats.stopped_by == "eos"
        done = [g.stats.ttft_s + g.stats.decode_s for g in run.generations]
        assert done[1] < max(done) <= run.seconds
        assert run.new_tokens == sum(map(len, refs)) and run.tokens_per_s > 0


def test_each_row_of_a_ragged_forward_equals_its_one_row_steps_bit_for_bit(pair):
    """Rows of 2, 9 and 5 cached positions fed 3, 1 and 0 tokens at once, and batches of one row: every fed
    position's final hidden state is, bit for bit, what one-token steps of that row alone compute (the row-exact
    attention per row and position)."""
    target = pair["target"]
    cases = [([[5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40, 41, 42, 43, 44]], [[7, 8, 9], [10], []]),
             ([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]], [[12]]),  # one row, one token: a batch of one is a batch too
             ([[30, 31, 32]], [[33, 34, 35, 36]])]
    for rows, feeds in cases:
        batch = BatchState(target)
        batch.prefill(rows, capacity=16)
        got = batch.hidden(feeds)
        assert batch.cache.lengths == [len(r) + len(f) for r, f in zip(rows, feeds)]
        with torch.inference_mode():
            for r, f, h in zip(rows, feeds, got):
                target.reset()
                target.hidden(r)
                steps = [target.hidden([t]) for t in f]
                assert torch.equal(h, torch.cat(steps) if steps else h[:0]), r


def test_a_ragged_forward_writes_each_row_at_its_own_length():
    """Constructed caches: rows of 3 and 1 positions, a forward of width 2 where the second row feeds one real
    token: positions and masks per row, keys written at each row's length, cropping per row, keeping rows."""
    from transformers import DynamicCache

    caches = []
    for n in (3, 1):
        c = DynamicCache()
        c.update(torch.full((1, 1, n, 2), float(n)), torch.full((1, 1, n, 2), -float(n)), 0)
        caches.append(c)
    cache = RaggedCache.from_rows(caches, capacity=8)
    assert cache.lengths == [3, 1] and cache.capacity == 8
    positions, mask = cache.feed([2, 1], 2, "cpu")
    assert positions.tolist() == [[3, 4], [1, 2]]
    assert mask.shape == (2, 1, 2, 5)
    assert mask[0, 0].sum(-1).tolist() == [4, 5] and mask[1, 0].sum(-1).tolist() == [2, 1]  # the pad: one key
    k, v = cache.update(torch.tensor([7.0, 8.0]).view(1, 1, 2, 1).expand(2, 1, 2, 2),
                        torch.zeros(2, 1, 2, 2), 0)
    assert k.shape == (2, 1, 5, 2)
    assert k[0, 0, :, 0].tolist() == [3, 3, 3, 7, 8] and k[1, 0, :3, 0].tolist() == [1, 7, 8]
    cache.advance([2, 1])
    assert cache.lengths == [5, 2]
    cache.crop([1, 0])
    assert cache.lengths == [4, 2]
    with pytest.raises(ValueError, match="cannot remove"):
        cache.crop([0, 3])
    cache.keep([1])
    assert cache.lengths == [2] and cache.layers[0][0].shape[0] == 1
    assert cache.layers[0][0][0, 0, :2, 0].tolist() == [1, 7]
    with pytest.raises(ValueError, match="overflows"):
        cache.feed([7], 7, "cpu")


def test_a_ragged_cache_holds_up_to_its_capacity_and_crops_within_each_row():
    """Rows of 3 and 1 positions fit a capacity of 3 exactly (a row's own keys and values copied, the rest zero)
    and not a capacity of 2; a crop removes from 0 up to a row's whole length, never more and never a negative
    count (each refusal names the counts and the lengths)."""
    from transformers import DynamicCache

    caches = []
    for n in (3, 1):
        c = DynamicCache()
        c.update(torch.full((1, 1, n, 2), float(n)), torch.full((1, 1, n, 2), -float(n)), 0)
        caches.append(c)
    with pytest.raises(ValueError, match=r"^a row holds 3 positions; capacity 2$"):
        RaggedCache.from_rows(caches, capacity=2)
    cache = RaggedCache.from_rows(caches, capacity=3)
    k, v = cache.layers[0]
    assert k[:, 0, :, 0].tolist() == [[3, 3, 3], [1, 0, 0]] and v[:, 0, :, 1].tolist() == [[-3, -3, -3], [-1, 0, 0]]
    for bad in ([4, 0], [0, 2], [-1, 0]):
        with pytest.raises(ValueError, match=rf"^cannot remove \[{bad[0]}, {bad[1]}\] of \[3, 1\] cached positions$"):
            cache.crop(bad)
    cache.crop([3, 1])
    assert cache.lengths == [0, 0]


def test_bad_requests_are_refused_before_any_model_runs(pair):
    class Untouchable:
        device = torch.device("cpu")

        def __getattr__(self, name):
            raise AssertionError(f"the model was touched ({name})")

    bad = Untouchable()
    with pytest.raises(ConfigError, match="ordinary or deferred"):
        batched_speculative(bad, bad, [[1, 2]], k=4, max_new_tokens=8, schedule="pipelined")
    with pytest.raises(ConfigError, match="empty"):
        batched_speculative(bad, bad, [[1, 2], []], k=4, max_new_tokens=8)
    with pytest.raises(ConfigError, match="K"):
        batched_speculative(bad, bad, [[1, 2]], k=0, max_new_tokens=8)
    with pytest.raises(ConfigError, match="at least one prompt"):
        batched_greedy(bad, [], max_new_tokens=8)


class _Forwards:
    """A clock that counts forward passes instead of seconds (a target forward one "second", a draft forward
    1,000), hooked onto the models' bodies while the ``with`` block runs."""

    def __init__(self, target, draft=None):
        from thesis_lib.decoding.clocks import PhaseClock

        self.calls = {"target": 0, "draft": 0}
        self.models = {"target": target, "draft": draft}
        calls = self.calls

        class ForwardClock(PhaseClock):
            def now(self, devices=None):
                return float(calls["target"] + 1000 * calls["draft"])

        self.clock = ForwardClock()

    def __enter__(self):
        def count(who):
            return lambda *_: self.calls.__setitem__(who, self.calls[who] + 1)

        self.hooks = [m.model.register_forward_pre_hook(count(who)) for who, m in self.models.items() if m is not None]
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_a_batch_s_time_is_split_into_the_loop_s_four_phases(pair, schedule):
    """The seconds a batch spent are charged to the phase whose work they are. On a clock that counts forward
    passes: prefill holds the two prompts' target forwards, proposal every draft forward (the draft's prefill
    included) and no target forward, verification one target forward per round at most, finalisation the ordinary
    schedule's first append; no forward is outside a phase."""
    from thesis_lib.decoding.stats import FINALIZE, PREFILL, PROPOSE, VERIFY

    model, _ = pair["dense"]
    target = pair["target"]
    with _Forwards(target.model, model) as counted:
        run = batched_speculative(target, ModelState(model, vocab_limit=TINY_VOCAB), [[3, 4, 5], [17, 2]], k=3,
                                  max_new_tokens=8, schedule=schedule, clock=counted.clock)
    calls, s = counted.calls, run.phase_s
    rounds = max(len(g.stats.drafted) for g in run.generations)
    assert set(s) == {PREFILL, PROPOSE, VERIFY, FINALIZE} and calls["draft"] > 2
    assert s[PREFILL] == 2 and s[PROPOSE] == 1000 * calls["draft"]
    assert s[PREFILL] + s[VERIFY] + s[FINALIZE] == calls["target"] and 1 <= s[VERIFY] <= rounds
    assert s[FINALIZE] >= (schedule == "ordinary")


def test_a_target_only_batch_charges_its_steps_to_verification(pair):
    """Target-only batched decoding: the two prompts' forwards are the prefill, and each later token's one batched
    forward is charged to verification (seven of them for eight new tokens, no row ending early)."""
    from thesis_lib.decoding.stats import PREFILL, VERIFY

    target = pair["target"]
    with _Forwards(target.model) as counted:
        run = batched_greedy(target, [[3, 4, 5], [17, 2]], max_new_tokens=8, clock=counted.clock)
    assert [len(g.tokens) for g in run.generations] == [8, 8]
    assert run.phase_s == {PREFILL: 2.0, VERIFY: 7.0} and counted.calls["target"] == 9


def test_each_row_says_what_stopped_it(pair):
    """A row that reaches max_new_tokens says so, and one that emits its EOS says that (seed-6 survivor)."""
    target = pair["target"]
    model, _ = pair["dense"]
    prompts = [[3, 4, 5], [17, 2, 99, 41, 8]]
    eos = [greedy_generate(target, prompts[1], max_new_tokens=12).tokens[3]]
    refs = [greedy_generate(target, p, max_new_tokens=12, eos_ids=eos) for p in prompts]
    run = batched_speculative(target, ModelState(model, vocab_limit=TINY_VOCAB), prompts, k=3, max_new_tokens=12,
                              eos_ids=eos)
    assert [g.tokens for g in run.generations] == [r.tokens for r in refs]
    assert [g.stats.stopped_by for g in run.generations] == [r.stats.stopped_by for r in refs]
    assert {r.stats.stopped_by for r in refs} == {"eos", "max_new_tokens"}  # both kinds present
