"""Phase timers for the decoding loops (thesis section 3.5).

:class:`PhaseClock` accumulates wall time per named phase. On a CUDA device it synchronises before reading
the clock, so a phase is charged for the GPU work it launched; elsewhere it reads ``time.perf_counter``.
The decoding loops always run under a clock (its cost is two clock reads per phase), so every generation
carries its own phase times. The finer, more intrusive instrumentation (body vs head inside the draft) is a
separate profiled run in a later chapter.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator


class PhaseClock:
    """Accumulates seconds per phase; synchronises CUDA before each clock read when a device is CUDA."""

    def __init__(self, devices=("cpu",)):
        self._cuda = any(str(d).startswith("cuda") for d in devices)
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = self.now()
        try:
            yield
        finally:
            self.seconds[name] += self.now() - t0
            self.calls[name] += 1

    def as_dict(self) -> dict[str, float]:
        return dict(self.seconds)
