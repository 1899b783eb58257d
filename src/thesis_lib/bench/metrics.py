"""What one sample records and how samples aggregate (thesis section 3.7): the per-sample record, its key,
the per-mode summary (medians, quartiles, pooled totals, per-sample ratios against the baseline), and the
decode speed the measured component costs predict for a sample.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ..decoding.costs import round_cost
from ..decoding.stats import Generation
from .modes import parse
from .prompts import Prompt


def sample_record(prompt: Prompt, mode: str, gen: Generation, reference: list[int] | None, *,
                  iteration: int = 0) -> dict:
    """One JSON-able record per prompt x iteration x mode: every metric of the protocol and the tokens."""
    st = gen.stats
    rec = {"iteration": iteration, "question_id": prompt.question_id, "category": prompt.category, "mode": mode,
           "k": st.k, "new_tokens": st.new_tokens, "decode_tokens": max(st.new_tokens - st.first_emit, 0),
           "ttft_s": st.ttft_s, "decode_s": st.decode_s, "decode_tokens_per_s": st.decode_tokens_per_s,
           "tpot_s": st.tpot_s, "e2e_tokens_per_s": st.e2e_tokens_per_s, "first_emit": st.first_emit,
           "stopped_by": st.stopped_by, "verify_calls": st.verify_calls, "append_calls": st.append_calls,
           "phase_s": st.phase_s,
           "matches_baseline": None if reference is None else gen.tokens == reference, "tokens": gen.tokens}
    rec.update(gen.extra)
    if st.drafted:
        rec.update(acceptance=st.acceptance, mean_emitted=st.mean_emitted, rounds=st.rounds,
                   drafted=sum(st.drafted), accepted=sum(st.accepted), emitted=sum(st.emitted),
                   skipped=st.skipped, zero_accept_rounds=st.zero_accept_rounds,
                   full_accept_rounds=st.full_accept_rounds, tail_tokens=st.tail_tokens,
                   accepted_per_round=list(st.accepted), drafted_per_round=list(st.drafted))
    return rec


def sample_key(rec: dict) -> tuple[int, str, str]:
    """What identifies a sample in a run: (iteration, question_id, mode)."""
    return int(rec.get("iteration", 0)), str(rec["question_id"]), str(rec["mode"])


def decode_tokens(r: dict) -> int:
    """Tokens a sample produced after its first (the decode phase's); a record written before ``decode_tokens``
    was kept counts its new tokens but the first."""
    return r.get("decode_tokens", r["new_tokens"] - r.get("first_emit", 1))


def median(xs):
    """The median of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def quantiles(xs) -> dict | None:
    """min, P25, P50, P75 and max of the values that are not None (None if there are none)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"min": xs[0], "p25": q[0], "p50": q[1], "p75": q[2], "max": xs[-1]}


def summarize(records: Sequence[dict]) -> dict[str, dict]:
    """Per mode: medians over samples (and the spread of decode tok/s), pooled totals as the thesis reports
    them (decode tok/s = all decode tokens / all decode time), and the median per-sample ratio of decode
    tok/s against ``baseline`` on the same prompt and iteration."""
    def base_key(r):
        return int(r.get("iteration", 0)), r["question_id"]

    bases = {b: {base_key(r): r for r in records if r["mode"] == b} for b in ("baseline", "sample_baseline")}
    out: dict[str, dict] = {}
    for mode in dict.fromkeys(r["mode"] for r in records):
        rs = [r for r in records if r["mode"] == mode]
        parsed = parse(mode)
        base = bases[parsed.baseline]

        def ratios(key):
            return [r[key] / base[base_key(r)][key] for r in rs if r[key] and base.get(base_key(r), {}).get(key)]

        drafted = sum(r.get("drafted", 0) for r in rs)
        decode_s = sum(r["decode_s"] for r in rs)
        tokens = sum(decode_tokens(r) for r in rs)
        out[mode] = {
            "samples": len(rs),
            "decode_tokens_per_s": median(r["decode_tokens_per_s"] for r in rs),
            "decode_tokens_per_s_spread": quantiles(r["decode_tokens_per_s"] for r in rs),
            "decode_tokens_per_s_pooled": tokens / decode_s if decode_s else None,
            "ttft_s": median(r["ttft_s"] for r in rs),
            "tpot_s": median(r["tpot_s"] for r in rs),
            "speedup_vs_baseline": median(ratios("decode_tokens_per_s")),
            "speedup_vs_baseline_spread": quantiles(ratios("decode_tokens_per_s")),
            "e2e_tokens_per_s": median(r["e2e_tokens_per_s"] for r in rs),
            "e2e_speedup_vs_baseline": median(ratios("e2e_tokens_per_s")),
            # pooled over all rounds of all samples; per-sample values are in the records
            "acceptance": (sum(r.get("accepted", 0) for r in rs) / drafted) if drafted else None,
            "mean_emitted": (sum(r["emitted"] for r in rs) / sum(r["rounds"] for r in rs)) if drafted else None,
            "matches_baseline": (None if parsed.sampled else sum(bool(r["matches_baseline"]) for r in rs)),
            "predicted_over_measured": median(r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] for r in rs
                                               if r.get("predicted_tokens_per_s") and r["decode_tokens_per_s"]),
        }
    return out


def predicted_tokens_per_s(rec: dict, costs: dict[str, float]) -> float | None:
    """Decode tok/s that the component costs predict for one speculative sample, given what it did: its rounds
    summed as one :func:`~thesis_lib.decoding.costs.round_cost` (each drafted token a draft step, each verify call a
    K-token (deferred: K+1) target forward, each append a step). Python, cache cropping and the second token the
    draft feeds after a fully accepted block are left out; both prefills lie in TTFT, outside the decode phase."""
    if "rounds" not in rec or rec["new_tokens"] < 2:
        return None
    mode, k = parse(rec["mode"]), rec["k"]
    if mode.policy != "fixed" or mode.draft not in ("dense", "flash", "shared") or mode.schedule == "tree":
        return None  # the model below knows one fixed K (a chain) and the dense/FlashHead step costs only
    verify = costs.get(f"target_verify_{k + 1}_s" if mode.schedule == "deferred" else f"target_verify_{k}_s")
    step = costs["flash_draft_step_s"] if mode.draft == "flash" else costs["draft_step_s"]
    if mode.schedule == "pipelined" or verify is None:
        return None  # the model has no overlap term; a variant's K whose verify forward was not timed
    t = round_cost(rec["drafted"], step, rec["verify_calls"] * verify, rec["append_calls"] * costs["target_step_s"])
    return (rec["new_tokens"] - rec["first_emit"]) / t
