"""The paired bootstrap of a ratio of two modes' pooled speeds, and the verdict words it allows, on constructed
runs whose true ratio is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from thesis_lib.analysis import uncertainty as u
from thesis_lib.bench.runs import Run


def _run(rows) -> Run:
    """rows: (prompt, iteration, mode, decode tokens, decode seconds)."""
    return Run(path=None, config={}, environment={}, samples=[
        dict(question_id=q, iteration=i, mode=m, decode_tokens=t, decode_s=s, new_tokens=t + 1, first_emit=1)
        for q, i, m, t, s in rows])


def test_a_ratio_the_same_on_every_prompt_has_no_spread_however_the_prompts_differ():
    """Paired: prompts ten times apart in speed, the mode 1.25x its own prompt's baseline on each, give 1.25 and
    an interval of width 0 (resampling modes' samples independently would not)."""
    rows = []
    for q, (tokens, secs) in enumerate([(30, 1.0), (31, 10.0), (29, 3.0), (32, 0.5), (30, 6.0)]):
        rows += [(q, 0, "baseline", tokens, secs), (q, 0, "flash_deferred", tokens, secs / 1.25)]
    got = u.ratio_interval(_run(rows), "flash_deferred")
    assert got["ratio"] == pytest.approx(1.25) and got["prompts"] == 5
    assert got["lo"] == pytest.approx(1.25) and got["hi"] == pytest.approx(1.25)


def test_the_point_is_the_pooled_ratio_and_the_interval_brackets_it():
    rows = [(0, 0, "baseline", 100, 2.0), (0, 0, "m", 100, 1.0),  # 2x on a long prompt
            (1, 0, "baseline", 10, 1.0), (1, 0, "m", 10, 2.0),     # 0.5x on a short one
            (2, 0, "baseline", 50, 1.0), (2, 0, "m", 50, 1.0)]
    got = u.ratio_interval(_run(rows), "m")
    assert got["ratio"] == pytest.approx((160 / 4.0) / (160 / 4.0))  # all tokens over all time, per mode: 1.0
    assert got["lo"] < got["ratio"] < got["hi"]
    assert got["lo"] >= 0.5 - 1e-9 and got["hi"] <= 2.0 + 1e-9  # no resample leaves the prompts' own range


def test_the_interval_covers_the_true_ratio_about_as_often_as_its_level_says():
    """200 simulated runs of 20 prompts, each prompt's true ratio lognormal around 1.06 (sd 0.05), equal work per
    prompt: the pooled ratio's population value is the harmonic mean, exp(mu - sd^2 / 2). The 95 % interval
    holds it in 88-99 % of runs (a percentile bootstrap of 20 prompts covers a little under its level); a 50 %
    interval, or one that resampled nothing, would not."""
    rng = np.random.default_rng(1)
    mu, sd, truth = math.log(1.06), 0.05, 1.06 * math.exp(-0.05 ** 2 / 2)
    hits = 0
    for sim in range(200):
        r = np.exp(rng.normal(mu, sd, 20))
        rows = [(q, 0, "baseline", 100, 1.0) for q in range(20)] + [(q, 0, "m", 100, 1.0 / r[q]) for q in range(20)]
        got = u.ratio_interval(_run(rows), "m", resamples=400, seed=sim)
        hits += got["lo"] <= truth <= got["hi"]
    assert 0.88 <= hits / 200 <= 0.99


def test_iterations_are_resampled_within_their_prompt():
    """One prompt run three times: the spread between its iterations is the interval's; pairing is by
    iteration (the mode's i-th sample against the baseline's i-th)."""
    rows = [(0, i, "baseline", 20, 1.0) for i in range(3)] + [(0, i, "m", 20, s) for i, s in enumerate((0.5, 1.0, 2.0))]
    got = u.ratio_interval(_run(rows), "m")
    assert got["prompts"] == 1 and got["lo"] < got["ratio"] < got["hi"]
    one = u.ratio_interval(_run([(0, 0, "baseline", 20, 1.0), (0, 0, "m", 20, 0.5)]), "m")
    assert one["lo"] == one["hi"] == one["ratio"] == pytest.approx(2.0)  # nothing to resample
    with pytest.raises(ValueError, match="no prompt has samples of both"):
        u.ratio_interval(_run([(0, 0, "baseline", 20, 1.0), (1, 0, "m", 20, 0.5)]), "m")


def test_verdict_words_follow_the_interval():
    assert u.against_thesis(1.04, 1.09, 1.060) == "reproduced"
    assert u.against_thesis(1.10, 1.69, 1.060) == "larger" and u.against_thesis(0.95, 1.05, 1.060) == "smaller"
    assert u.which_faster(1.02, 1.09, "FlashHead", "dense") == "FlashHead is faster"
    assert u.which_faster(0.90, 0.98, "FlashHead", "dense") == "dense is faster"
    # an interval that contains 1 names no winner, however far its point lies from 1
    assert "cannot be told apart" in u.which_faster(0.99, 1.30, "FlashHead", "dense")


def test_the_prompts_a_ratio_needs_follow_the_square_root_law():
    # 1.03 with an interval of +-0.05 from 7 prompts: the half-width must shrink to 0.03, (0.05/0.03)^2 x 7 = 19.4
    assert u.prompts_to_resolve(1.03, 0.98, 1.08, 7) == 20
    assert u.prompts_to_resolve(0.97, 0.92, 1.02, 7) == 20  # slower: the same law
    assert u.prompts_to_resolve(1.06, 1.04, 1.09, 7) == 7  # already resolved
    assert u.prompts_to_resolve(1.0, 0.95, 1.05, 7) is None
    assert "about 20 prompts would" in u.resolution(1.03, 0.98, 1.08, 7)
    assert u.resolution(1.06, 1.04, 1.09, 7) == "the 7 prompts resolve it from 1"


def test_a_simulated_run_of_the_predicted_size_resolves_the_ratio():
    """The prediction checked against the bootstrap itself: prompts whose true ratio is 1.03 (spread 0.05) are
    not resolved by 6 of them, and a run of the predicted size is, in most of 20 seeded draws."""
    rng = np.random.default_rng(3)

    def run_of(n):
        r = np.exp(rng.normal(math.log(1.03), 0.05, n))
        return _run([(q, 0, "baseline", 100, 1.0) for q in range(n)] + [(q, 0, "m", 100, 1.0 / r[q]) for q in range(n)])

    small = u.ratio_interval(run_of(6), "m", resamples=500)
    need = u.prompts_to_resolve(small["ratio"], small["lo"], small["hi"], small["prompts"])
    assert small["lo"] < 1 < small["hi"] and need > 6
    resolved = sum(u.ratio_interval(run_of(need), "m", resamples=500, seed=s)["lo"] > 1 for s in range(20))
    assert resolved >= 10
