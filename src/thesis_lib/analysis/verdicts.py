"""The book's verdict sentences (which setting wins, whether a target was met), computed from the numbers printed
beside them, since they differ from run to run. Each function states its rule; :data:`RULES` maps every glued
verdict key to its function and its inputs' glued keys, so a test can check each page against its own numbers.
"""

from __future__ import annotations


def step_vs_head(step_speedup: float, head_speedup: float) -> str:
    """Whether a whole draft step gains less than its head alone (the body dilutes the head's gain)."""
    if step_speedup < head_speedup:
        return ("the body, which FlashHead does not touch, dilutes the head's gain, as chapter 2's head-share table "
                "predicts")
    return "here the step gained no less than the head alone, which chapter 2's head-share table does not predict"


def lift(after: float, before: float) -> str:
    """``lifts`` when a ratio rose from ``before`` to ``after``, else ``lowers``."""
    return "lifts" if after > before else "lowers"


def acceptance_change(a: float, b: float, tolerance: float = 0.02) -> str:
    """How two acceptance rates compare: within ``tolerance`` they 'barely change'."""
    if abs(a - b) <= tolerance:
        return "barely changes"
    return "is higher with the dense draft" if a > b else "is higher with the FlashHead draft"


def gain_source(flash_vs_dense: float, draft_ms_dense: float, draft_ms_flash: float) -> str:
    """Where FlashHead's end-to-end difference from the dense draft comes from, by the draft path's cost."""
    if flash_vs_dense > 1 and draft_ms_flash < draft_ms_dense:
        return "the gain comes from the draft path"
    if flash_vs_dense > 1:
        return "the gain does not come from a cheaper draft path"
    return "FlashHead gains nothing end to end here, although its draft path"


def beats(ratio: float) -> str:
    """``beats`` when a speedup over a baseline exceeds 1, else ``does not beat``."""
    return "beats" if ratio > 1 else "does not beat"


def agrees_more(ours: float, theirs: float) -> str:
    """How this run's acceptance compares with the thesis' (``agrees more often`` / ``less often``)."""
    return "agrees more often" if ours > theirs else "agrees less often"


def deferred_counts(def_flash_vs_base: float, ord_flash_vs_base: float) -> str:
    """Whether deferred verification also helps here (the thesis found it did on its GPUs)."""
    if def_flash_vs_base > ord_flash_vs_base:
        return "on both kinds of hardware"
    return "on the thesis' GPUs, though not in this run"


def cheaper(a_ms: float, b_ms: float) -> str:
    """``cheaper`` when ``a_ms`` < ``b_ms``, else ``not cheaper here``."""
    return "cheaper" if a_ms < b_ms else "not cheaper here"


def target_met(ratio: float, target: float = 1.10) -> str:
    """``meets`` when a ratio reaches the target, else ``does not meet``."""
    return "meets" if ratio >= target else "does not meet"


def gpu_head_target(ratio: float) -> str:
    """Whether the GPU head ratio reaches the thesis' 4.32x (``meets`` / ``does not meet``)."""
    return target_met(ratio, 4.32)


def gpu_step_target(ratio: float) -> str:
    """Whether the GPU draft-step ratio reaches the thesis' 1.108x (``meets`` / ``does not meet``)."""
    return target_met(ratio, 1.108)


def gpu_probes_meeting(s64: float, s128: float, s256: float, s593: float, target: float = 4.32) -> str:
    """At which of gpu-check's probe counts (64, 128, 256, 593) the head ratio reaches the thesis' 4.32x."""
    hits = [str(n) for n, s in zip((64, 128, 256, 593), (s64, s128, s256, s593)) if s == s and s >= target]
    if not hits:
        return "at none of the probe counts measured"
    return "at " + (hits[0] if len(hits) == 1 else ", ".join(hits[:-1]) + " and " + hits[-1]) + " probes"


def step_reach(ceiling: float, target: float = 1.108) -> str:
    """Whether any head, however fast, could bring the draft step to the target, given the free-head ceiling."""
    if ceiling != ceiling:
        return "which was not measured"
    if ceiling < target:
        return f"so no head, however fast, can reach the thesis' {target:.3f}x on this body"
    return f"so a faster head could still reach the thesis' {target:.3f}x on this body"


def compiled_sound(agree_compiled: float, agree_path: float, rows: float) -> str:
    """torch.compile's same-token count against the shown path's: under half of it is called a miscompile."""
    if agree_compiled != agree_compiled:  # not measured
        return "was not measured"
    if agree_compiled < 0.5 * agree_path:
        return (f"picked the reference's token on only {int(agree_compiled)} of {int(rows)} states: a miscompiled "
                "head, which is why a GPU takes the Triton kernel")
    return f"picked the reference's token on {int(agree_compiled)} of {int(rows)} states, as the kernel path does"


def head_side(head_ceiling: float, target: float = 1.10) -> str:
    """Whether changes to the head alone could reach the target, given the free-head ceiling."""
    if head_ceiling < target:
        return "The head-side ideas cannot reach the target on this machine, as the measured costs show"
    return "The head-side ideas could reach the target on this machine in principle (the free-head ceiling allows it)"


def bound_allows(oracle_ratio: float, target: float = 1.10) -> str:
    """Whether the clairvoyant block-length bound leaves room for the target."""
    gain = f"{100 * (target - 1):.0f} %"
    if oracle_ratio >= target:
        return f"do not show that no configuration can gain {gain}: a schedule that knew which blocks fail would"
    return f"leave no room for {gain} even for a schedule that knew which blocks fail"


def share_of_room(achieved: float, bound: float) -> str:
    """How much of the room to the bound a policy recovered (gains over 1)."""
    room = bound - 1
    got = achieved - 1
    if room <= 0 or got <= 0:
        return "none of the room"
    share = got / room
    return "only a small part of the room" if share < 1 / 3 else ("about half of the room" if share < 2 / 3
                                                                  else "most of the room")


def stop_trade(kept_share: float) -> str:
    """What stopping at an unsure token trades, by how often such tokens are kept (in %)."""
    if 35 <= kept_share <= 65:
        return "throws away good tokens about as often as it saves bad ones"
    if kept_share > 65:
        return "throws away good tokens more often than it saves bad ones"
    return "saves bad tokens more often than it throws away good ones"


def furthest_off(hybrid_model: float, hybrid_run: float, stop_model: float, stop_run: float) -> str:
    """Which of the two confidence-stopped drafts the walk models worse (relative error of its speedup ratio)."""
    hybrid = abs(hybrid_model / hybrid_run - 1)
    stop = abs(stop_model / stop_run - 1)
    return "The hybrid" if hybrid >= stop else "The confidence stop without lookups"


def ceiling_vs_spread(head_ceiling: float, p25: float, p75: float) -> str:
    """Whether the free-head ceiling's gain is below the P25-P75 spread of per-prompt FlashHead/dense ratios."""
    if head_ceiling - 1 < p75 - p25:
        return "is small beside the spread of per-prompt FlashHead/dense ratios on this shared machine"
    return "is larger than the spread of per-prompt FlashHead/dense ratios in this run"


def smaller_here(model_here: float, run_here: float, model_before: float) -> str:
    """Whether the benchmark prompts leave less to gain than the calibration prompts, in the model and the run."""
    if model_here < model_before and run_here < model_before:
        return "smaller than on the calibration prompts, in the model as in the run, so the benchmark prompts leave less to gain"
    return "not smaller than on the calibration prompts"


def shared_control(body: str) -> str:
    """What the "dense shared" control of Table 4.7 is, from the FlashHead draft's recorded body."""
    if body.startswith("the dense draft's own"):
        return ("here the two bodies are one model (no FlashHead checkpoint's body was given), so the control is the "
                "dense draft again and measures the run-to-run spread of an identical configuration")
    return f"here that body is the FlashHead checkpoint's own ({body})"


def best_precision(speedup_float32: float, speedup_bfloat16: float) -> str:
    """Which precision gives FlashHead deferred the larger speedup over its own target-only decoding (tie within
    1 %)."""
    if speedup_float32 != speedup_float32 or speedup_bfloat16 != speedup_bfloat16:
        return "was not measured"
    if abs(speedup_bfloat16 - speedup_float32) <= 0.01 * speedup_float32:
        return "is about the same in both precisions"
    return "is larger in bfloat16" if speedup_bfloat16 > speedup_float32 else "is larger in float32"


def cost_shift(target_ratio: float, draft_ratio: float, verify5_float32: float, verify5_bfloat16: float) -> str:
    """How bfloat16 moves the model's costs (c rises if the draft gains less than the target, v falls if
    verify(5)/step does) and whether the two pull the speedup the same way."""
    values = (target_ratio, draft_ratio, verify5_float32, verify5_bfloat16)
    if any(x != x for x in values):
        return "the costs were not measured"
    c_up = draft_ratio < target_ratio
    v_down = verify5_bfloat16 < verify5_float32
    c_text = ("the draft gains less than the target, so c rises" if c_up
              else "the draft gains no less than the target, so c does not rise")
    v_text = "v falls" if v_down else "v does not fall"
    pull = ("the two pull the speedup in opposite directions" if c_up == v_down
            else "both favour bfloat16" if v_down else "both favour float32")
    return f"{c_text} while {v_text}: {pull}"


def memory_bound(step_gbps_float32: float, read_gbps_float32: float, step_gbps_bfloat16: float,
                 read_gbps_bfloat16: float, bytes_ratio: float, target: float = 2.5) -> str:
    """Each step's rate over a plain read of the same bytes (80 % or more: bound by memory), and whether bfloat16
    at the full read rate could be ``target`` times faster than float32: ``bytes_ratio * read_bf16 / step_fp32``."""
    if any(x != x for x in (step_gbps_float32, read_gbps_float32, step_gbps_bfloat16, read_gbps_bfloat16,
                            bytes_ratio)):
        return "was not measured"
    s32, s16 = step_gbps_float32 / read_gbps_float32, step_gbps_bfloat16 / read_gbps_bfloat16
    cap = bytes_ratio * read_gbps_bfloat16 / step_gbps_float32
    bound = "bound by memory" if s32 >= 0.8 else "not bound by memory"
    reach = "out of reach" if cap < target else "within reach"
    return (f"float32 reads its weights at {100 * s32:.0f} % of that rate ({bound}) and bfloat16 at {100 * s16:.0f} %: "
            f"a bfloat16 step reading its {bytes_ratio:.2f} times fewer bytes at the full rate would be {cap:.1f} times "
            f"faster than the float32 one, so {target}x is {reach} by the bytes alone")


def int4_effect(verify5_int4: float, verify5_bfloat16: float, speedup_int4: float, speedup_bfloat16: float) -> str:
    """The 4-bit target beside bf16: does a block of five cost more of its own steps (by 5 %), and is FlashHead
    deferred's speedup smaller or larger (tie within 1 %)."""
    if any(x != x for x in (verify5_int4, verify5_bfloat16, speedup_int4, speedup_bfloat16)):
        return "was not measured"
    if verify5_int4 >= 1.05 * verify5_bfloat16:
        v = "verification is dearer with the 4-bit target: a block of five costs more of its own steps"
    elif verify5_int4 <= verify5_bfloat16 / 1.05:
        v = "verification is cheaper with the 4-bit target: a block of five costs fewer of its own steps"
    else:
        v = "a block of five costs about as many of its own steps with the 4-bit target"
    if abs(speedup_int4 - speedup_bfloat16) <= 0.01 * speedup_bfloat16:
        s = "about the same"
    else:
        s = "smaller" if speedup_int4 < speedup_bfloat16 else "larger"
    below = " (below 1: slower than the target alone)" if speedup_int4 < 1 else ""
    return f"{v}, and FlashHead deferred's speedup over its own target-only decoding is {s}{below}"


def auto_pick(auto: str, ms_float32: float, ms_bfloat16: float) -> str:
    """Whether ``DTYPE: auto``'s pick is the one where FlashHead deferred spends fewer ms per token."""
    if ms_float32 != ms_float32 or ms_bfloat16 != ms_bfloat16:
        return f"DTYPE auto picks {auto} there; the document did not decode in both precisions, so the pick is untested"
    faster, slower = ("float32", "bfloat16") if ms_float32 <= ms_bfloat16 else ("bfloat16", "float32")
    ratio = max(ms_float32, ms_bfloat16) / min(ms_float32, ms_bfloat16)
    verb = "is" if auto == faster else "is not"
    return (f"DTYPE auto picks {auto} there, which {verb} the faster of the two: FlashHead deferred spends "
            f"{ms_float32:.0f} ms per token in float32 and {ms_bfloat16:.0f} ms in bfloat16 ({slower} "
            f"{ratio:.2f} times {faster}'s)")


def layout_effect(step_block: float, step_row: float, v5_block: float, v5_row: float, sp_block: float,
                  sp_row: float, ms_block: float, ms_row: float) -> str:
    """float32's general (``block``) against one-row (``row``) layout: step ms and a block of five in steps, then
    FlashHead deferred's speedup and ms per token in each, the latter deciding the faster layout."""
    if any(x != x for x in (step_block, step_row, v5_block, v5_row)):
        return "the document comparing the two layouts is missing, so this is not measured here"
    block_ms, row_ms = v5_block * step_block, v5_row * step_row
    cheaper = "general" if block_ms < row_ms else "one-row"
    head = (f"a block of five costs {v5_block:.2f} steps ({block_ms:.0f} ms) in the general layout and {v5_row:.2f} "
            f"({row_ms:.0f} ms) in the one-row layout, so verification is cheaper in the {cheaper} layout, while one "
            f"step takes {step_block / step_row:.2f} times as long in the general layout as in the one-row one")
    if any(x != x for x in (sp_block, sp_row, ms_block, ms_row)):
        return head + "; the document decoded nothing end to end, so which layout decodes faster is not measured"
    pays = {lay: ("pays" if sp > 1 else "does not pay") + f" ({sp:.2f}x)" for lay, sp in
            (("general", sp_block), ("one-row", sp_row))}
    faster = "general" if ms_block < ms_row else "one-row"
    return (head + f"; FlashHead deferred {pays['general']} over target-only decoding in the general layout and "
            f"{pays['one-row']} in the one-row layout, and spends {ms_block:.0f} against {ms_row:.0f} ms per token, "
            f"so speculative decoding is faster in the {faster} layout here")


def padding_effect(step_padded: float, step_unpadded: float, base_padded: float, base_unpadded: float,
                   ms_padded: float, ms_unpadded: float) -> str:
    """Padding bf16 products of 1-4 rows to five: the target's step and both decodings' ms per token, padded and
    not; which decoding gains more decides whether FlashHead deferred's ratio rises or falls."""
    def change(padded: float, unpadded: float) -> str:
        if padded == unpadded:
            return "the same either way"
        return f"{unpadded / padded:.2f} times as fast" if padded < unpadded else f"slower ({padded:.0f} against {unpadded:.0f} ms)"

    if step_padded != step_padded or step_unpadded != step_unpadded:
        return "the document comparing the two is missing, so this is not measured here"
    step = f"padding makes the target's one-token step {change(step_padded, step_unpadded)}"
    if any(x != x for x in (base_padded, base_unpadded, ms_padded, ms_unpadded)):
        return step + "; the document decoded nothing end to end, so its effect on decoding is not measured"
    gain_base, gain_flash = base_unpadded / base_padded, ms_unpadded / ms_padded
    more = ("target-only decoding gains more, so FlashHead deferred's ratio over it falls" if gain_base > gain_flash
            else "FlashHead deferred gains at least as much, so its ratio over target-only does not fall")
    return (f"{step}, target-only decoding {change(base_padded, base_unpadded)} per token ({base_padded:.0f} against "
            f"{base_unpadded:.0f} ms) and FlashHead deferred {change(ms_padded, ms_unpadded)} ({ms_padded:.0f} "
            f"against {ms_unpadded:.0f} ms): {more}")


def unpadded_there(verify5: float) -> str:
    """Whether float32 left unpadded fits the CPU's curve: ``verify5`` > 1 means padding to five rows costs."""
    if verify5 != verify5:
        return "its verify curve is not measured, so whether padding would pay there is not known"
    if verify5 > 1:
        return (f"there a block of five costs {verify5:.2f} of a one-token step, so a step padded to five rows would "
                f"be longer")
    return (f"yet there a block of five costs only {verify5:.2f} of a one-token step, so padding might pay on that CPU "
            f"too: a rule to revisit")


#: The settings :func:`fastest_setting` names, in its arguments' order.
SETTINGS = tuple(f"{m} with the {p} target" for p in ("float32", "bfloat16", "4-bit") for m in
                 ("target-only decoding", "FlashHead deferred"))


def fastest_setting(*ms_per_token: float) -> str:
    """The setting with the fewest milliseconds per token among :data:`SETTINGS` (nan: not measured)."""
    got = [(ms, name) for ms, name in zip(ms_per_token, SETTINGS) if ms == ms]
    if not got:
        return "was not measured"
    ms, name = min(got)
    return f"{name} ({ms:.0f} ms per token)"


def walk_counts(modes: int, rounds: int, drafted: int, accepted: int) -> str:
    """Whether the walk's rounds, drafted and accepted tokens equal the run's in every mode, else the largest gap."""
    names = {"rounds": rounds, "drafted tokens": drafted, "accepted tokens": accepted}
    agree = [n for n, gap in names.items() if gap == 0]
    part = [f"{n} by up to {gap}" for n, gap in names.items() if gap]
    if not part:
        return f"Rounds, drafted and accepted tokens agree exactly in all {modes} modes"
    lead = "the walk's totals part from the run's in " + ", ".join(part)
    if not agree:  # at most two counts agree where one parts
        return lead[:1].upper() + lead[1:]
    said = " and ".join(agree)
    return f"{said[:1].upper()}{said[1:]} agree in all {modes} modes; {lead}"


#: glued verdict key -> (function, glued keys of its arguments, in order), per notebook
RULES = {
    "ch2_theory": {
        "prec_cost_shift": (cost_shift, ("prec_target_ratio_bfloat16", "prec_draft_ratio_bfloat16",
                                         "prec_verify5_float32", "prec_verify5_bfloat16")),
        "prec_model_best": (best_precision, ("prec_model_float32", "prec_model_bfloat16")),
        "prec_measured_best": (best_precision, ("prec_measured_float32", "prec_measured_bfloat16")),
        "prec_int4_effect": (int4_effect, ("prec_verify5_int4", "prec_verify5_bfloat16", "prec_measured_int4",
                                           "prec_measured_bfloat16")),
        "prec_memory_bound": (memory_bound, ("prec_step_gbps_float32", "prec_read_gbps_float32",
                                             "prec_step_gbps_bfloat16", "prec_read_gbps_bfloat16",
                                             "prec_bytes_ratio_bfloat16")),
        "prec_auto_pick": (auto_pick, ("prec_auto", "prec_flash_ms_token_float32", "prec_flash_ms_token_bfloat16")),
        "nobf16_auto_pick": (auto_pick, ("nobf16_auto", "nobf16_flash_ms_token_float32",
                                         "nobf16_flash_ms_token_bfloat16")),
        "layout_effect": (layout_effect, ("layout_step_ms_block", "layout_step_ms_row", "layout_verify5_block",
                                          "layout_verify5_row", "layout_measured_block", "layout_measured_row",
                                          "layout_flash_ms_token_block", "layout_flash_ms_token_row")),
        "pad_effect": (padding_effect, ("pad_step_ms_padded", "pad_step_ms_unpadded", "pad_base_ms_token_padded",
                                        "pad_base_ms_token_unpadded", "pad_flash_ms_token_padded",
                                        "pad_flash_ms_token_unpadded")),
        "nobf16_unpadded_there": (unpadded_there, ("nobf16_verify5_float32",)),
        "prec_fastest": (fastest_setting, tuple(f"prec_{m}_ms_token_{p}" for p in ("float32", "bfloat16", "int4")
                                                for m in ("base", "flash"))),
    },
    "ch4_results": {
        "gpu_head_met": (gpu_head_target, ("gpu_head_speedup",)),
        "gpu_head_launch_met": (gpu_head_target, ("gpu_head_speedup_launch",)),
        "gpu_probes_meeting": (gpu_probes_meeting, ("gpu_speedup_p64", "gpu_speedup_p128", "gpu_speedup_p256",
                                                    "gpu_speedup_p593")),
        "gpu_step_met": (gpu_step_target, ("gpu_step_speedup",)),
        "gpu_step_reach": (step_reach, ("gpu_step_ceiling",)),
        "gpu_compiled_verdict": (compiled_sound, ("gpu_agree_compiled", "gpu_agree_path", "gpu_rows")),
        "step_vs_head": (step_vs_head, ("step_speedup", "head_speedup")),
        "deferred_lift_dense": (lift, ("def_dense_vs_base", "ord_dense_vs_base")),
        "acceptance_change": (acceptance_change, ("acc_dense_def", "acc_flash_def")),
        "gain_source": (gain_source, ("def_flash_vs_dense", "draft_ms_tok_dense", "draft_ms_tok_flash")),
        "shared_note": (shared_control, ("flash_body",)),
    },
    "ch5_conclusion": {
        "ordinary_beats": (beats, ("ord_dense_vs_base",)),
        "acceptance_vs_thesis": (agrees_more, ("acceptance_flash", "acceptance_flash_thesis")),
        "deferred_where": (deferred_counts, ("def_flash_vs_base", "ord_flash_vs_base")),
        "ceiling_spread": (ceiling_vs_spread, ("head_ceiling", "flash_dense_p25", "flash_dense_p75")),
        "prec_int4_effect": (int4_effect, ("prec_verify5_int4", "prec_verify5_bfloat16", "prec_measured_int4",
                                           "prec_measured_bfloat16")),
        "prec_fastest": (fastest_setting, tuple(f"prec_{m}_ms_token_{p}" for p in ("float32", "bfloat16", "int4")
                                                for m in ("base", "flash"))),
    },
    "ch6_beyond": {
        "freq_cheaper": (cheaper, ("freq_head_ms", "flash_head_ms_cd")),
        "target_met": (target_met, ("winner_ratio",)),
        "head_side": (head_side, ("head_ceiling",)),
        "bound_allows": (bound_allows, ("sim_oracle_ratio",)),
        "conf_room": (share_of_room, ("conf_side_ratio", "sim_oracle_ratio")),
        "stop_trade": (stop_trade, ("rel_lo_acc",)),
        "walk_smaller": (smaller_here, ("walk_sk_model", "walk_sk_run", "sim_tau_ratio")),
        "walk_off_mode": (furthest_off, ("walk_hy_model", "walk_hy_run", "walk_sk_model", "walk_sk_run")),
        "walk_counts": (walk_counts, ("walk_modes", "walk_gap_rounds", "walk_gap_drafted", "walk_gap_accepted")),
    },
}
