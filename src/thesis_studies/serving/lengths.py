"""Longer generations: the speedup and acceptance as the output grows, and the head's share of a
draft step as the context grows.

:func:`by_length` decodes each prompt once per length N (32 to 256 new tokens by default), target-only and each
speculative mode, interleaved per prompt with the order alternating; each run is a whole generation of N tokens,
so the speedup at N is what a user asking for N tokens gets. Acceptance by position comes from the longest runs'
rounds: the draft token a round proposes i-th sits at the round's first output position plus i, and counts as
accepted if the round accepted at least i tokens.

:func:`head_share_by_context` times, after a context of L tokens (the prompt and the target's own output), one
draft body step and each head on its hidden state: the head reads the same bytes whatever L is, the body's attention
reads L positions more.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from thesis_lib.errors import ConfigError
from thesis_lib.bench.disturbance import Watch
from thesis_lib.decoding.clocks import alternating

#: new tokens per generation measured by default
LENGTHS = (32, 64, 128, 256)
#: output positions grouped for acceptance by position: [0, 32), [32, 64), [64, 128), [128, 256)
POSITION_EDGES = (0, 32, 64, 128, 256)
#: the modes of the lengths part: target-only and the deferred schedule with each draft
LENGTH_MODES = ("baseline", "dense_deferred", "flash_deferred")


def check_lengths(lengths: Sequence[int]) -> None:
    if not lengths or min(lengths) < 2:
        raise ConfigError(f"Lengths are new tokens per generation, at least 2 (got {list(lengths)}).")


def by_length(run, prompts: Sequence[Sequence[int]], *, lengths: Sequence[int] = LENGTHS,
              modes: Sequence[str] = LENGTH_MODES, progress: bool = True) -> dict:
    """``run(mode, ids, n) -> Generation`` for every prompt, length and mode (interleaved). Per length: each mode's
    decode seconds per prompt (TTFT left out: the prefill is the same in every mode) and new tokens; the rows
    equal to target-only's. Acceptance by output position over the longest length's runs."""
    from thesis_lib.progress import tqdm

    check_lengths(lengths)
    out = {str(n): {"decode_s": {m: [] for m in modes}, "tokens": {m: [] for m in modes},
                    "equal": {m: 0 for m in modes}} for n in lengths}
    longest = max(lengths)
    edges = [e for e in POSITION_EDGES if e < longest] + [longest]
    positions = {m: {"drafted": [0] * (len(edges) - 1), "accepted": [0] * (len(edges) - 1)} for m in modes
                 if m != "baseline"}
    with Watch() as machine, tqdm(total=len(prompts) * len(lengths), desc="longer generations", unit="run",
                                  disable=not progress) as bar:
        for i, ids in enumerate(prompts):
            for j, n in enumerate(lengths):
                order = alternating(modes, i + j)
                got = {m: run(m, ids, n) for m in order}
                part = out[str(n)]
                for m in modes:
                    g = got[m]
                    part["decode_s"][m].append(round(g.stats.decode_s, 6))
                    part["tokens"][m].append(len(g.tokens))
                    part["equal"][m] += g.tokens == got["baseline"].tokens
                    if n == longest and m in positions:
                        _count_positions(g.stats, edges, positions[m])
                bar.update()
    return {"lengths": list(lengths), "modes": list(modes), "prompts": len(prompts), "by_length": out,
            "position_edges": edges, "by_position": positions, "machine": machine.record}


def _count_positions(stats, edges: Sequence[int], into: dict) -> None:
    """Add one generation's draft tokens, drafted and accepted, to the position bins bounded by ``edges``."""
    start = stats.first_emit  # output positions before the first round: the prefill's token(s)
    for drafted, accepted, emitted in zip(stats.drafted, stats.accepted, stats.emitted):
        for i in range(1, drafted + 1):
            pos = start + i - 1
            b = next((j for j in range(len(edges) - 1) if edges[j] <= pos < edges[j + 1]), None)
            if b is not None:
                into["drafted"][b] += 1
                into["accepted"][b] += i <= accepted
        start += emitted


@torch.inference_mode()
def head_share_by_context(draft, heads: dict, context: Sequence[int], lengths: Sequence[int], *,
                          reps: int = 7) -> dict:
    """For each context length L (``context``'s first L tokens; L must not exceed it): the median milliseconds of
    one draft body step over one token after L - 1 cached tokens (the one forward-cost timer), and of each of
    ``heads`` (name -> head) on the hidden state after the L tokens, side by side; the head's share of a step is
    head / (body + head)."""
    from thesis_lib.bench.timing import interleaved
    from thesis_lib.decoding.costs import forward_curves

    if max(lengths) > len(context):
        raise ConfigError(f"a context of {max(lengths)} tokens needs that many; {len(context)} given.")
    out = {}
    for n in lengths:
        b = forward_curves({"draft": draft}, context[:n - 1], [1], reps=reps, warmup=1, head=False)["draft"][1]
        h = draft.hidden(list(context[:n]))[-1:]
        by_head = interleaved({name: lambda i, head=head: head(h).tolist() for name, head in heads.items()}, 1,
                              reps=reps, warmup=1, desc="heads", progress=False, device=h.device)
        draft.reset()
        out[str(n)] = {"body_ms": round(1e3 * b, 4), **{
            name: {"head_ms": round(1e3 * statistics.median(ts), 4),
                   "share": statistics.median(ts) / (b + statistics.median(ts))} for name, ts in by_head.items()}}
    return out
