"""The cost model of a round (:mod:`thesis_lib.decoding.costs`), checked against what it models: expected tokens
against a simulated i.i.d. acceptance process, the best block length against a brute-force simulation of rounds,
the schedules against each other, and the timer on tiny models."""

from __future__ import annotations

import random

import pytest

from thesis_lib.decoding import costs
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError


def _simulated_emitted(alpha: float, k: int, rounds: int = 40_000, seed: int = 0) -> float:
    """Mean tokens per round of rounds whose k proposals each pass with probability alpha, in order, until
    the first failure; the target's own token always follows."""
    rng = random.Random(seed)
    total = 0
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        total += n + 1
    return total / rounds


@pytest.mark.parametrize("alpha,k", [(0.0, 4), (0.3, 1), (0.6, 4), (0.9, 7), (1.0, 3)])
def test_expected_emitted_matches_a_simulated_acceptance_process(alpha, k):
    assert costs.expected_emitted(alpha, k) == pytest.approx(_simulated_emitted(alpha, k), rel=0.02)


def test_best_k_is_the_block_with_the_most_simulated_tokens_per_second():
    verify = {n: 40.0 + 6.0 * n for n in range(1, 14)}  # a verify curve that grows with the block
    for alpha, step in ((0.9, 2.0), (0.6, 2.0), (0.9, 30.0), (0.3, 10.0)):
        simulated = {k: _simulated_emitted(alpha, k, rounds=20_000) / (k * step + verify[k + 1]) for k in range(1, 13)}
        best = costs.best_k(alpha, step, verify, range(1, 13))
        # the model's choice is within simulation noise of the simulated best
        assert simulated[best] >= 0.98 * max(simulated.values())
    assert costs.best_k(0.95, 0.1, verify, range(1, 13)) > costs.best_k(0.95, 30.0, verify, range(1, 13))
    assert costs.best_k(0.01, 1.0, verify, range(1, 13)) == 1


def test_the_schedules_differ_by_the_append_and_the_extra_position():
    curve = {1: 10.0, 4: 13.0, 5: 14.0}
    deferred, ordinary = (costs.schedule_cost(4, 3.0, curve, deferred=d) for d in (True, False))
    assert deferred == 4 * 3.0 + 14.0 and ordinary == 4 * 3.0 + 13.0 + 10.0
    # a verify forward that costs the same at any size: deferred saves exactly one target step per round
    flat = {n: 10.0 for n in range(1, 8)}
    assert costs.schedule_cost(4, 3.0, flat, deferred=False) - costs.schedule_cost(4, 3.0, flat) == 10.0


def test_speedup_in_target_steps_is_the_rate_against_target_only_decoding():
    # one target step costs 1; target-only decoding emits 1 token per step, so the speedup is the rate
    curve = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 8)}
    rate = costs.rate(0.7, 4, 0.25, curve)
    assert costs.speedup(0.7, 4, 0.25, curve[5], 0.0) == pytest.approx(rate)
    assert costs.speedup(0.7, 4, 0.25, curve[4], curve[1]) == pytest.approx(costs.rate(0.7, 4, 0.25, curve, deferred=False))
    assert costs.speedup(0.0, 4, 0.25) < 1 < costs.speedup(0.95, 4, 0.05)


def test_verify_cost_pads_to_the_cheapest_larger_size():
    cost = costs.verify_cost({1: 10, 2: 30, 3: 20, 5: 25})
    assert [cost(n) for n in (1, 2, 3, 4, 5)] == [10, 20, 20, 25, 25]
    with pytest.raises(ConfigError, match=r"^no verify cost measured for 6 tokens \(largest: 5\)\.$"):
        cost(6)


def test_measure_costs_times_each_draft_and_block_and_leaves_the_states_empty(tiny_models):
    t_state = ModelState(tiny_models[("f32", "qwen2", "target")])
    d_state = ModelState(tiny_models[("f32", "qwen2", "independent")])
    ids = [3, 17, 42, 5, 9, 11]
    out = costs.measure_costs(t_state, {"dense": d_state, "ngram": None}, ids, verify_sizes=(5, 1, 9), reps=2)
    assert out["ngram_step_s"] == 0.0 and out["dense_step_s"] > 0
    assert sorted(out["verify_s"]) == [1, 5, 9] and all(s > 0 for s in out["verify_s"].values())
    assert t_state.length == 0 and d_state.length == 0


class _Probe:
    """A model state that records what the timer asks of it and answers each timed forward with the next of its
    ``answers`` (seconds)."""

    def __init__(self, name, log, answers):
        self.name, self.log, self.answers = name, log, list(answers)

    def reset(self):
        self.log.append((self.name, "reset"))

    def greedy(self, ids, last_only=False):
        self.log.append((self.name, "prefill", list(ids), last_only))

    def timed_forward(self, ids, head=True):
        self.log.append((self.name, list(ids), head))
        return self.answers.pop(0)


def test_the_forward_cost_timer_alternates_drops_its_warm_up_and_takes_medians():
    """Two states timed side by side over sizes 1 and 4 after the prompt [1, 2, 3]: each prefilled with it, then per
    repetition and size both states in the alternating order (reversed at odd positions r + n), the warm-up
    repetition's answers (100 s) left out of the medians, ``after_steps`` after the first size of each kept
    repetition, a block longer than the prompt made of its tokens repeated, and both states reset at the end."""
    log, steps = [], []
    # per state, answers in call order: (r0 n1, r0 n4, r1 n1, r1 n4, r2 n1, r2 n4, r3 n1, r3 n4)
    a = _Probe("a", log, [100, 100, 1, 8, 3, 6, 2, 7])
    b = _Probe("b", log, [100, 100, 5, 9, 4, 9, 6, 1])
    out = costs.forward_curves({"a": a, "b": b}, [1, 2, 3], [1, 4], reps=3, warmup=1, head=False,
                               after_steps=steps.append)
    assert out == {"a": {1: 2, 4: 7}, "b": {1: 5, 4: 9}}
    assert steps == [1, 2, 3]
    timed = [(name, len(ids)) for name, ids, *_ in (e for e in log if isinstance(e[1], list) and len(e) == 3)]
    assert timed[:8] == [("b", 1), ("a", 1), ("a", 4), ("b", 4), ("a", 1), ("b", 1), ("b", 4), ("a", 4)]
    assert ("a", [3, 1, 2, 3], False) in log and ("b", [3], False) in log
    assert log[:4] == [("a", "reset"), ("a", "prefill", [1, 2, 3], True), ("b", "reset"), ("b", "prefill", [1, 2, 3], True)]
    assert log[-2:] == [("a", "reset"), ("b", "reset")]
    # raw: every kept timing, in repetition order, in place of the medians
    a, b = _Probe("a", [], [100, 100, 1, 8, 3, 6, 2, 7]), _Probe("b", [], [100, 100, 5, 9, 4, 9, 6, 1])
    assert costs.forward_curves({"a": a, "b": b}, [1, 2, 3], [1, 4], reps=3, warmup=1, raw=True) == {
        "a": {1: [1, 3, 2], 4: [8, 6, 7]}, "b": {1: [5, 4, 6], 4: [9, 9, 1]}}
