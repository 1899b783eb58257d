"""Chapter 6's verdict sentences (the extra heads, the co-design target, the block-length policies' room) and the
rules that glue them."""

from __future__ import annotations

from thesis_lib.analysis.verdicts import target_met


def cheaper(a_ms: float, b_ms: float) -> str:
    """``cheaper`` when ``a_ms`` < ``b_ms``, else ``not cheaper here``."""
    return "cheaper" if a_ms < b_ms else "not cheaper here"


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


def smaller_here(model_here: float, run_here: float, model_before: float) -> str:
    """Whether the benchmark prompts leave less to gain than the calibration prompts, in the model and the run."""
    if model_here < model_before and run_here < model_before:
        return "smaller than on the calibration prompts, in the model as in the run, so the benchmark prompts leave less to gain"
    return "not smaller than on the calibration prompts"


def furthest_off(hybrid_model: float, hybrid_run: float, stop_model: float, stop_run: float) -> str:
    """Which of the two confidence-stopped drafts the walk models worse (relative error of its speedup ratio)."""
    hybrid = abs(hybrid_model / hybrid_run - 1)
    stop = abs(stop_model / stop_run - 1)
    return "The hybrid" if hybrid >= stop else "The confidence stop without lookups"


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


#: glued verdict key -> (function, {parameter: glued key}) (:data:`thesis_lib.analysis.verdicts.RULES`)
RULES = {
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
}
