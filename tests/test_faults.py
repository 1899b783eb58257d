"""Faults injected into a real ``thesis-lib bench`` process (tiny models, a fresh process each): SIGKILLed while it
generates a sample, while it writes a sample's line, and while it writes the summary. After each, ``--resume``
completes the run, and its samples are an uninterrupted run's: the same prompts, iterations and modes, each once,
with the same tokens. (The kernel build's and the JSON writer's faults are in ``test_build_lock.py``, a second
writer and an interrupted run in ``test_protocol.py``.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ["bench", "--target", "tiny:target", "--draft", "tiny:draft", "--modes", "baseline,flash_deferred",
         "--prompts", "3", "--per-category", "1", "--max-new-tokens", "12", "--iterations", "2", "--warmup", "0",
         "--no-costs", "--clusters", "17", "--kmeans-iterations", "4", "--flash-path", "eager", "--threads", "1"]
#: what a sample says about what was generated (not when or how fast)
CONTENT = ("iteration", "question_id", "mode", "k", "tokens", "drafted", "accepted", "matches_baseline")
#: the faults: code run before the bench, which prints "fault" and stops the process where the fault strikes
FAULTS = {
    "mid-sample": "from thesis_lib.bench.runner import Runner\nreal = Runner.run\ncalls = []\n"
                  "def run(self, *a, **k):\n    calls.append(1)\n    if len(calls) == 4:\n"
                  "        print('fault', flush=True); time.sleep(120)\n    return real(self, *a, **k)\n"
                  "Runner.run = run\n",
    "mid-line": "from thesis_lib.bench import runs\nreal = runs.append_json_line\ncalls = []\n"
                "def half(file, doc):\n    calls.append(1)\n    if len(calls) == 3:\n"
                "        text = json.dumps(doc)\n        with open(file, 'a') as f:\n"
                "            f.write(text[: len(text) // 2]); f.flush()\n"
                "        print('fault', flush=True); time.sleep(120)\n    real(file, doc)\n"
                "runs.append_json_line = half\n",
    "mid-summary": "from thesis_lib.bench import runs\n"
                   "def summary(self, s):\n    print('fault', flush=True); time.sleep(120)\n"
                   "runs.Run.write_summary = summary\n",
}


def _bench(out: Path, name: str, *extra: str, fault: str = "") -> subprocess.Popen:
    code = (f"import json, sys, time\n{fault}from thesis_lib import cli\n"
            f"sys.exit(cli.main({[*BENCH, '--out', str(out), '--name', name, *extra]!r}))")
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def _samples(folder: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    return sorted(tuple(json.dumps(r.get(k)) for k in CONTENT) for r in rows)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    proc = _bench(out, "whole")
    assert proc.wait(timeout=600) == 0
    return _samples(out / "whole")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bench_killed_midway_resumes_to_the_uninterrupted_run(fault, uninterrupted, tmp_path):
    proc = _bench(tmp_path, "r", fault=FAULTS[fault])
    try:
        line = proc.stdout.readline()
        while line and line.strip() != "fault":
            line = proc.stdout.readline()
        assert line.strip() == "fault", "the fault never struck"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    folder = tmp_path / "r"
    assert not (folder / "summary.json").exists()
    if fault == "mid-line":
        assert not (folder / "samples.jsonl").read_text().endswith("\n")  # the torn line is there
    assert _bench(tmp_path, "r", "--resume").wait(timeout=600) == 0
    assert _samples(folder) == uninterrupted and len(uninterrupted) == 3 * 2 * 2
    assert json.loads((folder / "summary.json").read_text())["baseline"]["samples"] == 3 * 2


def test_a_torn_plan_file_is_set_aside_and_the_sizes_planned_again(tmp_path, capsys):
    """A plan file cut short (as a version that rewrote it in place could leave it): the planner reads no plan from
    it, keeps the torn file beside it and says so, instead of failing every later build."""
    from thesis_lib.book import sizing

    path = tmp_path / "set-plan.json"
    path.write_text('[{"chosen": {"per_category": 2, "max_new')
    assert sizing._plans(path) == [] and not path.exists()
    assert (tmp_path / "set-plan.json.unreadable").read_text().startswith('[{"chosen"')
    assert "moved aside to set-plan.json.unreadable" in capsys.readouterr().err
    path.write_text('[{"chosen": {"per_category": 2}}]\n')
    assert sizing._plans(path) == [{"chosen": {"per_category": 2}}]
