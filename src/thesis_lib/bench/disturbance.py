"""What else used the machine while something was timed: :class:`Watch` reads the kernel's CPU counters
(``/proc/stat``), this process's own CPU time and the load average around a timed part, and :func:`judge` says
whether the part was disturbed, from what the others used, the time the hypervisor stole, and the spread of
the part's repeated timings.

Others' CPU time is the machine's busy time minus this process's (all its threads); it is a share of the CPUs
this process may run on over the part's wall time. Where ``/proc/stat`` is missing (not Linux) only the spread
of the timings is judged, and the record says so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: A part is disturbed when other processes used more than this share of the CPUs during it ...
OTHERS_SHARE = 0.10
#: ... or the hypervisor stole more than this share ...
STEAL_SHARE = 0.05
#: ... or its repeated timings' P95 is more than this many times their median.
SPREAD = 2.0

_STAT = Path("/proc/stat")


def _counters() -> tuple[float, float] | None:
    """Seconds all CPUs spent busy (user, nice, system, irq, softirq) and stolen, since boot."""
    try:
        fields = _STAT.read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields] + [0] * 8
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), torch's default thread count for a run."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Watch:
    """``with Watch() as w:`` around a timed part; ``w.record`` then holds what the machine did meanwhile."""

    def __enter__(self) -> "Watch":
        self.record: dict = {}
        self._t0, self._own0, self._machine0 = time.perf_counter(), time.process_time(), _counters()
        self._load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        own = time.process_time() - self._own0
        machine, cpus = _counters(), available_cores()
        rec = {"wall_s": wall, "own_cpu_s": own, "cpus": cpus}
        if machine is not None and self._machine0 is not None and wall > 0:
            busy, steal = (b - a for a, b in zip(self._machine0, machine))
            others = max(0.0, busy - own)
            rec.update(others_cpu_s=others, others_share=others / (wall * cpus), steal_share=steal / (wall * cpus))
        if self._load0 is not None:
            rec["load_1m"] = max(self._load0, os.getloadavg()[0])
        self.record = rec


def judge(record: dict | None, spread: float | None = None) -> dict:
    """``{"disturbed": bool, "why": sentence}`` for a :class:`Watch` record and the P95/P50 ``spread`` of the
    part's repeated timings (either may be missing: what is missing is not judged)."""
    reasons = []
    record = record or {}
    if record.get("others_share", 0.0) > OTHERS_SHARE:
        reasons.append(f"other processes used {100 * record['others_share']:.0f} % of the CPUs")
    if record.get("steal_share", 0.0) > STEAL_SHARE:
        reasons.append(f"the hypervisor took {100 * record['steal_share']:.0f} % of the CPU time")
    if spread is not None and spread > SPREAD:
        reasons.append(f"the slowest 5 % of repeated timings took {spread:.1f}x the median")
    if reasons:
        return {"disturbed": True, "why": "; ".join(reasons)}
    said = [f"other processes used {100 * record['others_share']:.0f} % of the CPUs" if "others_share" in record
            else "the CPU counters could not be read" if record else "what else ran was not recorded"]
    if spread is not None:
        said.append(f"the timings' P95 was {spread:.1f}x their median")
    return {"disturbed": False, "why": " and ".join(said)}


def judge_timed(part: dict) -> dict:
    """:func:`judge` of a model-bench part (its ``machine`` record and the widest P95/P50 of its timed modes)."""
    stats = part.get("stats", {})
    spreads = [s["p95_ms"] / s["p50_ms"] for s in stats.values() if s.get("p50_ms")]
    return judge(part.get("machine"), max(spreads) if spreads else None)
