"""Clocks for the decoding loops (thesis sections 3.5 and 4.2).

- :class:`PhaseClock` accumulates wall time per named phase. On CUDA it synchronises before reading the
  clock (all the clock's devices, or only those a phase names), so a phase is charged for the GPU work it
  launched; elsewhere it reads ``time.perf_counter``. The decoding loops always run under a clock (two clock
  reads per phase), so every generation carries its own phase times. Time spent waiting in those
  synchronisations is counted too (``sync_s``).
- :func:`alternating`: the order of things timed side by side (every side-by-side measurement follows it);
  :func:`synchronize`: a device's queued work done.
- :class:`ForwardTimer` times one model's forward passes by themselves: with CUDA events (GPU time of the
  forward) where the model sits on a CUDA device, with ``perf_counter`` elsewhere. The profiled run uses it on
  the target, so verification is seen both as loop wall time and as the forward's own time.

The profiled drafter (:class:`thesis_lib.decoding.drafters.ProfiledDrafter`) charges its own work to finer
phases of a clock.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def synchronize(device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for off CUDA)."""
    if _is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def alternating(names: Sequence, position: int) -> list:
    """The order of ``names`` at one position of a side-by-side measurement: as given at an even position, reversed
    at an odd one, so that on a machine that drifts none of them always runs first. Every measurement of the
    project that runs several things side by side orders them by this."""
    names = list(names)
    return names if position % 2 == 0 else names[::-1]


class PhaseClock:
    """Accumulates seconds per phase; synchronises CUDA devices before each clock read."""

    def __init__(self, devices=("cpu",), trace: bool = False):
        self.devices = [torch.device(d) for d in devices if _is_cuda(d)]
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.sync_s = 0.0
        #: with ``trace=True``: every phase as (name, start_s, end_s) on the perf_counter clock (Figure 3.1)
        self.events: list[tuple[str, float, float]] | None = [] if trace else None

    def sync(self, devices: Sequence | None = None) -> None:
        targets = self.devices if devices is None else [torch.device(d) for d in devices if _is_cuda(d)]
        if targets:
            t0 = time.perf_counter()
            for d in dict.fromkeys(targets):
                torch.cuda.synchronize(d)
            self.sync_s += time.perf_counter() - t0

    def now(self, devices: Sequence | None = None) -> float:
        self.sync(devices)
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str, *devices) -> Iterator[None]:
        """Time a phase; with ``devices``, synchronise only those (pipelined schedules overlap the others)."""
        only = devices or None
        t0 = self.now(only)
        try:
            yield
        finally:
            t1 = self.now(only)
            self.seconds[name] += t1 - t0
            self.calls[name] += 1
            if self.events is not None:
                self.events.append((name, t0, t1))

    def as_dict(self) -> dict[str, float]:
        out = dict(self.seconds)
        if self.sync_s:
            out["sync"] = self.sync_s
        return out


class Stopwatch:
    """Times calls on one device: ``perf_counter`` around the call on a CPU; on a CUDA device, events recorded
    on that device's current stream before and after the call, read after one synchronisation of that device
    (:meth:`seconds`), so the time is the device's, not the kernel launches'."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = _is_cuda(device)
        self._pending: list = []
        self._done: list[float] = []

    def time(self, fn: Callable, *args, **kwargs):
        """Call ``fn`` and time it; returns its result."""
        if self.cuda:
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            out = fn(*args, **kwargs)
            end.record(stream)
            self._pending.append((start, end))
            return out
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self._done.append(time.perf_counter() - t0)
        return out

    def seconds(self) -> list[float]:
        """Seconds of every timed call so far, in order."""
        if self._pending:
            torch.cuda.synchronize(self.device)
            self._done.extend(s.elapsed_time(e) / 1000.0 for s, e in self._pending)
            self._pending = []
        return list(self._done)

    def clear(self) -> None:
        self.seconds()
        self._done = []


class ForwardTimer:
    """Wraps a forward function; ``seconds()`` is the summed time of its calls (CUDA events on CUDA)."""

    def __init__(self, fn: Callable, device):
        self.fn = fn
        self.device = device
        self.watch = Stopwatch(device)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.watch.time(self.fn, *args, **kwargs)

    def seconds(self) -> float:
        return sum(self.watch.seconds())

    def reset(self) -> None:
        self.watch.clear()
        self.calls = 0
