"""A timed part on a busy machine is said to be disturbed: the counters' verdict on constructed records, and a run
timed beside processes that keep every CPU busy, whose page sentence and verdicts then say so."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from thesis_lib.bench import disturbance, protocol
from thesis_lib.bench.runs import load_run
from thesis_lib.book import gluing, provenance
from thesis_lib.models import tiny


def test_the_verdict_reads_each_sign_of_interference():
    quiet = {"wall_s": 10.0, "own_cpu_s": 19.0, "cpus": 2, "others_cpu_s": 0.4, "others_share": 0.02,
             "steal_share": 0.0}
    assert disturbance.judge(quiet, 1.3) == {"disturbed": False, "why": "other processes used 2 % of the CPUs and "
                                                                        "the timings' P95 was 1.3x their median"}
    busy = disturbance.judge({**quiet, "others_share": 0.35})
    assert busy["disturbed"] and busy["why"] == "other processes used 35 % of the CPUs"
    assert "hypervisor took 8 %" in disturbance.judge({**quiet, "steal_share": 0.08})["why"]
    spread = disturbance.judge(quiet, 2.5)  # the counters quiet, the timings not
    assert spread["disturbed"] and "2.5x the median" in spread["why"]
    assert disturbance.judge(None) == {"disturbed": False, "why": "what else ran was not recorded"}
    part = {"stats": {"dense": {"p50_ms": 2.0, "p95_ms": 5.0}, "flashhead": {"p50_ms": 1.0, "p95_ms": 1.1}},
            "machine": quiet}
    assert disturbance.judge_timed(part)["disturbed"]  # the widest spread of the part's modes decides


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_the_watch_sees_other_processes_and_not_its_own_work():
    """The same second of work timed alone and beside a busy process per CPU: only the second is disturbed, by a
    margin no noise of a quiet machine closes (this process's own spinning is never counted as others')."""
    with disturbance.Watch() as alone:
        _spin(1.0)
    procs = _busy(len(os.sched_getaffinity(0)))
    try:
        time.sleep(0.3)
        with disturbance.Watch() as shared:
            _spin(1.0)
    finally:
        for p in procs:
            p.kill()
    assert alone.record["own_cpu_s"] > 0.8 * alone.record["wall_s"]
    assert shared.record["others_share"] > alone.record["others_share"] + 0.3
    assert disturbance.judge(shared.record)["disturbed"]


def test_a_run_timed_beside_busy_processes_says_so_on_its_page(tmp_path, tok):
    """A real run (tiny models) timed while other processes keep every CPU busy: the run records it, the page's
    sentence names the disturbed part, and a verdict glued from the run's numbers is not judged."""
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "t")
    draft = tiny.save_tiny(tiny.noisy_copy(tiny.tiny_model(seed=0), 0.02), tok, tmp_path / "d")
    cfg = protocol.BenchConfig(out=str(tmp_path / "runs"), name="busy", target=str(target), draft=str(draft), k=3,
                               max_new_tokens=24, per_category=1, prompts=3, costs=False, iterations=3,
                               modes=("baseline", "dense_ordinary", "dense_deferred"))
    procs = _busy(len(os.sched_getaffinity(0)) + 1)
    try:
        time.sleep(0.3)
        run = protocol.run(cfg, progress=False)
    finally:
        for p in procs:
            p.kill()
    run = load_run(run.path)
    parts = provenance.disturbance(run, None)
    assert parts["the main run"]["disturbed"], run.environment["machine"]
    said = provenance.disturbance_said(parts)
    assert said.startswith("Disturbed: during the main run, other processes used") and "no verdict" in said
    glued = {}
    glue = gluing.Glue(lambda name, value, display=False: glued.__setitem__(name, value))
    for key, value in dict(ord_dense_vs_base_lo=0.8, ord_dense_vs_base_hi=0.9, def_flash_vs_dense_lo=1.04,
                           def_flash_vs_dense_hi=1.09).items():
        glue(key, value, display=False)
    glue.mark_disturbed(provenance.disturbed_keys(parts, glue.values))
    from thesis_lib.analysis import verdicts

    rule, inputs = verdicts.RULES["ch4_results"]["ord_db_beats"]
    assert rule(**{p: glue.values[k] for p, k in inputs.items()}) == "is slower than"  # what it would have said
    monkeypatched = {"ch4_results": {"ord_db_beats": (rule, inputs)}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verdicts, "rules", monkeypatched.get)
        out = glue.verdicts("ch4_results")
    assert out["ord_db_beats"].startswith("not judged, as the machine was busy") and glued["ord_db_beats"] == out[
        "ord_db_beats"]
