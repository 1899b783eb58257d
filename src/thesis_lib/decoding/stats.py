"""What a generation reports: the stats record of every decoding loop (thesis sections 3.3 and 4.2).

Vocabulary (one word per concept, as in the thesis):

- a *round* drafts ``k >= 1`` tokens (fewer than K only near ``max_new_tokens``);
- ``accepted``: draft tokens the target confirmed; ``emitted``: tokens the round added to the output
  (accepted plus the target's correction or bonus token, cut at EOS);
- ``acceptance`` = accepted / drafted (the thesis' "acceptance rate"); ``mean_emitted`` = emitted per round
  (``tau``, which counts the target's token, as vLLM and Spec-Bench do);
- a *verify* call is one batched target forward over a drafted block; an *append* is a standalone one-token
  target forward that only writes the final token into the target's cache (the thesis' "finalize");
- ``skipped``: rounds whose first proposal already disagreed with the target's known next token, so the
  ordinary schedule did not run the verify forward;
- target-only decoding counts each decode-phase forward as an append (as the thesis' Table 4.9 does).

The loops' shared steps (the request's check, the prefill, the accepted prefix, a round's emission, the record's
close) are :mod:`~thesis_lib.decoding.rounds`'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Phase names (the thesis' Table 4.5 columns); all in seconds.
PREFILL, PROPOSE, VERIFY, FINALIZE = "prefill", "draft_propose", "target_verify", "finalize_align"


@dataclass
class DecodeStats:
    """What one generation did and how long each phase took."""

    mode: str
    k: int = 0
    new_tokens: int = 0
    drafted: list[int] = field(default_factory=list)  # per round
    accepted: list[int] = field(default_factory=list)  # per round
    emitted: list[int] = field(default_factory=list)  # per round
    verify_calls: int = 0
    append_calls: int = 0
    skipped: int = 0
    tail_tokens: int = 0  # tokens emitted outside any round (the target's known last token)
    first_emit: int = 1  # tokens known at TTFT (1 here; transformers' assisted loop can deliver several)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)
    stopped_by: str = "max_new_tokens"  # or "eos"

    # the derived counts and rates, computed in one module-level function (:func:`derived`)
    rounds = property(lambda self: derived(self)["rounds"])
    zero_accept_rounds = property(lambda self: derived(self)["zero_accept_rounds"])
    full_accept_rounds = property(lambda self: derived(self)["full_accept_rounds"])
    acceptance = property(lambda self: derived(self)["acceptance"], doc="accepted / drafted (None without rounds)")
    mean_emitted = property(lambda self: derived(self)["mean_emitted"], doc="tokens per round, the target's included")
    decode_tokens_per_s = property(lambda self: derived(self)["decode_tokens_per_s"])
    tpot_s = property(lambda self: derived(self)["tpot_s"])
    e2e_tokens_per_s = property(lambda self: derived(self)["e2e_tokens_per_s"])

    def to_dict(self) -> dict:
        return {**asdict(self), **derived(self)}


def derived(stats: DecodeStats) -> dict:
    """What follows from a generation's record: rounds; rounds that accepted nothing and rounds that accepted their
    whole block; acceptance = accepted / drafted over all rounds (None without rounds); mean emitted (tau) = tokens
    per round, the target's token included; decode tok/s = tokens after TTFT over the decode phase (TTFT excluded);
    TPOT its inverse; end-to-end tok/s = all new tokens over TTFT plus decode time (comparable across loops however
    they split the two)."""
    drafted, after_first = sum(stats.drafted), stats.new_tokens - stats.first_emit
    total_s = stats.ttft_s + stats.decode_s
    return {"rounds": len(stats.drafted),
            "zero_accept_rounds": sum(1 for a in stats.accepted if a == 0),
            "full_accept_rounds": sum(1 for a, d in zip(stats.accepted, stats.drafted) if a == d),
            "acceptance": sum(stats.accepted) / drafted if drafted else None,
            "mean_emitted": sum(stats.emitted) / len(stats.emitted) if stats.emitted else None,
            "decode_tokens_per_s": after_first / stats.decode_s if after_first > 0 and stats.decode_s > 0 else None,
            "tpot_s": stats.decode_s / after_first if after_first > 0 else None,
            "e2e_tokens_per_s": stats.new_tokens / total_s if total_s > 0 else None}


@dataclass
class Generation:
    tokens: list[int]
    stats: DecodeStats
    extra: dict = field(default_factory=dict)  # what a drafter counted about itself (see bench.metrics.sample_record)
