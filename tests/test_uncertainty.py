"""The paired bootstrap of a ratio of two modes' pooled speeds, and the verdict words it allows, on constructed
runs whose true ratio is known."""

from __future__ import annotations

import math

from pathlib import Path

import numpy as np
import pytest

from thesis_lib.analysis import uncertainty as u
from thesis_lib.bench.runs import Run
from thesis_lib.errors import ConfigError


def _run(rows) -> Run:
    """rows: (prompt, iteration, mode, decode tokens, decode seconds)."""
    return Run(path=None, config={}, environment={}, samples=[
        dict(question_id=q, iteration=i, mode=m, decode_tokens=t, decode_s=s, new_tokens=t + 1, first_emit=1,
             ttft_s=0.1)
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


@pytest.mark.parametrize("prompts, level", [(7, 0.95), (7, 0.80), (20, 0.95), (20, 0.80)])
def test_the_interval_covers_the_true_ratio_as_often_as_its_level_says(prompts, level):
    """1,000 simulated runs of ``prompts`` prompts, each prompt's true ratio lognormal around 1.06 (sd 0.05), equal
    work per prompt: the pooled ratio's population value is the harmonic mean, exp(mu - sd^2 / 2). Coverage must lie
    within 3 binomial sd of the level (0.7 points at 95 %, 1.3 at 80 %). A plain percentile interval misses that
    over 7 prompts (87.9 % at 95 %, 71.0 % at 80 %: too narrow); the expanded one covers 94.0 % and 81.0 %, and
    95.2 % and 82.3 % over 20 prompts. Over 20 prompts the plain one (93.1 %, 78.7 %) passes too: the 7-prompt cases
    are the ones that tell them apart."""
    rng = np.random.default_rng(1)
    mu, sd, truth = math.log(1.06), 0.05, 1.06 * math.exp(-0.05 ** 2 / 2)
    hits = 0
    for sim in range(1000):
        r = np.exp(rng.normal(mu, sd, prompts))
        rows = [(q, 0, "baseline", 100, 1.0) for q in range(prompts)]
        rows += [(q, 0, "m", 100, 1.0 / r[q]) for q in range(prompts)]
        got = u.ratio_interval(_run(rows), "m", resamples=400, seed=sim, level=level)
        hits += got["lo"] <= truth <= got["hi"]
    binomial_sd = math.sqrt(level * (1 - level) / 1000)
    assert abs(hits / 1000 - level) <= 3 * binomial_sd


def test_the_expanded_level_is_the_t_quantile_s_normal_level():
    """Over 7 prompts a 95 % interval takes the resamples' middle 99.18 %: the normal quantile sqrt(7/6) x 2.447
    (t with 6 degrees of freedom) = 2.643; over many prompts it tends to the level; one prompt has nothing to widen."""
    assert u.expanded_level(0.95, 7) == pytest.approx(0.99178, abs=1e-4)
    assert u.expanded_level(0.95, 35) == pytest.approx(0.9608, abs=1e-4)
    assert 0.95 < u.expanded_level(0.95, 2000) < 0.9502 and u.expanded_level(0.95, 1) == 0.95


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


def test_a_printed_bound_near_one_keeps_its_side_of_one():
    """Two decimals, unless they would print 1.00 for a bound that is not 1 (the verdict beside it says "no" for
    an upper bound of 0.9996, so the reader must not see 1.00)."""
    from thesis_lib.analysis.uncertainty import bound_text

    assert [bound_text(x) for x in (0.987, 1.234, 1.0, 0.9996, 1.0004, 0.99996)] == [
        "0.99", "1.23", "1.00", "0.9996", "1.0004", "0.99996"]
    for x in (0.995, 0.9999, 1.004, 1.00001):
        assert (float(bound_text(x)) < 1) == (x < 1) and float(bound_text(x)) != 1


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


def test_a_timing_ratio_pairs_each_item_s_repetitions():
    """Items ten times apart in cost, the second head 4x faster on each (index rep * items + item): 4 with no
    spread; noise on one item widens the interval around the pooled ratio; timings that do not pair are refused."""
    items, reps = 5, 3
    dense = [float(10 ** (i % items)) for i in range(items * reps)]
    got = u.timing_interval(dense, [d / 4 for d in dense], items)
    assert got["value"] == pytest.approx(4) and got["lo"] == pytest.approx(4) and got["hi"] == pytest.approx(4)
    noisy = [d / (4 if i % items != 1 else (2, 4, 8)[i // items]) for i, d in enumerate(dense)]
    got = u.timing_interval(dense, noisy, items)
    assert got["clusters"] == items and got["lo"] < got["value"] < got["hi"]
    assert got["value"] == pytest.approx(sum(dense) / sum(noisy))
    with pytest.raises(ValueError, match="do not pair"):
        u.timing_interval(dense, dense[:-1], items)
    with pytest.raises(ValueError, match="do not pair"):
        u.timing_interval(dense[:-1], dense[:-1], items)


def test_a_share_pools_its_parts_over_the_prompts_drawn():
    """Three prompts whose draft takes 20 %, 50 % and 80 % of decode time, with different decode times: the share
    is the pooled one (all proposal time over all decode time), and no resample leaves the prompts' range."""
    samples = [dict(question_id=q, iteration=0, mode="m", decode_tokens=10, new_tokens=11, first_emit=1, decode_s=s,
                    accepted=a, drafted=8, phase_s={"draft_propose": f * s})
               for q, (s, f, a) in enumerate([(1.0, 0.2, 2), (2.0, 0.5, 4), (4.0, 0.8, 8)])]
    run = Run(path=None, config={}, environment={}, samples=samples)
    got = u.share_interval(run, "m", "draft_propose")
    assert got["value"] == pytest.approx((0.2 + 1.0 + 3.2) / 7.0) and got["prompts"] == 3
    assert 0.2 - 1e-9 <= got["lo"] < got["value"] < got["hi"] <= 0.8 + 1e-9
    acc = u.share_interval(run, "m", "accepted", "drafted")
    assert acc["value"] == pytest.approx(14 / 24) and 0.25 - 1e-9 <= acc["lo"] < acc["hi"] <= 1 + 1e-9


def test_the_speedup_tables_carry_each_ratio_s_interval_beside_the_thesis():
    """Tables 4.6 and 4.10 of the committed book run: each measured speedup lies in its interval, the thesis'
    rows have none, and chapter 4's glued deferred intervals are these."""
    from pathlib import Path

    from thesis_lib.analysis import reference, tables
    from thesis_lib.bench.runs import load_run

    folder = next(Path(__file__).parents[1].glob("data/reference/book-cpu-embedded/cpu-embedded-bench-*"))
    run = load_run(folder)
    for n, fn in (("4.6", tables.table_4_6), ("4.10", tables.table_4_10)):
        both = reference.beside(fn(run), n)
        ours, theirs = both[both.Source == "this run"], both[both.Source == "thesis"]
        assert len(ours) == len(theirs) == 3
        assert ((ours["95 % low"] < ours.Speedup) & (ours.Speedup < ours["95 % high"])).all()
        assert theirs["95 % low"].isna().all()
    t10 = tables.table_4_10(run)
    glued = u.glued_intervals(run)
    assert list(t10["95 % low"]) == [glued[f"{k}_lo"] for k in ("def_dense_vs_base", "def_flash_vs_base",
                                                                 "def_flash_vs_dense")]
    # the other quantities the verdicts judge: each interval holds the table's point value
    t9, t11, t5 = (fn(run).set_index("Mode") for fn in (tables.table_4_9, tables.table_4_11, tables.table_4_5))
    acc = t9["Acceptance"]
    diff = acc["Dense deferred"] - acc["FlashHead deferred"]
    assert glued["acc_diff_def_lo"] <= diff <= glued["acc_diff_def_hi"]
    # their directions, on constructed sums: acceptance dense minus FlashHead, the path dense over FlashHead
    sums = {"dense_deferred": {"accepted": 3, "drafted": 4, "draft_propose": 2.0, "tokens": 10},
            "flash_deferred": {"accepted": 1, "drafted": 4, "draft_propose": 1.0, "tokens": 10},
            "flash_ordinary": {"accepted": 1, "drafted": 5}}
    assert [u.QUANTITIES[k][1](sums) for k in ("acc_diff_def", "path_dense_vs_flash", "acc_flash_ord")] == [0.5, 2.0, 0.2]
    assert glued["acc_flash_ord_lo"] <= t5.loc["FlashHead draft", "Acceptance"] <= glued["acc_flash_ord_hi"]
    path = t11["Draft ms/decode tok"]
    assert glued["path_dense_vs_flash_lo"] <= path["Dense deferred"] / path["FlashHead deferred"] <= glued["path_dense_vs_flash_hi"]


def test_a_cluster_of_two_units_draws_each_unit_with_replacement_at_the_level_asked():
    """One cluster of two units, 1 and 3: a draw takes two units with replacement, so its sum is 2 (a quarter of
    draws), 4 (half) or 6 (a quarter). The central 40 % of draws is all 4; the central 60 % reaches 2 and 6 (each
    tail holds 20 %, less than a quarter); so does the 95 % interval. A bootstrap that kept the cluster whole would
    give 4 at every level; one that ignored the level would give the same interval at 40 % and 60 %."""
    cells = [np.array([[1.0], [3.0]])]
    total = lambda v: float(v[0])  # noqa: E731
    narrow = u.bootstrap(cells, total, resamples=4000, level=0.4)
    wide = u.bootstrap(cells, total, resamples=4000, level=0.6)
    usual = u.bootstrap(cells, total, resamples=4000)
    assert narrow["value"] == 4.0 and (narrow["lo"], narrow["hi"]) == (4.0, 4.0)
    assert (wide["lo"], wide["hi"]) == (2.0, 6.0) and (usual["lo"], usual["hi"]) == (2.0, 6.0)
    assert (narrow["level"], usual["level"]) == (0.4, 0.95) and usual["resamples"] == 4000


def test_clusters_of_two_sizes_resample_clusters_then_units():
    """Two clusters, [1, 3] and [10] (the loop that serves clusters of different sizes): a draw picks two clusters
    with replacement and, in a drawn [1, 3], two of its units. Sums: both [10]: 20 (a quarter of draws); one of
    each: 10 + 2, 4 or 6; both [1, 3]: 4 to 12. The smallest sum, 4, needs both picks [1, 3] and both their unit
    draws all ones (1/4 x 1/16 = 1/64 of draws); the largest, 20, a quarter: the 95 % interval runs from at most
    6 to exactly 20."""
    cells = [np.array([[1.0], [3.0]]), np.array([[10.0]])]
    got = u.bootstrap(cells, lambda v: float(v[0]), resamples=4000)
    assert got["value"] == 14.0 and got["clusters"] == 2
    assert 4.0 <= got["lo"] <= 6.0 and got["hi"] == 20.0
    kept_whole = u.bootstrap([np.array([[4.0]]), np.array([[10.0]])], lambda v: float(v[0]), resamples=4000)
    assert (kept_whole["lo"], kept_whole["hi"]) == (8.0, 20.0)  # single units: only the clusters vary


def test_a_ratio_of_two_runs_speedups_pairs_each_run_with_its_own_baseline():
    """Run A: its mode 2x its baseline on every prompt; run B: 1.25x on the same prompts, its baseline half as
    fast as A's: the ratio of the two speedups is 1.6 with no spread, whatever the baselines' own speeds."""
    rows_a, rows_b = [], []
    for q, secs in enumerate((1.0, 4.0, 2.0)):
        rows_a += [(q, 0, "baseline", 30, secs), (q, 0, "m", 30, secs / 2)]
        rows_b += [(q, 0, "baseline", 30, 2 * secs), (q, 0, "n", 30, 2 * secs / 1.25)]
    got = u.speedup_ratio_interval((_run(rows_a), "m"), (_run(rows_b), "n"))
    assert got["ratio"] == pytest.approx(1.6) and got["prompts"] == 3
    assert got["lo"] == pytest.approx(1.6) and got["hi"] == pytest.approx(1.6)


def _two_runs(factor: float, jitter=()) -> tuple:
    """Run A with mode "m" and run B with mode "n" on the same four prompts; "n" takes ``factor`` times "m"'s
    time on each (times ``1 + jitter[q]`` where given)."""
    secs = [1.0, 3.0, 0.5, 2.0]
    a = _run([(q, 0, "m", 40, s) for q, s in enumerate(secs)])
    b = _run([(q, 0, "n", 40, s * factor * (1 + (jitter[q] if jitter else 0))) for q, s in enumerate(secs)])
    return a, b


def test_a_ratio_across_two_runs_pairs_their_prompts():
    """Two runs, the same prompts: "m" of one run over "n" of the other, paired by prompt (1.5x on every prompt:
    the interval has no width), and the other way round."""
    a, b = _two_runs(1.5)
    got = u.cross_ratio_interval((a, "m"), (b, "n"))
    assert (got["ratio"], got["lo"], got["hi"], got["prompts"]) == pytest.approx((1.5, 1.5, 1.5, 4))
    assert u.cross_ratio_interval((b, "n"), (a, "m"))["ratio"] == pytest.approx(1 / 1.5)


def test_the_fastest_setting_and_those_the_prompts_cannot_tell_from_it():
    """Three settings: "best"; "close", slower in all (6.54 s against 6.5) but faster on one prompt (the interval of
    best over it holds 1: tied); "slow", 1.5x slower on every prompt (not tied)."""
    best, close = _two_runs(1.0, jitter=(0.04, -0.01, 0.02, 0.01))
    slow = _two_runs(1.5)[1]
    name, tied = u.fastest({"close": (close, "n"), "best": (best, "m"), "slow": (slow, "n")})
    assert (name, tied) == ("best", ["close"])


NAN = float("nan")


@pytest.mark.parametrize("thesis, value, lo, hi, expected", [
    (1.7, 1.2, 1.1, 1.3, "yes"), (1.7, 0.9, 0.8, 0.95, "no"), (0.9, 0.9, 0.8, 0.95, "yes"),
    (0.9, 1.2, 1.1, 1.3, "no"), (1.7, 1.0, 0.9, 1.1, "cannot tell"), (1.7, 1.2, NAN, NAN, "yes (point only)"),
    (1.7, 0.9, NAN, NAN, "no (point only)"), (1.7, 1.2, 1.0, 1.3, "cannot tell"),
])
def test_the_direction_words(thesis, value, lo, hi, expected):
    """The thesis' way or not, by the interval where there is one (an interval touching 1 cannot tell), else by
    the point, said so."""
    assert u.direction(thesis, value, lo, hi) == expected


def test_draws_whose_denominator_is_zero_are_left_out():
    """Two items, one timed at zero seconds in its b column: a draw of that item twice has no ratio (left out, not
    an error), and the interval comes from the other draws (seed-6 survivor: ``_ratio``'s NaN)."""
    iv = u.timing_interval([1.0, 1.0], [0.0, 1.0], 2)  # draws: 2/0 (left out), 2/1, 2/1, 2/2
    assert (iv["value"], iv["lo"], iv["hi"]) == (2.0, 1.0, 2.0)


def test_the_cost_model_s_inputs_pool_each_prompt_s_timing_once_with_an_interval_of_the_same_statistic():
    """Every mode's sample of a prompt carries the same component costs (timed once per prompt and iteration): each
    counts once, the ratios are means over prompts (a prompt twice as long in context costs twice as much in both
    parts), and the interval is the same ratio's; a constant ratio has no spread."""
    from thesis_lib.analysis import theory

    samples = []
    for q, scale in enumerate([1.0, 2.0, 1.5, 3.0]):
        costs = {"target_step_s": 0.05 * scale, "draft_step_s": 0.02 * scale, "flash_draft_step_s": 0.01 * scale,
                 "target_verify_4_s": 0.06 * scale, "target_verify_5_s": 0.07 * scale}
        samples += [dict(question_id=q, iteration=0, mode=m, component_costs_s=costs) for m in ("baseline", "x", "y")]
    samples[0] = {**samples[0], "component_costs_s": {**samples[0]["component_costs_s"], "flash_draft_step_s": 9.0}}
    run = Run(path=None, config={"k": 4}, environment={}, samples=samples)
    got, ci = theory.measured_costs(run), theory.cost_intervals(run)
    # the first sample's copy of prompt 0 is the one counted (the others of that prompt are not added to it)
    assert got["c_flash"] == pytest.approx((9.0 + 0.01 * 6.5) / (0.05 * 7.5))
    assert got["c_dense"] == pytest.approx(0.4) and got["verify_k1"] == pytest.approx(1.4)
    assert ci["c_dense_lo"] == pytest.approx(0.4) and ci["c_dense_hi"] == pytest.approx(0.4)
    assert ci["c_flash_lo"] < got["c_flash"] < ci["c_flash_hi"]
    assert ci["c_flash_hi"] <= 9.0 / 0.05 + 1e-9 and ci["c_flash_lo"] >= 0.2 - 1e-9  # within the prompts' own range
    bare = Run(path=Path("bare"), config={"k": 4}, environment={}, samples=[dict(question_id=0, mode="m")])
    with pytest.raises(ConfigError, match="'bare' measured no component costs"):
        theory.measured_costs(bare)


def test_one_rule_reads_every_interval_against_its_line():
    """side: above, below, or holding the line, a bound on the line holding it unless the line is given to a side
    (a target reached counts as met; a ratio at most 1 as no gain); reads picks the words by it."""
    assert [u.side(*iv) for iv in ((1.01, 1.2), (0.8, 0.99), (0.9, 1.1), (1.0, 1.2), (0.8, 1.0))] == [1, -1, 0, 0, 0]
    assert u.side(1.1, 1.3, at=1.1, closed="above") == 1 and u.side(1.0, 1.1, at=1.1, closed="above") == 0
    assert u.side(0.9, 1.0, closed="below") == -1 and u.side(1.0, 1.0, closed="below") == -1
    assert u.side(4.3, 4.4, at=4.321) == 0 and u.side(4.33, 4.4, at=4.321) == 1  # the thesis' value as the line
    assert u.reads(0.9, 0.95, "up", "down", "?") == "down" and u.reads(float("nan"), float("nan"), "up", "down", "?") == "?"
    assert u.against_thesis(1.2, 1.3, 1.25) == "reproduced" and u.against_thesis(1.3, 1.4, 1.25) == "larger"
