"""Timing small calls side by side: the one timer behind every head, step and cost measurement of the
benchmarks (thesis sections 4.3, Tables 4.1-4.4), and the thesis' latency statistics.

:func:`interleaved` times ``fn(i)`` for every item and every named function, the functions interleaved per
item with their order alternating (:func:`~thesis_lib.decoding.clocks.alternating`), after untimed warm-up calls (which also compile). :func:`head_ms` is the
common case of one head on real hidden states, with the token ids read back each call. :func:`stats_ms` turns
seconds into the thesis' statistics (mean, P50, P95, tokens/s) plus the median.
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

from ..decoding.clocks import Stopwatch, alternating


def stats_ms(xs: Sequence[float]) -> dict:
    """The thesis' latency statistics (mean, P50, P95, tokens/s) plus the median, from seconds."""
    ms = sorted(x * 1e3 for x in xs)
    p95 = ms[min(len(ms) - 1, max(0, round(0.95 * (len(ms) - 1))))]
    mean = statistics.fmean(ms)
    return {"n": len(ms), "mean_ms": mean, "p50_ms": statistics.median(ms), "p95_ms": p95,
            "tokens_per_s": 1e3 / mean}


def interleaved(fns: dict[str, Callable[[int], object]], n_items: int, *, reps: int, warmup: int,
                desc: str, progress: bool, device="cpu") -> dict[str, list[float]]:
    """Time ``fn(i)`` for every item and mode, modes interleaved per item with the order alternating, on
    ``device``'s clock (:class:`~thesis_lib.decoding.clocks.Stopwatch`: CUDA events on a GPU)."""
    from ..progress import tqdm

    names = list(fns)
    for w in range(warmup):
        for name in names:
            fns[name](w % n_items)
    watches = {n: Stopwatch(device) for n in names}
    with tqdm(total=reps * n_items, desc=desc, disable=not progress, unit="item") as bar:
        for r in range(reps):
            for i in range(n_items):
                for name in alternating(names, r * n_items + i):
                    watches[name].time(fns[name], i)
                bar.update()
    return {n: w.seconds() for n, w in watches.items()}


@torch.inference_mode()
def head_ms(head, states: torch.Tensor, *, rows: int = 64, reps: int = 3, warmup: int = 8) -> float:
    """Median milliseconds of one greedy call on one hidden state (``[1, D]``), over up to ``rows`` states
    spread evenly over ``states`` x ``reps``, after ``warmup`` untimed calls (and compilation); the token ids
    are read back to the host in every timed call. The states are moved to the head's device first."""
    states = states.to(head.device)
    sel = [states[i:i + 1].contiguous() for i in range(0, states.shape[0], max(1, states.shape[0] // rows))][:rows]
    times = interleaved({"head": lambda i: head(sel[i]).tolist()}, len(sel), reps=reps,
                        warmup=min(warmup, len(sel)), desc="head", progress=False, device=head.device)
    return 1000 * statistics.median(times["head"])
