"""The thesis' pooled definitions over a run's samples (sections 4.4-4.6; :func:`totals`), each prompt's ratio to
its own baseline (:func:`per_sample_ratios`, robust to a noisy machine), and the modes' names (:data:`LABELS`).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ..bench.metrics import decode_tokens, quantiles
from ..bench.runs import Run, load_run
from ..errors import ConfigError

LABELS = {
    "baseline": "Baseline", "dense_ordinary": "Dense draft", "flash_ordinary": "FlashHead draft",
    "shared_ordinary": "Dense shared", "dense_deferred": "Dense deferred", "flash_deferred": "FlashHead deferred",
    "shared_deferred": "Dense shared deferred", "dense_pipelined": "Dense pipelined",
    "flash_pipelined": "FlashHead pipelined", "shared_pipelined": "Dense shared pipelined",
    "ngram_deferred": "Prompt-lookup deferred",
    "hf_greedy": "transformers generate()", "hf_assisted": "transformers assisted generate()",
}


def as_run(run: Run | str | Path) -> Run:
    """A run folder, read if given by its path."""
    return run if isinstance(run, Run) else load_run(run)


def samples_of(run: Run, mode: str, table: str) -> list[dict]:
    """The samples of ``mode``, or a clear error naming the table that needs them."""
    rs = run.of(mode)
    if not rs:
        raise ConfigError(f"Run {run.name!r} has no samples of mode {mode} (Table {table} needs it; "
                          f"the run has {', '.join(run.modes()) or 'none'}).")
    return rs


def totals(rs: list[dict]) -> dict:
    """The thesis' pooled quantities over one mode's samples: decode tok/s = all decode tokens / all decode time,
    TTFT the mean, end-to-end tok/s = all new tokens / all TTFT and decode time, acceptance = accepted / drafted,
    mean emitted per round (target token included)."""
    decode_s = sum(r["decode_s"] for r in rs)
    tokens = sum(decode_tokens(r) for r in rs)
    drafted = sum(r.get("drafted", 0) for r in rs)
    rounds = sum(r.get("rounds", 0) for r in rs)

    def phase(name):
        return sum(r.get("phase_s", {}).get(name, 0.0) for r in rs)

    return {
        "samples": len(rs), "decode_tokens": tokens, "decode_s": decode_s,
        "decode_tokens_per_s": tokens / decode_s if decode_s else float("nan"),
        "ttft_ms": 1000 * statistics.fmean(r["ttft_s"] for r in rs),
        "e2e_tokens_per_s": sum(r["new_tokens"] for r in rs) / sum(r["ttft_s"] + r["decode_s"] for r in rs),
        "acceptance": sum(r.get("accepted", 0) for r in rs) / drafted if drafted else float("nan"),
        "mean_emitted": sum(r.get("emitted", 0) for r in rs) / rounds if rounds else float("nan"),
        "propose_s": phase("draft_propose"), "verify_s": phase("target_verify"), "finalize_s": phase("finalize_align"),
        "verify_calls": sum(r.get("verify_calls", 0) for r in rs),
        "append_calls": sum(r.get("append_calls", 0) for r in rs),
        "phases": {k: phase(k) for k in dict.fromkeys(k for r in rs for k in r.get("phase_s", {}))},
    }


def per_sample_ratios(run: Run, mode: str, against: str = "baseline", key: str = "decode_tokens_per_s") -> list[float]:
    """Each sample's ``key`` over the same prompt and iteration's ``against`` sample."""
    base = {(r.get("iteration", 0), r["question_id"]): r for r in run.of(against)}
    out = []
    for r in run.of(mode):
        b = base.get((r.get("iteration", 0), r["question_id"]))
        if b and r.get(key) and b.get(key):
            out.append(r[key] / b[key])
    return out


def quartiles3(xs: list[float]) -> tuple[float, float, float]:
    """P25, median, P75 (NaN without values)."""
    q = quantiles(xs)
    return (float("nan"),) * 3 if q is None else (q["p25"], q["p50"], q["p75"])
