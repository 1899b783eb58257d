"""The book's verdict sentences (which setting wins, whether a target was met), computed from the numbers printed
beside them, since they differ from run to run. Each function states its rule; :data:`RULES` maps every glued
verdict key to its function and its inputs' glued keys, so a test can check each page against its own numbers.
The precision appendix's rules live with its tables in :mod:`~thesis_studies.precision.tables`.
"""

from __future__ import annotations

from .. import extensions
from . import uncertainty


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


def target_met(ratio: float, target: float = 1.10, lo: float = float("nan"), hi: float = float("nan")) -> str:
    """``meets`` when a ratio reaches the target, else ``does not meet``; with an interval (``lo``, ``hi``), only
    where the whole interval lies on one side of the target, else that the prompts cannot tell."""
    lo, hi = _or_point(lo, hi, ratio)
    return uncertainty.reads(lo, hi, "meets", "does not meet", "neither clearly meets nor clearly misses", at=target,
                             closed="above")


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


def ceiling_vs_spread(head_ceiling: float, p25: float, p75: float) -> str:
    """Whether the free-head ceiling's gain is below the P25-P75 spread of per-prompt FlashHead/dense ratios."""
    if head_ceiling - 1 < p75 - p25:
        return "is small beside the spread of per-prompt FlashHead/dense ratios on this shared machine"
    return "is larger than the spread of per-prompt FlashHead/dense ratios in this run"


def shared_control(body: str) -> str:
    """What the "dense shared" control of Table 4.7 is, from the FlashHead draft's recorded body."""
    if body.startswith("the dense draft's own"):
        return ("here the two bodies are one model (no FlashHead checkpoint's body was given), so the control is the "
                "dense draft again and measures the run-to-run spread of an identical configuration")
    return f"here that body is the FlashHead checkpoint's own ({body})"


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
    state = {name: uncertainty.reads(*_or_point(lo, hi, x), "lower", "not", "unknown", closed="below")
             for name, (x, lo, hi) in levels.items()}
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
    fd = [f"{uncertainty.reads(bounds[key + '_lo'], bounds[key + '_hi'], 'faster', 'slower', 'not told apart')} under "
          f"{schedule}" for key, schedule in (("ord_flash_vs_dense", "the ordinary schedule"),
                                              ("def_flash_vs_dense", "deferred verification"))]
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


#: glued verdict key -> (function, {parameter: glued key}), per notebook of the thesis' chapters; a rule of ``*args``
#: takes a tuple of keys. The studies' chapters' rules are theirs (:data:`thesis_lib.extensions.VERDICT_RULES`).
RULES = {
    "ch4_results": {
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
    },
}


def rules(notebook: str) -> dict:
    """Every rule of ``notebook``'s glued verdicts: the thesis' (:data:`RULES`) and the studies'."""
    return {**RULES.get(notebook, {}), **extensions.VERDICT_RULES.get(notebook, {})}
