"""The precision study's verdict sentences (the byte floor's switches, the loop beyond its step) and the rules that
glue its values in chapter 2's precision section and chapter 5's summary; the rest of its verdicts live with its
tables (:mod:`thesis_studies.precision.tables`)."""

from __future__ import annotations

from thesis_lib.analysis import uncertainty
from thesis_studies.precision.floor import SWITCH_KEYS
from thesis_studies.precision.tables import (auto_pick, best_precision, cost_shift, fastest_setting, int4_effect,
                                             layout_effect, memory_bound, padding_effect, unpadded_there)


#: the steps whose speedup a profile's switch is read for
STEPS = ("draft", "target1", "target5")


def switch_effect(value: float, lo: float, hi: float, them: str = "them") -> str:
    """Whether a step is faster with a change (the fused operations, ``them``; the compact step, "it") than
    without, by the interval of its speedup, with the speedup and its interval."""
    if value != value or lo != lo or hi != hi:
        return "not compared in this profile"
    digits = 3  # more where a bound other than 1 would print as 1: each printed on its side of it
    while digits < 8 and any(x != 1 and f"{x:.{digits}f}" == f"{1:.{digits}f}" for x in (lo, hi)):
        digits += 1
    said = f"({value:.{digits}f}x, {lo:.{digits}f}-{hi:.{digits}f})"
    if uncertainty.side(lo, hi):
        return f"{'faster' if uncertainty.side(lo, hi) > 0 else 'slower'} with {them} {said}"
    return f"neither clearly faster nor slower with {them} {said}"


def _with_it(value: float, lo: float, hi: float) -> str:
    """:func:`switch_effect` of the compact step, of its layers in one call and of FlashHead's kernel."""
    return switch_effect(value, lo, hi, them="it")


def loop_beyond(share: float, noise: float = 0.05) -> str:
    """What the target-only loop spends per token beyond its one-token step and head, as a share of its time per
    token; below ``noise`` (the two medians' run-to-run spread on a shared machine; a negative share too) it is called
    unmeasurable."""
    if share != share:
        return "was not timed"
    if share < noise:  # below zero too: the loop then took less per token than its step timed beside it
        return f"spends nothing measurable beyond its one-token step and head ({share:+.1%} of its time per token)"
    return f"spends {share:.0%} of each token's time beyond its one-token step and head"


#: the 4-bit target's effect and the fastest setting, glued in chapter 2 and in chapter 5's summary
_BOTH = {
    "prec_int4_effect": (int4_effect, dict(verify5_int4="prec_verify5_int4", verify5_bfloat16="prec_verify5_bfloat16",
                                           speedup_int4="prec_measured_int4",
                                           speedup_bfloat16="prec_measured_bfloat16")),
    "prec_fastest": (fastest_setting, tuple(f"prec_{m}_ms_token_{p}" for p in ("float32", "bfloat16", "int4")
                                            for m in ("base", "flash"))),
}
#: glued verdict key -> (function, {parameter: glued key}), per notebook (:data:`thesis_lib.analysis.verdicts.RULES`)
RULES = {
    "ch2_theory": {
        "prec_cost_shift": (cost_shift, dict(target_ratio="prec_target_ratio_bfloat16",
                                             draft_ratio="prec_draft_ratio_bfloat16",
                                             verify5_float32="prec_verify5_float32",
                                             verify5_bfloat16="prec_verify5_bfloat16")),
        "prec_model_best": (best_precision, dict(speedup_float32="prec_model_float32",
                                                 speedup_bfloat16="prec_model_bfloat16")),
        "prec_measured_best": (best_precision, dict(speedup_float32="prec_measured_float32",
                                                    speedup_bfloat16="prec_measured_bfloat16")),
        "prec_memory_bound": (memory_bound, dict(step_gbps_float32="prec_step_gbps_float32",
                                                 read_gbps_float32="prec_read_gbps_float32",
                                                 step_gbps_bfloat16="prec_step_gbps_bfloat16",
                                                 read_gbps_bfloat16="prec_read_gbps_bfloat16",
                                                 bytes_ratio="prec_bytes_ratio_bfloat16")),
        "prec_auto_pick": (auto_pick, dict(auto="prec_auto", ms_float32="prec_flash_ms_token_float32",
                                           ms_bfloat16="prec_flash_ms_token_bfloat16")),
        "nobf16_auto_pick": (auto_pick, dict(auto="nobf16_auto", ms_float32="nobf16_flash_ms_token_float32",
                                             ms_bfloat16="nobf16_flash_ms_token_bfloat16")),
        "layout_effect": (layout_effect, dict(step_block="layout_step_ms_block", step_row="layout_step_ms_row",
                                              v5_block="layout_verify5_block", v5_row="layout_verify5_row",
                                              sp_block="layout_measured_block", sp_row="layout_measured_row",
                                              ms_block="layout_flash_ms_token_block",
                                              ms_row="layout_flash_ms_token_row")),
        "pad_effect": (padding_effect, dict(step_padded="pad_step_ms_padded", step_unpadded="pad_step_ms_unpadded",
                                            base_padded="pad_base_ms_token_padded",
                                            base_unpadded="pad_base_ms_token_unpadded",
                                            ms_padded="pad_flash_ms_token_padded",
                                            ms_unpadded="pad_flash_ms_token_unpadded")),
        "nobf16_unpadded_there": (unpadded_there, dict(verify5="nobf16_verify5_float32")),
        "sp_loop_verdict": (loop_beyond, dict(share="sp_loop_beyond_share")),
        **{f"sp{s}_{step}_verdict": (fn, dict(value=f"sp{s}_{step}_speedup", lo=f"sp{s}_{step}_lo",
                                                hi=f"sp{s}_{step}_hi"))
           for switch, s in SWITCH_KEYS.items()
           for fn in [switch_effect if switch == "fused" else _with_it]
           for step in (("draft",) if switch == "head-kernel" else STEPS)},  # FlashHead's kernel: its step only
        **_BOTH,
    },
    "ch5_conclusion": _BOTH,
}
