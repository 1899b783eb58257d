"""The GPU check's verdict sentences in chapter 4 (the head's and the draft step's targets, the kernels' designs, the
4-bit target's regime) and the rules that glue them."""

from __future__ import annotations

from thesis_lib.analysis import uncertainty
from thesis_lib.analysis.verdicts import target_met


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


def draft_regime(c: float) -> str:
    """Where a draft step of ``c`` target steps stands against the thesis' regime of about a tenth (0.05-0.15)."""
    if c != c:
        return "not measured"
    c = round(c, 3)  # judged as printed
    if c < 0.05:
        return f"a draft at {c:.3f} of a target step, cheaper than the thesis' regime of about a tenth"
    if c <= 0.15:
        return "a draft at about a tenth of a target step, the regime the thesis studies"
    return f"a draft at {c:.3f} of a target step, dearer than the thesis' regime of about a tenth"


def block_rise(v5_int4: float, v5_bf16: float) -> str:
    """Whether the 4-bit target's block of 5 costs clearly more steps than the bfloat16 stack's (by over 0.1)."""
    if v5_int4 != v5_int4 or v5_bf16 != v5_bf16:
        return "cannot be compared with the bfloat16 stack's here"
    if v5_int4 > v5_bf16 + 0.1:
        return "rises faster than the bfloat16 stack's"
    return "rises no faster than the bfloat16 stack's"


def fewer_kernels(kept_us: float, best_us: float) -> str:
    """How the design with fewer kernels that came closest compared with the five kernels timed in its own run
    (device times, µs); a difference under 5 % is called a draw (the replays' medians move by a few percent)."""
    if kept_us != kept_us or best_us != best_us:
        return "have not been timed"
    said = f"the closest took {best_us:.1f} µs where the five kernels took {kept_us:.1f} µs in the same run"
    if best_us > 1.05 * kept_us:
        return (f"were slower ({said}): the work they moved onto single, waiting or searching thread blocks cost "
                "more than the launches it saved")
    if best_us < kept_us / 1.05:
        return f"were faster ({said})"
    return f"were no faster ({said})"


def chained_gain(before_us: float, alone_us: float, mid_before_us: float, mid_us: float, dense_us: float) -> str:
    """What chaining the kernels by programmatic dependent launch bought, on both footings it was timed on: alone
    (``before_us`` -> ``alone_us``) and between two other heads (``mid_before_us`` -> ``mid_us``); a change under
    5 % is no change (copies of the same kernels differ by about 4 %)."""
    if any(x != x for x in (before_us, alone_us, mid_before_us, mid_us, dense_us)):
        return "has not been timed"
    alone, mid = before_us / alone_us, mid_before_us / mid_us
    said = (f"{alone_us:.1f} µs against {before_us:.1f} timed alone, {dense_us / alone_us:.2f} times as fast as the "
            f"dense head; {mid_us:.1f} against {mid_before_us:.1f} µs between two other heads")
    if alone >= 1.05 and mid >= 1.05:
        return f"made the head faster on both footings ({said})"
    if alone < 1.05 and mid < 1.05:
        return f"made the head no faster ({said})"
    return f"made the head faster on one footing only ({said}): a gain the surroundings decide"


def one_row(before_us: float, after_us: float, lo: float, hi: float, runs: float) -> str:
    """What scoring one row's centroids in the counting kernel bought, timed alone beside the five kernels in each
    run (medians over runs, µs; ``lo``/``hi`` the smallest and largest ratio); under 5 % is no difference unless
    every run agrees on its direction."""
    if any(x != x for x in (before_us, after_us, lo, hi, runs)):
        return "has not been timed"
    said = (f"{after_us:.1f} µs against {before_us:.1f} (medians of {int(runs)} runs timed alone, "
            f"{lo:.2f} to {hi:.2f} times as fast in each)")
    if before_us / after_us >= 1.05:
        return f"made the head faster: {said}"
    return uncertainty.reads(
        lo, hi, f"made the head a little faster, by less than the 5 % that is a difference here but in every run: {said}",
        f"made the head a little slower in every run: {said}", f"made no difference one can tell: {said}")


def compiled_sound(agree_compiled: float, agree_path: float, rows: float) -> str:
    """torch.compile's same-token count against the shown path's: under half of it is called a miscompile."""
    if agree_compiled != agree_compiled:  # not measured
        return "was not measured"
    if agree_compiled < 0.5 * agree_path:
        return (f"picked the reference's token on only {int(agree_compiled)} of {int(rows)} states: a miscompiled "
                "head, which is why a GPU takes the Triton kernel")
    return f"picked the reference's token on {int(agree_compiled)} of {int(rows)} states, as the kernel path does"


#: glued verdict key -> (function, {parameter: glued key}) (:data:`thesis_lib.analysis.verdicts.RULES`)
RULES = {
    "ch4_results": {
        "gpu_head_met": (gpu_head_target, dict(ratio="gpu_head_speedup")),
        "gpu_head_launch_met": (gpu_head_target, dict(ratio="gpu_head_speedup_launch")),
        "gpu_probes_meeting": (gpu_probes_meeting, dict(s64="gpu_speedup_p64", s128="gpu_speedup_p128",
                                                        s256="gpu_speedup_p256", s593="gpu_speedup_p593")),
        "gpu_step_met": (gpu_step_target, dict(ratio="gpu_step_speedup")),
        "gpu_step_reach": (step_reach, dict(ceiling="gpu_step_ceiling")),
        "gpu_int4_regime": (draft_regime, dict(c="gpu_int4_c")),
        "gpu_int4_rise": (block_rise, dict(v5_int4="gpu_int4_v5", v5_bf16="gpu_verify5")),
        "gpu_fewer_kernels": (fewer_kernels, dict(kept_us="gpu_designs_five_us", best_us="gpu_designs_best_us")),
        "gpu_chained_gain": (chained_gain, dict(before_us="gpu_chained_before_us", alone_us="gpu_chained_us",
                                                mid_before_us="gpu_chained_mid_before_us", mid_us="gpu_chained_mid_us",
                                                dense_us="gpu_chained_dense_us")),
        "gpu_one_row": (one_row, dict(before_us="gpu_one_row_before_us", after_us="gpu_one_row_us",
                                      lo="gpu_one_row_lo", hi="gpu_one_row_hi", runs="gpu_one_row_runs")),
        "gpu_compiled_verdict": (compiled_sound, dict(agree_compiled="gpu_agree_compiled", agree_path="gpu_agree_path",
                                                      rows="gpu_rows")),
    },
}
