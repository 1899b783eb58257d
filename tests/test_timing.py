"""The one side-by-side timer (thesis_lib.bench.timing): the alternating order every measurement uses, the interleaved
timer's calls and what it returns, and the thesis' latency statistics, on constructed calls and numbers."""

from __future__ import annotations

import pytest

from thesis_lib.bench.timing import interleaved, stats_ms
from thesis_lib.decoding.clocks import alternating


def test_alternating_keeps_the_order_at_even_positions_and_reverses_it_at_odd_ones():
    assert alternating(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert alternating(["a", "b", "c"], 1) == ["c", "b", "a"]
    assert alternating(("x", "y"), 6) == ["x", "y"] and alternating(("x", "y"), 7) == ["y", "x"]
    assert alternating({"p": 1, "q": 2}, 3) == ["q", "p"]  # a mapping's names, in its order
    # over any two neighbouring positions each name runs first once
    for k in range(5):
        assert {alternating("abc", k)[0], alternating("abc", k + 1)[0]} == {"a", "c"}


def test_interleaved_warms_up_then_times_every_name_on_every_item_in_alternating_order():
    calls = []
    fns = {name: (lambda i, name=name: calls.append((name, i))) for name in ("a", "b")}
    times = interleaved(fns, 3, reps=2, warmup=2, desc="t", progress=False)
    warm, timed = calls[:4], calls[4:]
    assert warm == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # untimed, every name, first items
    positions = [(r, i) for r in range(2) for i in range(3)]
    expected = [(name, i) for k, (r, i) in enumerate(positions) for name in alternating(["a", "b"], k)]
    assert timed == expected
    assert set(times) == {"a", "b"} and all(len(ts) == 6 and min(ts) >= 0 for ts in times.values())


def test_stats_ms_gives_the_thesis_latency_statistics_in_milliseconds():
    s = stats_ms([0.001 * x for x in range(1, 21)])  # 1..20 ms
    assert s["n"] == 20 and s["mean_ms"] == pytest.approx(10.5) and s["p50_ms"] == pytest.approx(10.5)
    assert s["p95_ms"] == pytest.approx(19.0)  # the value at round(0.95 * 19) = 18 of the sorted list
    assert s["tokens_per_s"] == pytest.approx(1000 / 10.5)
    assert stats_ms([0.004])["p95_ms"] == pytest.approx(4.0)
