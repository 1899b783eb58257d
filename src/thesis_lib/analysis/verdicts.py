"""The book's verdict sentences (which setting wins, whether a target was met), computed from the numbers printed
beside them, since they differ from run to run. Each function states its rule; :data:`RULES` maps every glued
verdict key to its function and its inputs' glued keys, so a test can check each page against its own numbers.
The precision appendix's rules live with its tables in :mod:`~thesis_lib.analysis.precision`.
"""

from __future__ import annotations

from . import uncertainty
from .floor import SWITCH_KEYS
from .serving import batched_verdict, length_trend, model_gap, rise_verdict, share_trend
from .trees import forward_verdict, gate_verdict, gpu_trees, peer_target, tree_vs_chain, tree_vs_peer
from .precision import (auto_pick, best_precision, cost_shift, fastest_setting, int4_effect, layout_effect, memory_bound,
                        padding_effect, unpadded_there)


def _or_point(lo: float, hi: float, point: float) -> tuple[float, float]:
    """An interval, or the point itself where none was recorded (a document measured before intervals)."""
    return (point, point) if lo != lo or hi != hi else (lo, hi)


def step_vs_head(step_speedup: float, head_speedup: float, step_lo: float = float("nan"),
                 step_hi: float = float("nan"), head_lo: float = float("nan"), head_hi: float = float("nan")) -> str:
    """Whether a whole draft step gains less than its head alone (the body dilutes the head's gain), by their
    intervals: a side only where they do not overlap."""
    step_lo, step_hi = _or_point(step_lo, step_hi, step_speedup)
    head_lo, head_hi = _or_point(head_lo, head_hi, head_speedup)
    if step_hi < head_lo:
        return ("the body, which FlashHead does not touch, dilutes the head's gain, as chapter 2's head-share table "
                "predicts")
    if step_lo > head_hi:
        return "here the step gained more than the head alone, which chapter 2's head-share table does not predict"
    return ("the step's and the head's intervals overlap, so these timings cannot tell whether the body dilutes the "
            "head's gain")


def lift(lo: float, hi: float) -> str:
    """What deferred verification did to a draft, by the interval of its speed deferred over ordinary: a gain, a
    loss, or a change the prompts cannot resolve."""
    return uncertainty.reads(lo, hi, "a gain", "a loss", "a change these prompts cannot tell from none")


def _acceptance_state(dense: float, flash: float, lo: float, hi: float, tolerance: float = 0.02) -> str:
    """``same``, ``dense`` (higher with the dense draft), ``flash`` or ``unknown``, by the interval of dense minus
    FlashHead acceptance (without one, the point): ``same`` where it lies within ``tolerance`` of 0."""
    lo, hi = _or_point(lo, hi, dense - flash)
    if -tolerance <= lo and hi <= tolerance:
        return "same"
    return uncertainty.reads(lo, hi, "dense", "flash", "unknown", at=0.0)


def _path_state(draft_ms_dense: float, draft_ms_flash: float, lo: float, hi: float) -> str:
    """``cheaper`` (FlashHead's draft path per decoded token), ``not`` or ``unknown``, by the interval of the dense
    path's cost over FlashHead's (without one, the point)."""
    lo, hi = _or_point(lo, hi, draft_ms_dense / draft_ms_flash)
    return uncertainty.reads(lo, hi, "cheaper", "not", "unknown", closed="below")


def acceptance_change(dense: float, flash: float, lo: float = float("nan"), hi: float = float("nan"),
                      tolerance: float = 0.02) -> str:
    """How the dense and the FlashHead draft's acceptance rates compare, by the interval (``lo``, ``hi``) of their
    difference (dense minus FlashHead; without one, the point): it 'barely changes' where the whole interval lies
    within ``tolerance`` of 0, is higher with one draft where the interval excludes 0, and else the prompts
    cannot tell the drafts apart."""
    return {"same": "barely changes", "dense": "is higher with the dense draft",
            "flash": "is higher with the FlashHead draft",
            "unknown": "cannot be told apart"}[_acceptance_state(dense, flash, lo, hi, tolerance)]


def gain_source(lo: float, hi: float, draft_ms_dense: float, draft_ms_flash: float, path_lo: float = float("nan"),
                path_hi: float = float("nan")) -> str:
    """Where FlashHead's end-to-end difference from the dense draft comes from, by the draft path's cost (the
    interval of dense's path per token over FlashHead's, ``path_lo``-``path_hi``), when the interval of FlashHead's
    speed over dense's (``lo``-``hi``) resolves a difference."""
    path, gain = _path_state(draft_ms_dense, draft_ms_flash, path_lo, path_hi), uncertainty.side(lo, hi)
    if gain > 0 and path == "cheaper":
        return "the gain comes from the draft path"
    if gain > 0 and path == "unknown":
        return "these prompts cannot tell whether the gain comes from the draft path"
    if gain > 0:
        return "the gain does not come from a cheaper draft path"
    if gain < 0:
        return "FlashHead is slower end to end here, although its draft path"
    return "these prompts cannot tell FlashHead's end-to-end difference from none, although its draft path"


def sweep_winner(best_k: int, tied: str) -> str:
    """Which K was fastest in the sweep, and whether the prompts tell it apart from the others (``tied``: the Ks
    they cannot, comma-separated, or empty)."""
    if not tied:
        return f"K = {best_k} was the fastest, ahead of every other K measured by more than the prompts' spread"
    return (f"K = {best_k} was the fastest by its point estimate, but these prompts cannot tell it apart from "
            f"K = {tied}")


def beats(lo: float, hi: float) -> str:
    """How a speedup over target-only decoding compares with 1, by its interval."""
    return uncertainty.reads(lo, hi, "beats", "is slower than", "cannot be told apart from")


def agrees_more(ours: float, theirs: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    """How this run's acceptance compares with the thesis', by its interval (``lo``, ``hi``; without one, the
    point): ``agrees more often`` or ``less often`` where the interval lies on one side of the thesis' value."""
    lo, hi = _or_point(lo, hi, ours)
    return uncertainty.reads(lo, hi, "agrees more often", "agrees less often",
                             "cannot be told to agree more or less often, at this sample size,", at=theirs)


def deferred_counts(lo: float, hi: float) -> str:
    """Whether deferred verification also helps here (the thesis found it did on its GPUs), by the interval of the
    FlashHead draft's speed deferred over ordinary."""
    return uncertainty.reads(lo, hi, "on both kinds of hardware", "on the thesis' GPUs, though not in this run",
                             "on the thesis' GPUs; this run cannot tell its effect from none")


def flash_gain_where(ord_lo: float, ord_hi: float, def_lo: float, def_hi: float) -> str:
    """In which schedules FlashHead gains over the dense draft here, by the intervals of its speed over the dense
    draft's, ordinary (``ord_``) and deferred (``def_``): a gain only where the whole interval lies above 1."""
    ordinary, deferred = uncertainty.side(ord_lo, ord_hi) > 0, uncertainty.side(def_lo, def_hi) > 0
    if ordinary and deferred:
        return ("here FlashHead gains over the dense draft in the ordinary schedule already, and with deferred "
                "verification too, so the append is not what hides the head's saving on this machine")
    if deferred:
        return "here, as in the thesis, FlashHead's gain over the dense draft shows once deferred verification removes the append"
    if ordinary:
        return ("here FlashHead gains over the dense draft in the ordinary schedule, and this run cannot resolve a gain "
                "with deferred verification")
    return "here neither schedule shows a gain of FlashHead over the dense draft that this run can resolve"


def cheaper(a_ms: float, b_ms: float) -> str:
    """``cheaper`` when ``a_ms`` < ``b_ms``, else ``not cheaper here``."""
    return "cheaper" if a_ms < b_ms else "not cheaper here"


def target_met(ratio: float, target: float = 1.10, lo: float = float("nan"), hi: float = float("nan")) -> str:
    """``meets`` when a ratio reaches the target, else ``does not meet``; with an interval (``lo``, ``hi``), only
    where the whole interval lies on one side of the target, else that the prompts cannot tell."""
    lo, hi = _or_point(lo, hi, ratio)
    return uncertainty.reads(lo, hi, "meets", "does not meet", "neither clearly meets nor clearly misses", at=target,
                             closed="above")


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


#: the steps whose speedup a profile's switch is read for
STEPS = ("draft", "target1", "target5")


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


def head_side(head_ceiling: float, ceiling_bound: float, target: float = 1.10) -> str:
    """Whether changes to the head alone could reach the target, from the free-head ceiling of the profiled
    (ordinary) run and its upper bound without finalization (what the deferred schedule's ceiling cannot exceed)."""
    if ceiling_bound < target:
        return "The head-side ideas cannot reach the target on this machine, as the measured costs show"
    if head_ceiling >= target:
        return "The head-side ideas could reach the target on this machine in principle (the free-head ceiling allows it)"
    return ("Whether the head-side ideas could reach the target cannot be told from the profiled run: the free-head "
            "ceiling misses it, but its bound without finalization (the deferred schedule's) would allow it")


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


def overlap_effect(dense_lo: float, dense_hi: float, flash_lo: float, flash_hi: float) -> str:
    """What the pipelined schedule did, from each draft's lowest and highest per-prompt ratio (pipelined over
    ordinary): a direction only where every prompt of both drafts agrees, else that the prompts cannot tell."""
    if max(dense_hi, flash_hi) < 1:
        return "slowed both drafts down on every prompt"
    if min(dense_lo, flash_lo) > 1:
        return "sped both drafts up on every prompt"
    return "went one way on some prompts and the other way on others, so these prompts cannot tell its effect"


def overlap_cost(fin_ord: float, fin_pipe: float, prop_ord: float, prop_pipe: float) -> str:
    """Where the pipelined schedule's overlapped time went, from the phase sums (ms) of the ordinary and pipelined
    runs of one draft: the wait for the append, and the draft's proposals."""
    if fin_pipe >= fin_ord:
        return "the wait for the append did not fall"
    if prop_pipe > prop_ord:
        return "the proposals took longer while the append ran beside them, on the same hardware"
    return "the wait fell without slowing the proposals"


def flash_vs_dense_resolved(lo: float, hi: float) -> str:
    """Which draft is faster under deferred verification, by the interval of FlashHead's speed over dense's."""
    return uncertainty.which_faster(lo, hi, "the FlashHead draft", "the dense draft")


def rq_proposal(head_speedup: float, step_speedup: float, draft_ms_dense: float, draft_ms_flash: float,
                head_lo: float = float("nan"), head_hi: float = float("nan"), step_lo: float = float("nan"),
                step_hi: float = float("nan"), path_lo: float = float("nan"), path_hi: float = float("nan")) -> str:
    """RQ1: whether FlashHead lowers what proposing costs at each level measured (the head, a whole draft step, the
    draft path per decoded token under deferred verification), each judged by its interval (``<level>_lo``,
    ``<level>_hi``; without one, the point): lowered where it lies above 1, not where it lies at or below, else
    not told apart; and where the gain is largest."""
    levels = {"the head": (head_speedup, head_lo, head_hi), "a whole draft step": (step_speedup, step_lo, step_hi),
              "the draft path per decoded token": (draft_ms_dense / draft_ms_flash, path_lo, path_hi)}
    state = {}
    for name, (x, lo, hi) in levels.items():
        lo, hi = _or_point(lo, hi, x)
        state[name] = uncertainty.reads(lo, hi, "lower", "not", "unknown", closed="below")
    rest = [n for n in levels if n != "the head"]
    unknown = [n for n in rest if state[n] == "unknown"]
    if state["the head"] == "not":
        return "It does not: FlashHead's head is no faster than the dense head here"
    if state["the head"] == "unknown":
        return "These measurements cannot tell: FlashHead's head is not clearly faster than the dense head here"
    slower = [n for n in rest if state[n] == "not"]
    if slower:
        return (f"Only locally: the head is faster, but {' and '.join(slower)} not"
                + (f", and these measurements cannot tell for {' and '.join(unknown)}" if unknown else ""))
    if unknown:
        return (f"It lowers it at the head{''.join(' and at ' + n for n in rest if state[n] == 'lower')}; these "
                f"measurements cannot tell whether it lowers {' and '.join(unknown)}")
    if max(levels, key=lambda n: levels[n][0]) == "the head":
        return "It lowers it at every level measured, the most at the head itself"
    return "It lowers it at every level measured"


def rq_ranking(**bounds: float) -> str:
    """RQ2: each speculative mode against target-only decoding, and FlashHead against dense per schedule, by their
    intervals (``<key>_lo``/``<key>_hi`` of :data:`~thesis_lib.analysis.uncertainty.RATIOS`): faster, slower,
    or not told apart."""
    names = {"ord_dense_vs_base": "the dense draft", "ord_flash_vs_base": "the FlashHead draft",
             "def_dense_vs_base": "the dense draft deferred", "def_flash_vs_base": "the FlashHead draft deferred"}
    groups: dict[str, list[str]] = {"faster": [], "slower": [], "not told apart": []}
    for key, name in names.items():
        lo, hi = bounds[f"{key}_lo"], bounds[f"{key}_hi"]
        groups[uncertainty.reads(lo, hi, "faster", "slower", "not told apart")].append(name)
    said = [f"{word} {' and '.join(modes)}" for word, modes in (
        ("faster than target-only decoding:", groups["faster"]), ("slower than it:", groups["slower"]),
        ("not told apart from it at this sample size:", groups["not told apart"])) if modes]
    fd = []
    for key, schedule in (("ord_flash_vs_dense", "the ordinary schedule"), ("def_flash_vs_dense", "deferred verification")):
        lo, hi = bounds[f"{key}_lo"], bounds[f"{key}_hi"]
        fd.append(f"{uncertainty.reads(lo, hi, 'faster', 'slower', 'not told apart')} under {schedule}")
    said = "; ".join(said)
    return said[:1].upper() + said[1:] + "; FlashHead against the dense draft: " + ", ".join(fd)


def rq_interplay(acc_dense: float, acc_flash: float, lo: float, hi: float, draft_ms_dense: float,
                 draft_ms_flash: float, acc_lo: float = float("nan"), acc_hi: float = float("nan"),
                 path_lo: float = float("nan"), path_hi: float = float("nan"), tolerance: float = 0.02) -> str:
    """RQ3: whether FlashHead's difference in throughput comes from acceptance or from the draft's cost, each
    judged by its interval: acceptance by that of dense minus FlashHead (``acc_lo``-``acc_hi``; within
    ``tolerance`` of 0 it counts as unchanged), the draft path by that of dense's cost per token over FlashHead's
    (``path_lo``-``path_hi``), throughput by that of FlashHead's speed over dense's (``lo``-``hi``, a difference
    only where it excludes 1). Without intervals the points decide."""
    acc = _acceptance_state(acc_dense, acc_flash, acc_lo, acc_hi, tolerance)
    path = _path_state(draft_ms_dense, draft_ms_flash, path_lo, path_hi)
    cheaper = path == "cheaper"
    faster, told = uncertainty.side(lo, hi) > 0, uncertainty.side(lo, hi) != 0
    if acc == "unknown":
        head = "These prompts cannot tell whether acceptance moves when FlashHead replaces the dense head"
        if not told:
            return head + ", nor FlashHead's throughput from the dense draft's"
        return head + (", while FlashHead is faster end to end" if faster else ", while FlashHead is slower end to end")
    if path == "unknown" and faster:
        if acc == "same":
            return ("FlashHead is faster end to end, but these prompts cannot tell whether its draft path is cheaper "
                    "or why, with acceptance barely moving")
        if acc == "dense":
            return ("FlashHead is faster end to end although its draft is accepted less often; these prompts cannot "
                    "tell whether its draft path is cheaper")
        return ("FlashHead is faster end to end and its draft is accepted more often; these prompts cannot tell "
                "whether its draft path is cheaper too")
    if not told:
        end = "these prompts cannot tell FlashHead's throughput from the dense draft's"
        if acc == "same":
            return "Acceptance barely moves when FlashHead replaces the dense head, and " + end
        if acc == "dense":
            return "FlashHead's draft is accepted less often, and " + end
        return "FlashHead's draft is accepted more often than the dense one, yet " + end
    if acc == "same":
        head = "Acceptance barely moves when FlashHead replaces the dense head"
        if faster and cheaper:
            return head + ", so FlashHead's higher throughput comes from cheaper proposals, not from longer blocks"
        if faster:
            return head + ", yet FlashHead is faster without a cheaper draft path, which the costs do not explain"
        return head + ", and FlashHead's proposals do not show as higher throughput here"
    if acc == "dense":
        if faster and cheaper:
            return "FlashHead's draft is accepted less often, but its cheaper proposals more than make up for it"
        if faster:
            return ("FlashHead's draft is accepted less often and its draft path is no cheaper, yet it is faster, "
                    "which the costs do not explain")
        return "FlashHead's draft is accepted less often, which costs more than its proposals save"
    if faster:
        return "FlashHead's draft is accepted more often than the dense one, which adds to its throughput"
    return "FlashHead's draft is accepted more often than the dense one, yet it is not faster end to end"


def rq_end_to_end(lo: float, hi: float) -> str:
    """RQ4: whether FlashHead's saving shows end to end under deferred verification, from the 95 % interval of the
    pooled FlashHead/dense ratio (a paired bootstrap over the prompts): a direction only where it excludes 1."""
    return uncertainty.reads(
        lo, hi, "Yes, with deferred verification: the FlashHead draft is faster than the dense one, the whole 95 % "
        "interval of their ratio lying above 1", "No: with deferred verification the FlashHead draft is slower than "
        "the dense one, the whole 95 % interval of their ratio lying below 1",
        "Cannot tell from this run: the 95 % interval of FlashHead's speed over the dense draft's contains 1")


#: glued verdict key -> (function, {parameter: glued key}), per notebook; a rule of ``*args`` takes a tuple of keys
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
        "prec_int4_effect": (int4_effect, dict(verify5_int4="prec_verify5_int4",
                                               verify5_bfloat16="prec_verify5_bfloat16",
                                               speedup_int4="prec_measured_int4",
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
        "prec_fastest": (fastest_setting, tuple(f"prec_{m}_ms_token_{p}" for p in ("float32", "bfloat16", "int4")
                                                for m in ("base", "flash"))),
    },
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
        "step_vs_head": (step_vs_head, dict(step_speedup="step_speedup", head_speedup="head_speedup",
                                            step_lo="step_speedup_lo", step_hi="step_speedup_hi",
                                            head_lo="head_speedup_lo", head_hi="head_speedup_hi")),
        "deferred_lift_dense": (lift, dict(lo="def_vs_ord_dense_lo", hi="def_vs_ord_dense_hi")),
        "acceptance_change": (acceptance_change, dict(dense="acc_dense_def", flash="acc_flash_def",
                                                      lo="acc_diff_def_lo", hi="acc_diff_def_hi")),
        "gain_source": (gain_source, dict(lo="def_flash_vs_dense_lo", hi="def_flash_vs_dense_hi",
                                          draft_ms_dense="draft_ms_tok_dense", draft_ms_flash="draft_ms_tok_flash",
                                          path_lo="path_dense_vs_flash_lo", path_hi="path_dense_vs_flash_hi")),
        "shared_note": (shared_control, dict(body="flash_body")),
        "sweep_winner": (sweep_winner, dict(best_k="sweep_best_k", tied="sweep_tied_k")),
        "def_fd_resolved": (flash_vs_dense_resolved, dict(lo="def_flash_vs_dense_lo", hi="def_flash_vs_dense_hi")),
        "ord_fd_resolved": (flash_vs_dense_resolved, dict(lo="ord_flash_vs_dense_lo", hi="ord_flash_vs_dense_hi")),
        "ord_db_beats": (beats, dict(lo="ord_dense_vs_base_lo", hi="ord_dense_vs_base_hi")),
        "def_fd_power": (uncertainty.resolution, dict(ratio="def_flash_vs_dense", lo="def_flash_vs_dense_lo",
                                                      hi="def_flash_vs_dense_hi", prompts="ci_prompts")),
        "def_fd_thesis": (uncertainty.against_thesis, dict(lo="def_flash_vs_dense_lo", hi="def_flash_vs_dense_hi",
                                                          thesis="thesis_def_flash_vs_dense")),
        "def_fb_thesis": (uncertainty.against_thesis, dict(lo="def_flash_vs_base_lo", hi="def_flash_vs_base_hi",
                                                          thesis="thesis_def_flash_vs_base")),
    },
    "ch3_methods": {
        "pipe_effect": (overlap_effect, dict(dense_lo="pipe_dense_lo", dense_hi="pipe_dense_hi",
                                             flash_lo="pipe_flash_lo", flash_hi="pipe_flash_hi")),
        "pipe_cost": (overlap_cost, dict(fin_ord="pipe_fin_ord", fin_pipe="pipe_fin_pipe", prop_ord="pipe_prop_ord",
                                         prop_pipe="pipe_prop_pipe")),
    },
    "ch5_conclusion": {
        "ordinary_beats": (beats, dict(lo="ord_dense_vs_base_lo", hi="ord_dense_vs_base_hi")),
        "rq1": (rq_proposal, dict(head_speedup="head_speedup", step_speedup="step_speedup",
                                  draft_ms_dense="draft_ms_tok_dense", draft_ms_flash="draft_ms_tok_flash",
                                  head_lo="head_speedup_lo", head_hi="head_speedup_hi", step_lo="step_speedup_lo",
                                  step_hi="step_speedup_hi", path_lo="path_dense_vs_flash_lo",
                                  path_hi="path_dense_vs_flash_hi")),
        "rq2": (rq_ranking, {f"{k}_{e}": f"{k}_{e}" for k in ("ord_dense_vs_base", "ord_flash_vs_base",
                                                               "def_dense_vs_base", "def_flash_vs_base",
                                                               "ord_flash_vs_dense", "def_flash_vs_dense")
                             for e in ("lo", "hi")}),
        "rq3": (rq_interplay, dict(acc_dense="acc_dense_def", acc_flash="acc_flash_def", lo="def_flash_vs_dense_lo",
                                   hi="def_flash_vs_dense_hi", draft_ms_dense="draft_ms_tok_dense",
                                   draft_ms_flash="draft_ms_tok_flash", acc_lo="acc_diff_def_lo",
                                   acc_hi="acc_diff_def_hi", path_lo="path_dense_vs_flash_lo",
                                   path_hi="path_dense_vs_flash_hi")),
        "rq4": (rq_end_to_end, dict(lo="def_flash_vs_dense_lo", hi="def_flash_vs_dense_hi")),
        "acceptance_vs_thesis": (agrees_more, dict(ours="acceptance_flash", theirs="acceptance_flash_thesis",
                                                   lo="acc_flash_ord_lo", hi="acc_flash_ord_hi")),
        "deferred_where": (deferred_counts, dict(lo="def_vs_ord_flash_lo", hi="def_vs_ord_flash_hi")),
        "flash_gain_where": (flash_gain_where, dict(ord_lo="ord_flash_vs_dense_lo", ord_hi="ord_flash_vs_dense_hi",
                                                    def_lo="def_flash_vs_dense_lo", def_hi="def_flash_vs_dense_hi")),
        "ceiling_spread": (ceiling_vs_spread, dict(head_ceiling="head_ceiling", p25="flash_dense_p25",
                                                   p75="flash_dense_p75")),
        "prec_int4_effect": (int4_effect, dict(verify5_int4="prec_verify5_int4",
                                               verify5_bfloat16="prec_verify5_bfloat16",
                                               speedup_int4="prec_measured_int4",
                                               speedup_bfloat16="prec_measured_bfloat16")),
        "prec_fastest": (fastest_setting, tuple(f"prec_{m}_ms_token_{p}" for p in ("float32", "bfloat16", "int4")
                                                for m in ("base", "flash"))),
    },
    "ch6_beyond": {
        "freq_cheaper": (cheaper, dict(a_ms="freq_head_ms", b_ms="flash_head_ms_cd")),
        "target_met": (target_met, dict(ratio="winner_ratio", lo="winner_lo", hi="winner_hi")),
        "head_side": (head_side, dict(head_ceiling="head_ceiling", ceiling_bound="head_ceiling_bound")),
        "bound_allows": (bound_allows, dict(oracle_ratio="sim_oracle_ratio")),
        "conf_room": (share_of_room, dict(achieved="conf_side_ratio", bound="sim_oracle_ratio")),
        "stop_trade": (stop_trade, dict(kept_share="rel_lo_acc")),
        "walk_smaller": (smaller_here, dict(model_here="walk_sk_model", run_here="walk_sk_run",
                                            model_before="sim_tau_ratio")),
        "walk_off_mode": (furthest_off, dict(hybrid_model="walk_hy_model", hybrid_run="walk_hy_run",
                                             stop_model="walk_sk_model", stop_run="walk_sk_run")),
        "walk_counts": (walk_counts, dict(modes="walk_modes", rounds="walk_gap_rounds", drafted="walk_gap_drafted",
                                          accepted="walk_gap_accepted")),
    },
    "ch7_serving": {
        "batch_verdict": (batched_verdict, dict(lo="batch_best_lo", hi="batch_best_hi")),
        "model_verdict": (model_gap, dict(measured="batch_best_value", modelled="modelled_at")),
        "length_verdict": (length_trend, dict(short_lo="len_short_lo", short_hi="len_short_hi",
                                              long_lo="len_long_lo", long_hi="len_long_hi")),
        "share_verdict": (share_trend, dict(share_short="share_short", share_long="share_long")),
        "rise_verdict": (rise_verdict, dict(max_rise_mib="max_rise")),
    },
    "ch8_trees": {
        "flash_forward_verdict": (forward_verdict, dict(lo="flash_forward_lo", hi="flash_forward_hi")),
        "dense_forward_verdict": (forward_verdict, dict(lo="dense_forward_lo", hi="dense_forward_hi")),
        "flash_speed_verdict": (tree_vs_chain, dict(lo="flash_speed_lo", hi="flash_speed_hi")),
        "dense_speed_verdict": (tree_vs_chain, dict(lo="dense_speed_lo", hi="dense_speed_hi")),
        "fastest_verdict": (tree_vs_chain, dict(lo="vs_fastest_lo", hi="vs_fastest_hi")),
        "assisted_verdict": (tree_vs_peer, dict(lo="vs_assisted_lo", hi="vs_assisted_hi")),
        "defaults_verdict": (tree_vs_peer, dict(lo="vs_defaults_lo", hi="vs_defaults_hi")),
        "peer_target_verdict": (peer_target, dict(value_a="vs_assisted_value", lo_a="vs_assisted_lo",
                                                  hi_a="vs_assisted_hi", value_d="vs_defaults_value",
                                                  lo_d="vs_defaults_lo", hi_d="vs_defaults_hi")),
        "gpu_verdict": (gpu_trees, dict(tree_speedup="gpu_tree_speedup", chain_speedup="gpu_chain_speedup")),
        "gate_verdict": (gate_verdict, dict(fan_speed="gate_fan_speed", stop_speed="gate_stop_speed")),
    },
}
