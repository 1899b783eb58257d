"""The book's verdict sentences (:mod:`thesis_lib.analysis.verdicts`), pinned word for word on constructed numbers.

Each function gets inputs that drive every branch, on both sides of every threshold (an interval bound of 1.001
against 1.0 or 0.999, a tolerance's edge itself), with NaN intervals where the function falls back to the point,
so that a changed comparison operator, constant or word fails a test. Every expected sentence is written out in
full here, not built with the module's helpers.
"""

from __future__ import annotations

import pytest

from thesis_lib.analysis import verdicts as v
from thesis_studies.beyond import verdicts as beyond_verdicts
from thesis_studies.gpucheck import verdicts as gpu_verdicts
from thesis_studies.precision import verdicts as precision_verdicts

NAN = float("nan")


# --- step_vs_head ---------------------------------------------------------------------------------------------------

DILUTES = ("the body, which FlashHead does not touch, dilutes the head's gain, as chapter 2's head-share table "
           "predicts")
STEP_MORE = "here the step gained more than the head alone, which chapter 2's head-share table does not predict"
OVERLAP = ("the step's and the head's intervals overlap, so these timings cannot tell whether the body dilutes the "
           "head's gain")


@pytest.mark.parametrize("args, expected", [
    # (step, head, step_lo, step_hi, head_lo, head_hi)
    ((1.05, 1.5, 1.00, 1.099, 1.10, 1.9), DILUTES),      # step's hi just below head's lo
    ((1.05, 1.5, 1.00, 1.10, 1.10, 1.9), OVERLAP),       # touching intervals overlap
    ((1.5, 1.05, 1.101, 1.9, 1.00, 1.10), STEP_MORE),    # step's lo just above head's hi
    ((1.5, 1.05, 1.10, 1.9, 1.00, 1.10), OVERLAP),
    ((1.2, 1.3, 1.0, 1.5, 1.1, 1.6), OVERLAP),
])
def test_step_vs_head_by_intervals(args, expected):
    """A side only where the step's and the head's intervals do not overlap (touching counts as overlap)."""
    assert v.step_vs_head(*args) == expected


@pytest.mark.parametrize("args, expected", [
    ((1.05, 1.5), DILUTES),
    ((1.5, 1.05), STEP_MORE),
    ((1.2, 1.2), OVERLAP),
    # one bound missing: that side falls back to its point
    ((1.05, 1.5, NAN, 1.8, 1.4, NAN), DILUTES),
    ((1.05, 1.5, 0.9, 1.8, NAN, 1.6), OVERLAP),
])
def test_step_vs_head_without_intervals_uses_the_points(args, expected):
    """NaN (or half-NaN) intervals fall back to the points themselves."""
    assert v.step_vs_head(*args) == expected


# --- lift, beats, deferred_counts, rq_end_to_end, flash_vs_dense_resolved (intervals against 1) -------------------

@pytest.mark.parametrize("lo, hi, expected", [
    (1.001, 1.2, "a gain"),
    (1.0, 1.2, "a change these prompts cannot tell from none"),
    (0.8, 0.999, "a loss"),
    (0.8, 1.0, "a change these prompts cannot tell from none"),
])
def test_lift(lo, hi, expected):
    """Gain only where lo > 1, loss only where hi < 1; an interval touching 1 is undecided."""
    assert v.lift(lo, hi) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (1.001, 1.2, "beats"),
    (1.0, 1.2, "cannot be told apart from"),
    (0.8, 0.999, "is slower than"),
    (0.8, 1.0, "cannot be told apart from"),
])
def test_beats(lo, hi, expected):
    """Beats only where lo > 1, slower only where hi < 1."""
    assert v.beats(lo, hi) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (1.001, 1.2, "on both kinds of hardware"),
    (1.0, 1.2, "on the thesis' GPUs; this run cannot tell its effect from none"),
    (0.8, 0.999, "on the thesis' GPUs, though not in this run"),
    (0.8, 1.0, "on the thesis' GPUs; this run cannot tell its effect from none"),
])
def test_deferred_counts(lo, hi, expected):
    """Where deferred verification helps, by its interval against 1."""
    assert v.deferred_counts(lo, hi) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (1.001, 1.2, "Yes, with deferred verification: the FlashHead draft is faster than the dense one, the whole 95 % "
                 "interval of their ratio lying above 1"),
    (1.0, 1.2, "Cannot tell from this run: the 95 % interval of FlashHead's speed over the dense draft's contains 1"),
    (0.8, 0.999, "No: with deferred verification the FlashHead draft is slower than the dense one, the whole 95 % "
                 "interval of their ratio lying below 1"),
    (0.8, 1.0, "Cannot tell from this run: the 95 % interval of FlashHead's speed over the dense draft's contains 1"),
])
def test_rq_end_to_end(lo, hi, expected):
    """RQ4: a direction only where the interval excludes 1."""
    assert v.rq_end_to_end(lo, hi) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (1.001, 1.2, "the FlashHead draft is faster"),
    (1.0, 1.2, "the FlashHead draft and the dense draft cannot be told apart at this sample size"),
    (0.8, 0.999, "the dense draft is faster"),
    (0.8, 1.0, "the FlashHead draft and the dense draft cannot be told apart at this sample size"),
])
def test_flash_vs_dense_resolved(lo, hi, expected):
    """Which draft is faster, with the FlashHead draft as the first mode of the ratio."""
    assert v.flash_vs_dense_resolved(lo, hi) == expected


# --- acceptance_change ----------------------------------------------------------------------------------------------

SAME, DENSE, FLASH, UNKNOWN = ("barely changes", "is higher with the dense draft", "is higher with the FlashHead draft",
                               "cannot be told apart")


@pytest.mark.parametrize("lo, hi, expected", [
    (-0.02, 0.02, SAME),          # the tolerance's edges themselves count as within
    (-0.0201, 0.02, UNKNOWN),     # just outside below, straddling 0
    (-0.02, 0.0201, UNKNOWN),     # just outside above, straddling 0
    (0.005, 0.015, SAME),         # excludes 0 but lies within the tolerance: still "same"
    (0.001, 0.0201, DENSE),       # excludes 0, pokes out of the tolerance
    (0.0, 0.05, UNKNOWN),         # touches 0: no side
    (-0.0201, -0.001, FLASH),
    (-0.05, 0.0, UNKNOWN),
    (0.03, 0.06, DENSE),
    (-0.06, -0.03, FLASH),
])
def test_acceptance_change_by_interval(lo, hi, expected):
    """Within 0.02 of 0 (inclusive) the rates barely change; otherwise a side only where the interval excludes 0."""
    # the points (0.7 vs 0.1) would say "dense": the interval decides when there is one
    assert v.acceptance_change(0.7, 0.1, lo, hi) == expected


@pytest.mark.parametrize("dense, flash, lo, hi, expected", [
    (0.51, 0.50, NAN, NAN, SAME),
    (0.60, 0.50, NAN, NAN, DENSE),
    (0.50, 0.60, NAN, NAN, FLASH),
    (0.60, 0.50, NAN, 0.01, DENSE),   # one bound missing: the point decides
    (0.50, 0.60, -0.01, NAN, FLASH),
])
def test_acceptance_change_without_interval_uses_the_point(dense, flash, lo, hi, expected):
    """Without a (whole) interval the point difference dense - flash decides."""
    assert v.acceptance_change(dense, flash, lo, hi) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (-0.05, 0.05, SAME),
    (-0.0501, 0.01, UNKNOWN),
    (0.001, 0.0501, DENSE),
])
def test_acceptance_change_with_another_tolerance(lo, hi, expected):
    """The tolerance parameter moves the "barely changes" band."""
    assert v.acceptance_change(0.5, 0.5, lo, hi, tolerance=0.05) == expected


# --- gain_source ----------------------------------------------------------------------------------------------------

FROM_PATH = "the gain comes from the draft path"
PATH_UNTOLD = "these prompts cannot tell whether the gain comes from the draft path"
NOT_PATH = "the gain does not come from a cheaper draft path"
SLOWER_ALTHOUGH = "FlashHead is slower end to end here, although its draft path"
UNTOLD_ALTHOUGH = "these prompts cannot tell FlashHead's end-to-end difference from none, although its draft path"


@pytest.mark.parametrize("lo, hi, path_lo, path_hi, expected", [
    (1.001, 1.2, 1.001, 1.3, FROM_PATH),
    (1.001, 1.2, 1.0, 1.3, PATH_UNTOLD),     # path interval touching 1: unknown
    (1.001, 1.2, 0.9, 1.001, PATH_UNTOLD),
    (1.001, 1.2, 0.9, 1.0, NOT_PATH),        # path hi == 1: not cheaper
    (1.001, 1.2, 0.8, 0.95, NOT_PATH),
    (1.0, 1.2, 1.1, 1.3, UNTOLD_ALTHOUGH),   # end-to-end interval touching 1
    (0.9, 1.0, 1.1, 1.3, UNTOLD_ALTHOUGH),
    (0.8, 0.999, 1.1, 1.3, SLOWER_ALTHOUGH),
    (0.8, 0.999, 0.8, 0.9, SLOWER_ALTHOUGH),
])
def test_gain_source_by_intervals(lo, hi, path_lo, path_hi, expected):
    """The path's interval decides where the end-to-end interval lies above 1; else the end-to-end side alone."""
    # the path's point (2.0 / 1.0) says cheaper: the interval decides when there is one
    assert v.gain_source(lo, hi, 2.0, 1.0, path_lo, path_hi) == expected


@pytest.mark.parametrize("dense_ms, flash_ms, expected", [
    (2.0, 1.0, FROM_PATH),       # point ratio 2 > 1
    (1.0, 1.0, NOT_PATH),        # point ratio exactly 1: not cheaper
    (1.0, 2.0, NOT_PATH),
])
def test_gain_source_without_path_interval_uses_the_point(dense_ms, flash_ms, expected):
    """Without a path interval the point ratio dense/flash of the draft path's cost per token decides."""
    assert v.gain_source(1.1, 1.3, dense_ms, flash_ms) == expected


# --- sweep_winner ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("best_k, tied, expected", [
    (4, "", "K = 4 was the fastest, ahead of every other K measured by more than the prompts' spread"),
    (4, "3", "K = 4 was the fastest by its point estimate, but these prompts cannot tell it apart from K = 3"),
    (6, "3, 5", "K = 6 was the fastest by its point estimate, but these prompts cannot tell it apart from K = 3, 5"),
])
def test_sweep_winner(best_k, tied, expected):
    """Clear winner only where no K is tied with it; else the tied Ks are named as given."""
    assert v.sweep_winner(best_k, tied) == expected


# --- agrees_more ----------------------------------------------------------------------------------------------------

NEITHER_AGREE = "cannot be told to agree more or less often, at this sample size,"


@pytest.mark.parametrize("ours, theirs, lo, hi, expected", [
    (0.7, 0.6, 0.601, 0.8, "agrees more often"),
    (0.7, 0.6, 0.6, 0.8, NEITHER_AGREE),          # lo == theirs
    (0.5, 0.6, 0.4, 0.599, "agrees less often"),
    (0.5, 0.6, 0.4, 0.6, NEITHER_AGREE),          # hi == theirs
    (0.7, 0.6, 0.5, 0.8, NEITHER_AGREE),
    # without an interval, the point
    (0.601, 0.6, NAN, NAN, "agrees more often"),
    (0.599, 0.6, NAN, NAN, "agrees less often"),
    (0.6, 0.6, NAN, NAN, NEITHER_AGREE),
    (0.7, 0.6, NAN, 0.5, "agrees more often"),     # half an interval: the point
])
def test_agrees_more(ours, theirs, lo, hi, expected):
    """A side only where the interval (or, without one, the point) lies strictly on one side of the thesis' value."""
    assert v.agrees_more(ours, theirs, lo, hi) == expected


# --- flash_gain_where -----------------------------------------------------------------------------------------------

BOTH_SCHEDULES = ("here FlashHead gains over the dense draft in the ordinary schedule already, and with deferred "
                  "verification too, so the append is not what hides the head's saving on this machine")
DEFERRED_ONLY = ("here, as in the thesis, FlashHead's gain over the dense draft shows once deferred verification "
                 "removes the append")
ORDINARY_ONLY = ("here FlashHead gains over the dense draft in the ordinary schedule, and this run cannot resolve a "
                 "gain with deferred verification")
NEITHER_SCHEDULE = "here neither schedule shows a gain of FlashHead over the dense draft that this run can resolve"


@pytest.mark.parametrize("ord_lo, def_lo, expected", [
    (1.001, 1.001, BOTH_SCHEDULES),
    (1.0, 1.001, DEFERRED_ONLY),
    (1.001, 1.0, ORDINARY_ONLY),
    (1.0, 1.0, NEITHER_SCHEDULE),
    (0.8, 0.8, NEITHER_SCHEDULE),
])
def test_flash_gain_where(ord_lo, def_lo, expected):
    """A gain in a schedule only where its interval's lower bound exceeds 1 (upper bounds play no part)."""
    assert v.flash_gain_where(ord_lo, 1.3, def_lo, 1.3) == expected


# --- cheaper --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a_ms, b_ms, expected", [
    (0.999, 1.0, "cheaper"),
    (1.0, 1.0, "not cheaper here"),
    (1.001, 1.0, "not cheaper here"),
])
def test_cheaper(a_ms, b_ms, expected):
    """Cheaper only when strictly less."""
    assert beyond_verdicts.cheaper(a_ms, b_ms) == expected


# --- target_met, gpu_head_target, gpu_step_target --------------------------------------------------------------------

NEITHER_MEETS = "neither clearly meets nor clearly misses"


@pytest.mark.parametrize("ratio, lo, hi, expected", [
    (1.2, 1.10, 1.3, "meets"),           # lo == target meets
    (1.2, 1.0999, 1.3, NEITHER_MEETS),
    (1.0, 0.9, 1.0999, "does not meet"),
    (1.0, 0.9, 1.10, NEITHER_MEETS),     # hi == target: not clearly missed
    (1.10, NAN, NAN, "meets"),           # without an interval: the point, inclusive
    (1.0999, NAN, NAN, "does not meet"),
    (1.2, NAN, 1.0, "meets"),            # half an interval: the point
])
def test_target_met_default_target(ratio, lo, hi, expected):
    """Against 1.10: meets where the interval's lo reaches it, misses where hi stays below it."""
    assert v.target_met(ratio, lo=lo, hi=hi) == expected


@pytest.mark.parametrize("ratio, expected", [(1.5, "meets"), (1.4999, "does not meet")])
def test_target_met_other_target(ratio, expected):
    """The target parameter is the threshold."""
    assert v.target_met(ratio, 1.5) == expected


@pytest.mark.parametrize("ratio, expected", [(4.32, "meets"), (4.3199, "does not meet"), (5.0, "meets")])
def test_gpu_head_target(ratio, expected):
    """The thesis' 4.32x, inclusive."""
    assert gpu_verdicts.gpu_head_target(ratio) == expected


@pytest.mark.parametrize("ratio, expected", [(1.108, "meets"), (1.1079, "does not meet"), (1.2, "meets")])
def test_gpu_step_target(ratio, expected):
    """The thesis' 1.108x, inclusive."""
    assert gpu_verdicts.gpu_step_target(ratio) == expected


# --- gpu_probes_meeting ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("speeds, expected", [
    ((4.0, 4.1, 4.2, 4.3199), "at none of the probe counts measured"),
    ((NAN, NAN, NAN, NAN), "at none of the probe counts measured"),
    ((4.0, 4.1, 4.2, 4.32), "at 593 probes"),
    ((4.32, 4.3199, 4.0, 4.0), "at 64 probes"),
    ((4.5, 4.4, 4.0, NAN), "at 64 and 128 probes"),
    ((4.5, NAN, 4.4, 4.33), "at 64, 256 and 593 probes"),
    ((5.0, 5.0, 5.0, 5.0), "at 64, 128, 256 and 593 probes"),
])
def test_gpu_probes_meeting(speeds, expected):
    """The probe counts whose ratio reaches 4.32 (inclusive), NaN skipped, listed with commas and a final "and"."""
    assert gpu_verdicts.gpu_probes_meeting(*speeds) == expected


def test_gpu_probes_meeting_other_target():
    """The target parameter is the threshold."""
    assert gpu_verdicts.gpu_probes_meeting(2.0, 1.999, 2.5, 1.0, target=2.0) == "at 64 and 256 probes"


# --- step_reach -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ceiling, target, expected", [
    (NAN, 1.108, "which was not measured"),
    (1.1079, 1.108, "so no head, however fast, can reach the thesis' 1.108x on this body"),
    (1.108, 1.108, "so a faster head could still reach the thesis' 1.108x on this body"),
    (1.3, 1.108, "so a faster head could still reach the thesis' 1.108x on this body"),
    (1.0999, 1.1, "so no head, however fast, can reach the thesis' 1.100x on this body"),
    (1.25, 1.2346, "so a faster head could still reach the thesis' 1.235x on this body"),   # rounded, not cut
])
def test_step_reach(ceiling, target, expected):
    """Reachable where the free-head ceiling reaches the target (inclusive); the target to three decimals."""
    assert gpu_verdicts.step_reach(ceiling, target) == expected


def test_step_reach_default_target():
    """The default target is the thesis' 1.108x."""
    assert gpu_verdicts.step_reach(1.1079) == "so no head, however fast, can reach the thesis' 1.108x on this body"


# --- switch_effect --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, lo, hi, them, expected", [
    (1.0126, 1.0014, 1.0239, "them", "faster with them (1.013x, 1.001-1.024)"),
    (1.0126, 1.0, 1.0239, "them", "neither clearly faster nor slower with them (1.013x, 1.000-1.024)"),
    (0.9876, 0.9754, 0.9996, "them", "slower with them (0.9876x, 0.9754-0.9996)"),  # a bound near 1: four digits
    (1.0126, 1.0004, 1.0239, "them", "faster with them (1.0126x, 1.0004-1.0239)"),
    (1.01, 0.9996, 1.02, "them", "neither clearly faster nor slower with them (1.0100x, 0.9996-1.0200)"),  # lo alone
    (1.01, 1.0005, 1.02, "them", "faster with them (1.0100x, 1.0005-1.0200)"),  # 1.0005 rounds to 1.000 at three
    (1.01, 1.00003, 1.02, "them", "faster with them (1.01000x, 1.00003-1.02000)"),  # and to 1.0000 at four
    (1.01, 1 + 1e-12, 1.02, "them", "faster with them (1.01000000x, 1.00000000-1.02000000)"),  # eight at most
    (0.9876, 0.9754, 1.0, "them", "neither clearly faster nor slower with them (0.988x, 0.975-1.000)"),
    (1.0126, 1.0014, 1.0239, "it", "faster with it (1.013x, 1.001-1.024)"),
    (0.9876, 0.9754, 0.9991, "it", "slower with it (0.988x, 0.975-0.999)"),
])
def test_switch_effect(value, lo, hi, them, expected):
    """Faster where lo > 1, slower where hi < 1, with the speedup and its interval to three decimals (more where a
    bound would print as 1.000 from either side)."""
    assert precision_verdicts.switch_effect(value, lo, hi, them) == expected


@pytest.mark.parametrize("value, lo, hi", [(NAN, 1.1, 1.2), (1.1, NAN, 1.2), (1.1, 1.0, NAN)])
def test_switch_effect_not_compared(value, lo, hi):
    """Any NaN among the three numbers: not compared."""
    assert precision_verdicts.switch_effect(value, lo, hi) == "not compared in this profile"


def test_switch_effect_default_word():
    """The default object of the sentence is "them"."""
    assert precision_verdicts.switch_effect(1.5, 1.25, 1.75) == "faster with them (1.500x, 1.250-1.750)"



def test_the_step_switches_verdicts_name_their_switch():
    """The fused operations are "them"; the compact step, the layers in one call and FlashHead's kernel "it",
    the kernel for the draft's step only."""
    rules = next(r for r in precision_verdicts.RULES.values() if "spf_draft_verdict" in r)
    numbers = {"value": 1.0126, "lo": 1.0014, "hi": 1.0239}
    for key, them in (("spf_target5_verdict", "them"), ("spc_draft_verdict", "it"), ("spn_target1_verdict", "it"),
                      ("sph_draft_verdict", "it")):
        rule, names = rules[key]
        assert rule(**numbers) == f"faster with {them} (1.013x, 1.001-1.024)", key
        assert set(names) == set(numbers) and names["lo"] == key.replace("verdict", "lo")
    assert "sph_target1_verdict" not in rules

# --- loop_beyond ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("share, expected", [
    (NAN, "was not timed"),
    (-0.031, "spends nothing measurable beyond its one-token step and head (-3.1% of its time per token)"),
    (0.0, "spends nothing measurable beyond its one-token step and head (+0.0% of its time per token)"),
    (0.049, "spends nothing measurable beyond its one-token step and head (+4.9% of its time per token)"),
    (0.05, "spends 5% of each token's time beyond its one-token step and head"),
    (0.126, "spends 13% of each token's time beyond its one-token step and head"),
])
def test_loop_beyond(share, expected):
    """Below the 5 % noise (negative too) nothing measurable, signed to a tenth of a percent (so that it never
    prints the threshold itself); from 5 % on, the share in whole percent."""
    assert precision_verdicts.loop_beyond(share) == expected


def test_loop_beyond_other_noise():
    """The noise parameter is the threshold."""
    assert precision_verdicts.loop_beyond(0.099, noise=0.1) == \
        "spends nothing measurable beyond its one-token step and head (+9.9% of its time per token)"
    assert precision_verdicts.loop_beyond(0.1, noise=0.1) == "spends 10% of each token's time beyond its one-token step and head"


# --- draft_regime ---------------------------------------------------------------------------------------------------

TENTH = "a draft at about a tenth of a target step, the regime the thesis studies"


@pytest.mark.parametrize("c, expected", [
    (NAN, "not measured"),
    (0.0494, "a draft at 0.049 of a target step, cheaper than the thesis' regime of about a tenth"),
    (0.0499, TENTH),  # judged as printed: 0.050
    (0.0495, TENTH),
    (0.04949, "a draft at 0.049 of a target step, cheaper than the thesis' regime of about a tenth"),
    (0.05, TENTH),
    (0.1, TENTH),
    (0.15, TENTH),
    (0.1501, TENTH),  # judged as printed: 0.150
    (0.1506, "a draft at 0.151 of a target step, dearer than the thesis' regime of about a tenth"),
    (0.236, "a draft at 0.236 of a target step, dearer than the thesis' regime of about a tenth"),
])
def test_draft_regime(c, expected):
    """0.05-0.15 inclusive is the thesis' regime, judged on the value as printed (three decimals)."""
    assert gpu_verdicts.draft_regime(c) == expected


# --- block_rise -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("v5_int4, v5_bf16, expected", [
    (NAN, 2.0, "cannot be compared with the bfloat16 stack's here"),
    (2.0, NAN, "cannot be compared with the bfloat16 stack's here"),
    (2.1001, 2.0, "rises faster than the bfloat16 stack's"),
    (2.1, 2.0, "rises no faster than the bfloat16 stack's"),    # exactly 0.1 more: not "clearly"
    (2.0999, 2.0, "rises no faster than the bfloat16 stack's"),
    (1.5, 2.0, "rises no faster than the bfloat16 stack's"),
])
def test_block_rise(v5_int4, v5_bf16, expected):
    """Rises faster only by more than 0.1 steps."""
    assert gpu_verdicts.block_rise(v5_int4, v5_bf16) == expected


# --- fewer_kernels --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kept_us, best_us, expected", [
    (NAN, 90.0, "have not been timed"),
    (100.0, NAN, "have not been timed"),
    (100.0, 105.06, "were slower (the closest took 105.1 µs where the five kernels took 100.0 µs in the same run): the "
                    "work they moved onto single, waiting or searching thread blocks cost more than the launches it "
                    "saved"),
    (100.0, 105.0, "were no faster (the closest took 105.0 µs where the five kernels took 100.0 µs in the same run)"),
    (100.0, 95.3, "were no faster (the closest took 95.3 µs where the five kernels took 100.0 µs in the same run)"),
    (100.0, 95.23809523809524,   # exactly 100 / 1.05: still a draw
     "were no faster (the closest took 95.2 µs where the five kernels took 100.0 µs in the same run)"),
    (100.0, 95.16, "were faster (the closest took 95.2 µs where the five kernels took 100.0 µs in the same run)"),
    (100.04, 80.0, "were faster (the closest took 80.0 µs where the five kernels took 100.0 µs in the same run)"),
])
def test_fewer_kernels(kept_us, best_us, expected):
    """Within 5 % either way (best <= 1.05 kept and >= kept / 1.05) a draw; times to one decimal."""
    assert gpu_verdicts.fewer_kernels(kept_us, best_us) == expected


# --- chained_gain ---------------------------------------------------------------------------------------------------

_CH = ("{a} µs against 100.0 timed alone, {d} times as fast as the dense head; {m} against 50.0 µs between two "
       "other heads")


@pytest.mark.parametrize("alone_us, mid_us, expected", [
    (95.0, 47.0, "made the head faster on both footings (" + _CH.format(a="95.0", d="4.21", m="47.0") + ")"),
    (95.3, 47.0, "made the head faster on one footing only (" + _CH.format(a="95.3", d="4.20", m="47.0")
     + "): a gain the surroundings decide"),
    (95.0, 47.7, "made the head faster on one footing only (" + _CH.format(a="95.0", d="4.21", m="47.7")
     + "): a gain the surroundings decide"),
    (96.0, 48.0, "made the head no faster (" + _CH.format(a="96.0", d="4.17", m="48.0") + ")"),
    (120.0, 60.0, "made the head no faster (" + _CH.format(a="120.0", d="3.33", m="60.0") + ")"),
])
def test_chained_gain(alone_us, mid_us, expected):
    """Faster on a footing where before / after reaches 1.05 (100 / 95.3 = 1.049 does not); slower is no faster."""
    assert gpu_verdicts.chained_gain(100.0, alone_us, 50.0, mid_us, 400.0) == expected


@pytest.mark.parametrize("missing", range(5))
def test_chained_gain_untimed(missing):
    args = [100.0, 95.0, 50.0, 47.0, 400.0]
    args[missing] = NAN
    assert gpu_verdicts.chained_gain(*args) == "has not been timed"


# --- compiled_sound -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compiled, path, rows, expected", [
    (NAN, 100.0, 128.0, "was not measured"),
    (49.0, 100.0, 128.0, "picked the reference's token on only 49 of 128 states: a miscompiled head, which is why "
                         "a GPU takes the Triton kernel"),
    (49.9, 100.0, 128.0, "picked the reference's token on only 49 of 128 states: a miscompiled head, which is why "
                         "a GPU takes the Triton kernel"),
    (50.0, 100.0, 128.0, "picked the reference's token on 50 of 128 states, as the kernel path does"),
    (128.0, 128.0, 128.0, "picked the reference's token on 128 of 128 states, as the kernel path does"),
])
def test_compiled_sound(compiled, path, rows, expected):
    """Under half the path's count is a miscompile (half itself is not); counts truncated to integers."""
    assert gpu_verdicts.compiled_sound(compiled, path, rows) == expected


# --- head_side ------------------------------------------------------------------------------------------------------

HEAD_CANNOT = "The head-side ideas cannot reach the target on this machine, as the measured costs show"
HEAD_COULD = "The head-side ideas could reach the target on this machine in principle (the free-head ceiling allows it)"
HEAD_UNTOLD = ("Whether the head-side ideas could reach the target cannot be told from the profiled run: the free-head "
               "ceiling misses it, but its bound without finalization (the deferred schedule's) would allow it")


@pytest.mark.parametrize("head_ceiling, ceiling_bound, expected", [
    (1.05, 1.0999, HEAD_CANNOT),
    (1.2, 1.0999, HEAD_CANNOT),        # the bound decides first
    (1.10, 1.10, HEAD_COULD),          # both exactly at the target
    (1.0999, 1.10, HEAD_UNTOLD),
    (1.05, 1.3, HEAD_UNTOLD),
])
def test_head_side(head_ceiling, ceiling_bound, expected):
    """Bound below 1.10: cannot; else ceiling reaching 1.10 (inclusive): could; else cannot be told."""
    assert beyond_verdicts.head_side(head_ceiling, ceiling_bound) == expected


def test_head_side_other_target():
    """The target parameter is the threshold for both numbers."""
    assert beyond_verdicts.head_side(1.2, 1.2499, target=1.25) == HEAD_CANNOT
    assert beyond_verdicts.head_side(1.25, 1.25, target=1.25) == HEAD_COULD
    assert beyond_verdicts.head_side(1.2499, 1.25, target=1.25) == HEAD_UNTOLD


# --- bound_allows ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("oracle, target, expected", [
    (1.10, 1.10, "do not show that no configuration can gain 10 %: a schedule that knew which blocks fail would"),
    (1.0999, 1.10, "leave no room for 10 % even for a schedule that knew which blocks fail"),
    (1.25, 1.25, "do not show that no configuration can gain 25 %: a schedule that knew which blocks fail would"),
    (1.2499, 1.25, "leave no room for 25 % even for a schedule that knew which blocks fail"),
])
def test_bound_allows(oracle, target, expected):
    """Room where the bound reaches the target (inclusive); the target's gain in whole percent."""
    assert beyond_verdicts.bound_allows(oracle, target) == expected


def test_bound_allows_default_target():
    """The default target is 1.10."""
    assert beyond_verdicts.bound_allows(1.0999) == "leave no room for 10 % even for a schedule that knew which blocks fail"


# --- share_of_room --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("achieved, bound, expected", [
    (1.2, 1.0, "none of the room"),       # no room
    (1.2, 0.9, "none of the room"),
    (1.0, 1.6, "none of the room"),       # no gain
    (0.9, 1.6, "none of the room"),
    (1.001, 1.6, "only a small part of the room"),
    (1.199, 1.6, "only a small part of the room"),   # 0.332 of the room
    (1.201, 1.6, "about half of the room"),          # 0.335
    (1.399, 1.6, "about half of the room"),          # 0.665
    (1.401, 1.6, "most of the room"),                # 0.668
    (1.25, 1.75, "about half of the room"),          # exactly 1/3 of the room
    (1.5, 1.75, "most of the room"),                 # exactly 2/3
    (1.7, 1.6, "most of the room"),
])
def test_share_of_room(achieved, bound, expected):
    """Thirds of the room to the bound: under 1/3 small, under 2/3 about half, else most; none without room or gain."""
    assert beyond_verdicts.share_of_room(achieved, bound) == expected


# --- stop_trade -----------------------------------------------------------------------------------------------------

ABOUT_AS_OFTEN = "throws away good tokens about as often as it saves bad ones"
THROWS_MORE = "throws away good tokens more often than it saves bad ones"
SAVES_MORE = "saves bad tokens more often than it throws away good ones"


@pytest.mark.parametrize("kept, expected", [
    (34.9, SAVES_MORE), (35.0, ABOUT_AS_OFTEN), (50.0, ABOUT_AS_OFTEN), (65.0, ABOUT_AS_OFTEN), (65.1, THROWS_MORE),
])
def test_stop_trade(kept, expected):
    """35-65 % kept (inclusive) is about even; above, more good thrown away; below, more bad saved."""
    assert beyond_verdicts.stop_trade(kept) == expected


# --- furthest_off ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    # (hybrid model, hybrid run, stop model, stop run)
    ((1.2, 1.0, 1.1, 1.0), "The hybrid"),
    ((0.8, 1.0, 1.1, 1.0), "The hybrid"),             # relative error is absolute: 0.8 is 20 % off
    ((1.1, 1.0, 0.8, 1.0), "The confidence stop without lookups"),
    ((1.1, 1.0, 1.1, 1.0), "The hybrid"),             # a tie goes to the hybrid
    ((2.2, 2.0, 1.2, 1.0), "The confidence stop without lookups"),   # 10 % vs 20 %: relative, not absolute gap
])
def test_furthest_off(args, expected):
    """The draft whose modelled ratio is further off its run in relative terms; ties name the hybrid."""
    assert beyond_verdicts.furthest_off(*args) == expected


# --- ceiling_vs_spread ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ceiling, expected", [
    (1.05, "is small beside the spread of per-prompt FlashHead/dense ratios on this shared machine"),
    (1.099, "is small beside the spread of per-prompt FlashHead/dense ratios on this shared machine"),
    (1.101, "is larger than the spread of per-prompt FlashHead/dense ratios in this run"),
    (0.95, "is small beside the spread of per-prompt FlashHead/dense ratios on this shared machine"),
])
def test_ceiling_vs_spread(ceiling, expected):
    """The ceiling's gain (ceiling - 1) against the P25-P75 spread, here 0.95-1.05."""
    assert v.ceiling_vs_spread(ceiling, 0.95, 1.05) == expected


def test_ceiling_vs_spread_equal_is_not_small():
    """A gain exactly as large as the spread (0.25 against 1.0-1.25, exact in binary) is not "small"."""
    assert v.ceiling_vs_spread(1.25, 1.0, 1.25) == \
        "is larger than the spread of per-prompt FlashHead/dense ratios in this run"


# --- smaller_here ---------------------------------------------------------------------------------------------------

SMALLER = ("smaller than on the calibration prompts, in the model as in the run, so the benchmark prompts leave less "
           "to gain")
NOT_SMALLER = "not smaller than on the calibration prompts"


@pytest.mark.parametrize("model_here, run_here, expected", [
    (1.199, 1.199, SMALLER),
    (1.2, 1.1, NOT_SMALLER),      # the model's equal to before
    (1.1, 1.2, NOT_SMALLER),      # the run's equal to before
    (1.3, 1.1, NOT_SMALLER),
    (1.1, 1.3, NOT_SMALLER),
])
def test_smaller_here(model_here, run_here, expected):
    """Smaller only where both the model and the run lie strictly below the calibration value (1.2)."""
    assert beyond_verdicts.smaller_here(model_here, run_here, 1.2) == expected


# --- shared_control -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    ("the dense draft's own (Qwen3-0.6B)",
     "here the two bodies are one model (no FlashHead checkpoint's body was given), so the control is the dense "
     "draft again and measures the run-to-run spread of an identical configuration"),
    ("the dense draft's own", "here the two bodies are one model (no FlashHead checkpoint's body was given), so the "
                              "control is the dense draft again and measures the run-to-run spread of an identical "
                              "configuration"),
    ("embedl/Qwen3-0.6B-FlashHead", "here that body is the FlashHead checkpoint's own (embedl/Qwen3-0.6B-FlashHead)"),
    ("The dense draft's own", "here that body is the FlashHead checkpoint's own (The dense draft's own)"),
])
def test_shared_control(body, expected):
    """The dense body again where the recorded body starts with "the dense draft's own" (case-sensitive)."""
    assert v.shared_control(body) == expected


# --- walk_counts ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("counts, expected", [
    ((3, 0, 0, 0), "Rounds, drafted and accepted tokens agree exactly in all 3 modes"),
    ((3, 0, 2, 0), "Rounds and accepted tokens agree in all 3 modes; the walk's totals part from the run's in drafted "
                   "tokens by up to 2"),
    ((4, 1, 0, 0), "Drafted tokens and accepted tokens agree in all 4 modes; the walk's totals part from the run's in "
                   "rounds by up to 1"),
    ((2, 1, 2, 0), "Accepted tokens agree in all 2 modes; the walk's totals part from the run's in rounds by up to 1, "
                   "drafted tokens by up to 2"),
    ((5, 1, 2, 3), "The walk's totals part from the run's in rounds by up to 1, drafted tokens by up to 2, accepted "
                   "tokens by up to 3"),
])
def test_walk_counts(counts, expected):
    """Exact agreement, else the counts that agree (capitalised) and each gap, in the order rounds, drafted,
    accepted."""
    assert beyond_verdicts.walk_counts(*counts) == expected


# --- overlap_effect -------------------------------------------------------------------------------------------------

SLOWED = "slowed both drafts down on every prompt"
SPED = "sped both drafts up on every prompt"
MIXED = "went one way on some prompts and the other way on others, so these prompts cannot tell its effect"


@pytest.mark.parametrize("dense, flash, expected", [
    # (lo, hi) per draft
    ((0.8, 0.999), (0.85, 0.999), SLOWED),
    ((0.8, 0.999), (0.85, 1.0), MIXED),          # one prompt of one draft at exactly 1
    ((1.0, 1.2), (0.85, 0.95), MIXED),
    ((1.001, 1.2), (1.001, 1.3), SPED),
    ((1.001, 1.2), (1.0, 1.3), MIXED),
    ((0.9, 1.1), (0.95, 1.05), MIXED),
])
def test_overlap_effect(dense, flash, expected):
    """A direction only where every prompt of both drafts lies strictly on one side of 1."""
    assert v.overlap_effect(dense[0], dense[1], flash[0], flash[1]) == expected


# --- overlap_cost ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fin_ord, fin_pipe, prop_ord, prop_pipe, expected", [
    (100.0, 100.0, 50.0, 40.0, "the wait for the append did not fall"),     # equal: did not fall
    (100.0, 120.0, 50.0, 40.0, "the wait for the append did not fall"),
    (100.0, 99.9, 50.0, 50.1, "the proposals took longer while the append ran beside them, on the same hardware"),
    (100.0, 99.9, 50.0, 50.0, "the wait fell without slowing the proposals"),   # equal proposals: not slower
    (100.0, 60.0, 50.0, 45.0, "the wait fell without slowing the proposals"),
])
def test_overlap_cost(fin_ord, fin_pipe, prop_ord, prop_pipe, expected):
    """The append's wait must fall strictly; then the proposals are slower only where strictly longer."""
    assert v.overlap_cost(fin_ord, fin_pipe, prop_ord, prop_pipe) == expected


# --- rq_proposal ----------------------------------------------------------------------------------------------------

def _proposal(head=(1.5, 1.001, 2.0), step=(1.2, 1.001, 1.4), path=(1.1, 1.001, 1.2)):
    """rq_proposal with (point, lo, hi) per level; the path's point is its dense cost per token over FlashHead's
    1 ms, so ``path[0]`` is the path's ratio."""
    return v.rq_proposal(head[0], step[0], path[0], 1.0, head_lo=head[1], head_hi=head[2], step_lo=step[1],
                         step_hi=step[2], path_lo=path[1], path_hi=path[2])


@pytest.mark.parametrize("levels, expected", [
    (dict(head=(0.95, 0.9, 1.0)), "It does not: FlashHead's head is no faster than the dense head here"),
    (dict(head=(1.05, 1.0, 1.1)),
     "These measurements cannot tell: FlashHead's head is not clearly faster than the dense head here"),
    (dict(head=(1.05, 0.999, 1.001)),
     "These measurements cannot tell: FlashHead's head is not clearly faster than the dense head here"),
    (dict(step=(0.98, 0.9, 1.0)), "Only locally: the head is faster, but a whole draft step not"),
    (dict(path=(0.9, 0.8, 0.999)), "Only locally: the head is faster, but the draft path per decoded token not"),
    (dict(step=(0.98, 0.9, 1.0), path=(0.9, 0.8, 0.999)),
     "Only locally: the head is faster, but a whole draft step and the draft path per decoded token not"),
    (dict(step=(0.98, 0.9, 1.0), path=(1.0, 0.95, 1.001)),
     "Only locally: the head is faster, but a whole draft step not, and these measurements cannot tell for the "
     "draft path per decoded token"),
    (dict(step=(1.0, 1.0, 1.2)),
     "It lowers it at the head and at the draft path per decoded token; these measurements cannot tell whether it "
     "lowers a whole draft step"),
    (dict(path=(1.0, 0.9, 1.001)),
     "It lowers it at the head and at a whole draft step; these measurements cannot tell whether it lowers the "
     "draft path per decoded token"),
    (dict(step=(1.0, 1.0, 1.2), path=(1.0, 0.9, 1.001)),
     "It lowers it at the head; these measurements cannot tell whether it lowers a whole draft step and the draft "
     "path per decoded token"),
    (dict(), "It lowers it at every level measured, the most at the head itself"),
    (dict(head=(1.2, 1.001, 1.4), step=(1.2, 1.001, 1.4)),       # a tie for the largest goes to the head
     "It lowers it at every level measured, the most at the head itself"),
    (dict(head=(1.19, 1.001, 1.4), step=(1.2, 1.001, 1.4)), "It lowers it at every level measured"),
    (dict(head=(1.19, 1.001, 1.4), path=(1.2, 1.001, 1.4)), "It lowers it at every level measured"),
])
def test_rq_proposal_by_intervals(levels, expected):
    """RQ1: each level lowered where its interval's lo > 1, not where its hi <= 1, else unknown; the head decides
    first, then any level not lowered, then any unknown, then where the largest point gain is."""
    assert _proposal(**levels) == expected


@pytest.mark.parametrize("head, step, dense_ms, flash_ms, expected", [
    (1.5, 1.2, 2.2, 2.0, "It lowers it at every level measured, the most at the head itself"),
    (1.0, 1.2, 2.2, 2.0, "It does not: FlashHead's head is no faster than the dense head here"),   # point 1: not
    (1.5, 1.0, 2.2, 2.0, "Only locally: the head is faster, but a whole draft step not"),
    (1.5, 1.2, 2.0, 2.0, "Only locally: the head is faster, but the draft path per decoded token not"),
    (1.5, 1.2, 4.0, 2.0, "It lowers it at every level measured"),     # the path's point (2.0) is the largest
])
def test_rq_proposal_without_intervals_uses_the_points(head, step, dense_ms, flash_ms, expected):
    """Without intervals each level's point decides (the path's as dense/flash cost per token): lowered above 1,
    not at or below 1, so a point never leaves a level unknown."""
    assert v.rq_proposal(head, step, dense_ms, flash_ms) == expected


# --- rq_ranking -----------------------------------------------------------------------------------------------------

FASTER, SLOWER, UNTOLD = (1.001, 1.2), (0.8, 0.999), (1.0, 1.0)

MODES = ("ord_dense_vs_base", "ord_flash_vs_base", "def_dense_vs_base", "def_flash_vs_base", "ord_flash_vs_dense",
         "def_flash_vs_dense")


def _ranking(*intervals):
    """rq_ranking with one (lo, hi) per key of MODES, in that order."""
    bounds = {}
    for key, (lo, hi) in zip(MODES, intervals, strict=True):
        bounds[f"{key}_lo"], bounds[f"{key}_hi"] = lo, hi
    return v.rq_ranking(**bounds)


@pytest.mark.parametrize("intervals, expected", [
    ((FASTER, FASTER, FASTER, FASTER, FASTER, FASTER),
     "Faster than target-only decoding: the dense draft and the FlashHead draft and the dense draft deferred and the "
     "FlashHead draft deferred; FlashHead against the dense draft: faster under the ordinary schedule, faster under "
     "deferred verification"),
    ((SLOWER, SLOWER, SLOWER, SLOWER, SLOWER, SLOWER),
     "Slower than it: the dense draft and the FlashHead draft and the dense draft deferred and the FlashHead draft "
     "deferred; FlashHead against the dense draft: slower under the ordinary schedule, slower under deferred "
     "verification"),
    ((UNTOLD, UNTOLD, UNTOLD, UNTOLD, UNTOLD, UNTOLD),
     "Not told apart from it at this sample size: the dense draft and the FlashHead draft and the dense draft "
     "deferred and the FlashHead draft deferred; FlashHead against the dense draft: not told apart under the "
     "ordinary schedule, not told apart under deferred verification"),
    ((SLOWER, UNTOLD, FASTER, FASTER, SLOWER, FASTER),
     "Faster than target-only decoding: the dense draft deferred and the FlashHead draft deferred; slower than it: "
     "the dense draft; not told apart from it at this sample size: the FlashHead draft; FlashHead against the dense "
     "draft: slower under the ordinary schedule, faster under deferred verification"),
    ((UNTOLD, SLOWER, (1.0, 1.3), (0.9, 1.0), UNTOLD, (0.9, 1.0)),
     "Slower than it: the FlashHead draft; not told apart from it at this sample size: the dense draft and the dense "
     "draft deferred and the FlashHead draft deferred; FlashHead against the dense draft: not told apart under the "
     "ordinary schedule, not told apart under deferred verification"),
    ((FASTER, SLOWER, (0.9, 1.0), (1.0, 1.1), (1.0, 1.1), (0.9, 0.999)),
     "Faster than target-only decoding: the dense draft; slower than it: the FlashHead draft; not told apart from it "
     "at this sample size: the dense draft deferred and the FlashHead draft deferred; FlashHead against the dense "
     "draft: not told apart under the ordinary schedule, slower under deferred verification"),
])
def test_rq_ranking(intervals, expected):
    """RQ2: each mode faster (lo > 1), slower (hi < 1) or not told apart, grouped in that order with only the
    non-empty groups, the first capitalised; then FlashHead against dense per schedule."""
    assert _ranking(*intervals) == expected


# --- rq_interplay ---------------------------------------------------------------------------------------------------

ACC = {"same": (-0.01, 0.01), "dense": (0.03, 0.06), "flash": (-0.06, -0.03), "unknown": (-0.03, 0.05)}
PATH = {"cheaper": (1.001, 1.3), "not": (0.8, 1.0), "unknown": (1.0, 1.3)}
END = {"faster": (1.001, 1.2), "slower": (0.8, 0.999), "untold_lo": (1.0, 1.2), "untold_hi": (0.8, 1.0)}

UNKNOWN_HEAD = "These prompts cannot tell whether acceptance moves when FlashHead replaces the dense head"
SAME_HEAD = "Acceptance barely moves when FlashHead replaces the dense head"
UNTOLD_END = "these prompts cannot tell FlashHead's throughput from the dense draft's"


def _interplay(acc, path, end):
    """rq_interplay with the named acceptance, path and end-to-end intervals (the points would say otherwise:
    acceptance 0.5 vs 0.5, path 1 ms vs 1 ms)."""
    acc_lo, acc_hi = ACC[acc]
    path_lo, path_hi = PATH[path]
    lo, hi = END[end]
    return v.rq_interplay(0.5, 0.5, lo, hi, 1.0, 1.0, acc_lo=acc_lo, acc_hi=acc_hi, path_lo=path_lo,
                          path_hi=path_hi)


@pytest.mark.parametrize("acc, path, end, expected", [
    # acceptance not told apart: only the end-to-end side matters
    ("unknown", "cheaper", "untold_lo", UNKNOWN_HEAD + ", nor FlashHead's throughput from the dense draft's"),
    ("unknown", "not", "untold_hi", UNKNOWN_HEAD + ", nor FlashHead's throughput from the dense draft's"),
    ("unknown", "unknown", "faster", UNKNOWN_HEAD + ", while FlashHead is faster end to end"),
    ("unknown", "cheaper", "slower", UNKNOWN_HEAD + ", while FlashHead is slower end to end"),
    # faster, path not told apart
    ("dense", "unknown", "faster", "FlashHead is faster end to end although its draft is accepted less often; these "
                                   "prompts cannot tell whether its draft path is cheaper"),
    ("flash", "unknown", "faster", "FlashHead is faster end to end and its draft is accepted more often; these "
                                   "prompts cannot tell whether its draft path is cheaper too"),
    ("same", "unknown", "faster", "FlashHead is faster end to end, but these prompts cannot tell whether its draft "
                                  "path is cheaper or why, with acceptance barely moving"),
    # throughput not told apart
    ("same", "cheaper", "untold_lo", SAME_HEAD + ", and " + UNTOLD_END),
    ("same", "unknown", "untold_hi", SAME_HEAD + ", and " + UNTOLD_END),
    ("dense", "cheaper", "untold_lo", "FlashHead's draft is accepted less often, and " + UNTOLD_END),
    ("flash", "not", "untold_hi", "FlashHead's draft is accepted more often than the dense one, yet " + UNTOLD_END),
    # acceptance unchanged
    ("same", "cheaper", "faster",
     SAME_HEAD + ", so FlashHead's higher throughput comes from cheaper proposals, not from longer blocks"),
    ("same", "not", "faster",
     SAME_HEAD + ", yet FlashHead is faster without a cheaper draft path, which the costs do not explain"),
    ("same", "cheaper", "slower", SAME_HEAD + ", and FlashHead's proposals do not show as higher throughput here"),
    ("same", "unknown", "slower", SAME_HEAD + ", and FlashHead's proposals do not show as higher throughput here"),
    # acceptance higher with the dense draft
    ("dense", "cheaper", "faster",
     "FlashHead's draft is accepted less often, but its cheaper proposals more than make up for it"),
    ("dense", "not", "faster", "FlashHead's draft is accepted less often and its draft path is no cheaper, yet it is "
                               "faster, which the costs do not explain"),
    ("dense", "cheaper", "slower", "FlashHead's draft is accepted less often, which costs more than its proposals "
                                   "save"),
    # acceptance higher with FlashHead
    ("flash", "cheaper", "faster",
     "FlashHead's draft is accepted more often than the dense one, which adds to its throughput"),
    ("flash", "not", "faster", "FlashHead's draft is accepted more often than the dense one, which adds to its "
                               "throughput"),
    ("flash", "cheaper", "slower",
     "FlashHead's draft is accepted more often than the dense one, yet it is not faster end to end"),
])
def test_rq_interplay_by_intervals(acc, path, end, expected):
    """RQ3: acceptance unknown first, then a faster run with an unknown path, then an untold throughput, then per
    acceptance state by throughput and path."""
    assert _interplay(acc, path, end) == expected


@pytest.mark.parametrize("acc_lo, acc_hi, expected", [
    (-0.02, 0.02, SAME_HEAD + ", so FlashHead's higher throughput comes from cheaper proposals, not from longer "
                              "blocks"),
    (-0.0201, 0.02, UNKNOWN_HEAD + ", while FlashHead is faster end to end"),
    (0.001, 0.0201, "FlashHead's draft is accepted less often, but its cheaper proposals more than make up for it"),
    (-0.0201, -0.001, "FlashHead's draft is accepted more often than the dense one, which adds to its throughput"),
])
def test_rq_interplay_acceptance_tolerance(acc_lo, acc_hi, expected):
    """The 0.02 tolerance band, inclusive, and a side just outside it, on a faster run with a cheaper path."""
    assert v.rq_interplay(0.5, 0.5, 1.001, 1.2, 2.0, 1.0, acc_lo=acc_lo, acc_hi=acc_hi, path_lo=1.001,
                          path_hi=1.3) == expected


@pytest.mark.parametrize("acc_dense, acc_flash, dense_ms, flash_ms, expected", [
    (0.51, 0.50, 2.0, 1.0, SAME_HEAD + ", so FlashHead's higher throughput comes from cheaper proposals, not from "
                                       "longer blocks"),
    (0.51, 0.50, 1.0, 1.0, SAME_HEAD + ", yet FlashHead is faster without a cheaper draft path, which the costs do "
                                       "not explain"),
    (0.60, 0.50, 2.0, 1.0, "FlashHead's draft is accepted less often, but its cheaper proposals more than make up "
                           "for it"),
    (0.50, 0.60, 1.0, 2.0, "FlashHead's draft is accepted more often than the dense one, which adds to its "
                           "throughput"),
])
def test_rq_interplay_without_intervals_uses_the_points(acc_dense, acc_flash, dense_ms, flash_ms, expected):
    """Without acceptance and path intervals their points decide (a point is never unknown)."""
    assert v.rq_interplay(acc_dense, acc_flash, 1.001, 1.2, dense_ms, flash_ms) == expected


def test_rq_interplay_other_tolerance():
    """The tolerance parameter moves the "barely moves" band."""
    assert v.rq_interplay(0.5, 0.5, 1.001, 1.2, 2.0, 1.0, acc_lo=-0.05, acc_hi=0.05, tolerance=0.05) == \
        SAME_HEAD + ", so FlashHead's higher throughput comes from cheaper proposals, not from longer blocks"


@pytest.mark.parametrize("before_us, after_us, lo, hi, expected", [
    (NAN, 24.0, 1.0, 1.1, "has not been timed"),
    (25.2, 24.0, 1.01, 1.08, "made the head faster: 24.0 µs against 25.2 (medians of 3 runs timed alone, 1.01 to 1.08 "
                             "times as fast in each)"),
    (25.19, 24.0, 1.01, 1.08, "made the head a little faster, by less than the 5 % that is a difference here but in "
                              "every run: 24.0 µs against 25.2 (medians of 3 runs timed alone, 1.01 to 1.08 times as "
                              "fast in each)"),
    (25.0, 24.0, 1.0, 1.08, "made no difference one can tell: 24.0 µs against 25.0 (medians of 3 runs timed alone, "
                            "1.00 to 1.08 times as fast in each)"),
    (24.0, 24.5, 0.97, 1.0, "made no difference one can tell: 24.5 µs against 24.0 (medians of 3 runs timed alone, "
                            "0.97 to 1.00 times as fast in each)"),
    (24.0, 24.5, 0.97, 0.99, "made the head a little slower in every run: 24.5 µs against 24.0 (medians of 3 runs "
                             "timed alone, 0.97 to 0.99 times as fast in each)"),
])
def test_one_row(before_us, after_us, lo, hi, expected):
    assert gpu_verdicts.one_row(before_us, after_us, lo, hi, 3) == expected
