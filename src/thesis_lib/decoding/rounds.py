"""The steps every decoding loop shares (thesis section 3.3): the request's check, the prefill of both models with
the first token (timed apart, as TTFT), the accepted prefix of a block, a round's emission and the record's close.
The greedy loops (:mod:`~thesis_lib.decoding.greedy`) and the studies' tree, sampling and batched loops take them
from here; :mod:`~thesis_lib.decoding.stats` defines the words they count in.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError, at_least
from .clocks import PhaseClock
from .stats import PREFILL, DecodeStats, Generation


def check_request(max_new_tokens: int, prompt_ids: Sequence[int], k: int | None = None) -> None:
    """Refuse a bad request (K < 1, max_new_tokens < 1, an empty prompt) before any model runs."""
    at_least("K (the block length)", k, none=True), at_least("max_new_tokens", max_new_tokens)
    if len(prompt_ids) == 0:
        raise ConfigError("The prompt is empty: at least one token is needed.")


def cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    """``tokens`` up to and including the first EOS, and whether there was one."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


def prefill(target, drafter, prompt_ids: Sequence[int], clock: PhaseClock, eos: frozenset[int], max_new_tokens: int,
            first) -> tuple[float, float, list[int], bool]:
    """A speculative loop's first step, the prefill: ``first(prompt_ids) -> int`` runs the target's prefill and chooses the first
    token, then the drafter starts on the prompt and that token and (where it has a ``prefill``) runs the prompt through
    its body: both models' prompt processing is timed apart, as TTFT, and the decode phase holds the rounds alone.
    Returns ``(t0, t1, out, done)``: the clock before and after the prefills, the output so far (the first token) and
    whether it already ends the generation."""
    target.reset()
    t0 = clock.now()
    with clock.phase(PREFILL):
        token = first(prompt_ids)
        drafter.begin(list(prompt_ids) + [token])
        if hasattr(drafter, "prefill"):
            drafter.prefill()  # the draft's prompt processing belongs to TTFT, as the target's does
    t1 = clock.now()
    return t0, t1, [token], token in eos or max_new_tokens == 1


def finish(stats: DecodeStats, out: list[int], eos: frozenset[int], clock: PhaseClock, t0: float,
            t1: float) -> Generation:
    """Close the record: t0 = start, t1 = first token known, now = last token known."""
    t2 = clock.now()
    stats.new_tokens = len(out)
    stats.stopped_by = "eos" if out[-1] in eos else "max_new_tokens"
    stats.ttft_s, stats.decode_s = t1 - t0, t2 - t1
    stats.phase_s = clock.as_dict()
    return Generation(out, stats)


def accepted_prefix(proposals: Sequence[int], target_tokens: Sequence[int]) -> int:
    """Length of the longest prefix on which the proposals equal the target's argmax tokens."""
    n = 0
    for y, t in zip(proposals, target_tokens):
        if y != t:
            break
        n += 1
    return n


def emit_round(stats: DecodeStats, out: list[int], y: Sequence[int], n: int, correction: int, drafted: int,
               eos: frozenset[int], max_new_tokens: int) -> bool:
    """Append a round's output (the ``n`` accepted proposals and the target's token, cut at EOS) and count
    it; returns whether generation is done."""
    emitted, hit_eos = cut_at_eos(list(y[:n]) + [correction], eos)
    out.extend(emitted)
    stats.drafted.append(drafted)
    stats.accepted.append(min(n, len(emitted)))
    stats.emitted.append(len(emitted))
    return hit_eos or len(out) >= max_new_tokens
