"""CUDA graphs captured by hand, and their replays timed on the device alone (``thesis-lib studies gpu-check``).

A serving engine captures a decode step once and replays it; :func:`capture` and :func:`capture_head` do the
same for one function or one head over a static input row. :func:`queued_times` times replays so that only
the device's work is in the interval: the GPU is kept busy while the host records the start event and
launches the replay, so neither the host's launch latency nor an input copy is counted. What a CUDA-event
interval around an idle GPU adds instead is a few microseconds of launch per call (3.7 us for a one-kernel
graph on an H100), which matters for a head of 25-35 us and not for a 1.8 ms step.
"""

from __future__ import annotations

import torch


def capture_head(head, states: torch.Tensor, rows: int = 1):
    """``head`` captured in a CUDA graph over a static input of ``rows`` rows; the returned ``fn(i)`` copies
    group ``i`` of ``states`` (rows ``i * rows`` on) in and replays."""
    static = states[:rows].clone()
    head(static)  # warm-up outside the capture (Triton compiles its kernels on the first launch)
    torch.cuda.synchronize(static.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = head(static)

    def load(i: int) -> None:
        static.copy_(states[i * rows:(i + 1) * rows])

    def call(i: int) -> torch.Tensor:
        load(i)
        graph.replay()
        return out

    call.load = load
    call.replay = graph.replay
    return call


def capture(fn, *args):
    """``fn(*args)`` captured by hand in one CUDA graph (after warm-up calls on a side stream, which also compile
    and autotune); returns ``call(i)`` that replays it and returns the graph's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)

    def call(i: int):
        graph.replay()
        return out

    call.load = lambda i: None
    call.replay = graph.replay
    return call


#: how long the GPU is kept busy before each queued replay: longer than the host takes to record the start
#: event, launch the replay and record the end event (about 10 us), so none of that is in the interval
BUSY_CYCLES = 100_000


def rotation(names: list, k: int) -> list:
    """The order of the ``k``-th interleaved round: ``names`` rotated by ``k``, so over any ``len(names)``
    consecutive rounds each name runs once in every position. (Alternating the order would keep a middle name in
    the middle: on an H100 a FlashHead head chained by programmatic dependent launch took about 2.5 µs longer there
    than at either end, and than alone.)"""
    k %= max(len(names), 1)
    return names[k:] + names[:k]


def queued_times(calls: dict, rows: int, *, reps: int, device: str, warmup: int = 3) -> dict[str, list[float]]:
    """Seconds of each captured graph's replay alone, on the device's clock: the input row is loaded first
    (untimed), then the GPU is kept busy (``torch.cuda._sleep``) while the host records the start event,
    launches the replay and records the end event, so the interval holds the graph's execution, not the
    host's launch latency (which a step's own graph never pays between its body and its head). Names are
    interleaved per row in :func:`rotation`'s order."""
    names = list(calls)
    stream = torch.cuda.current_stream(torch.device(device))
    out: dict[str, list[float]] = {n: [] for n in names}
    for w in range(warmup):
        for n in names:
            calls[n].load(w % rows)
            calls[n].replay()
    for r in range(reps):
        pending = []
        for i in range(rows):
            for n in rotation(names, r * rows + i):
                calls[n].load(i)
                torch.cuda._sleep(BUSY_CYCLES)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                calls[n].replay()
                end.record(stream)
                pending.append((n, start, end))
        torch.cuda.synchronize(torch.device(device))
        for n, start, end in pending:
            out[n].append(start.elapsed_time(end) / 1000.0)
    return out


def replay_step(fn, *args):
    """Call a ``mode="reduce-overhead"`` function as one new step (else CUDA-graph trees record a new graph
    while the last call's outputs are alive, and time that)."""
    torch.compiler.cudagraph_mark_step_begin()
    return fn(*args)
