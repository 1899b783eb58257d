"""Faults injected into a real ``thesis-lib bench`` process (tiny models, a fresh process each): SIGKILLed while it
generates a sample, while it writes a sample's line, and while it writes the summary. After each, ``--resume``
completes the run, and its samples are an uninterrupted run's: the same prompts, iterations and modes, each once,
with the same tokens. A book build killed mid-notebook completes on its next run. (The kernel build's and the JSON
writer's faults are in ``test_build_lock.py``, a second writer and an interrupted run in ``test_protocol.py``.)"""

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


#: a book build of chapter 4 alone: argv[1] the parameter file, argv[2] the run folder; prints the notebook's fate
_BOOK = """
import sys
from thesis_lib.book import execute
fates = execute.execute(sys.argv[1], only=["ch4_results"], overrides={"RUNS_DIR": sys.argv[2]}, progress=False)
print(fates["ch4_results"], flush=True)
"""


def _descendants(pid: int) -> set[int]:
    """The processes started by ``pid``, and theirs (from ``/proc``)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_book_build_killed_mid_notebook_completes_on_its_next_run(tmp_path):
    """A book build SIGKILLed while chapter 4's notebook is midway through its benchmark (the build dies; the
    notebook's kernel is orphaned): the kernel exits of itself, releasing the run folder; the notebook half run is
    not taken for done; the next build executes it to the end, resuming the run: the sample lines written before the
    kill are kept as they were, and every (iteration, prompt, mode) is measured once, as many as the plan."""
    import shutil
    import time

    from thesis_lib.book import execute

    params = tmp_path / f"killed-notebook-{os.getpid()}.yaml"  # its own build folder, whatever else runs
    # 3 prompts x 6 modes x 3 iterations of 48 tokens: the run outlasts by seconds the second in which the orphaned
    # kernel finds its parent gone (ipykernel polls once a second), on the fastest machine here too
    params.write_text("BASE: smoke\nITERATIONS: 3\nMAX_NEW_TOKENS: 48\n")
    shutil.rmtree(execute.build_dir(str(params)), ignore_errors=True)
    runs = tmp_path / "runs"

    def build() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _BOOK, str(params), str(runs)], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    builds, lines = [], []
    try:
        builds.append(proc := build())
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not lines:
            lines = [f for f in runs.glob("*-bench-*/samples.jsonl") if f.read_text().count("\n") >= 3]
            time.sleep(0.05)
        kernels = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert lines, f"the benchmark never reached its third sample: {proc.stderr.read()[-2000:]}"
        assert kernels, "the build had started no kernel"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(k) for k in kernels):
            time.sleep(0.2)
        assert not any(_alive(k) for k in kernels), "the orphaned kernel still runs 30 s after the build died"
        kept = lines[0].read_text()
        kept = kept[:kept.rfind("\n") + 1]  # what the next build finds: the run unfinished
        assert not (lines[0].parent / "summary.json").exists() and kept.count("\n") < 54, \
            f"the orphaned kernel finished the run ({kept.count(chr(10))} lines) before it exited"
        notebook = execute.build_dir(str(params)) / "notebooks" / "ch4_results.ipynb"
        assert not notebook.exists()
        builds.append(again := build())
        out, err = again.communicate(timeout=900)
        assert again.returncode == 0 and out.strip() == "executed", err[-3000:]
        samples = lines[0].read_text()
        assert samples.startswith(kept)
        rows = [json.loads(line) for line in samples.splitlines()]
        measured = [(r["iteration"], r["question_id"], r["mode"]) for r in rows]
        config = json.loads((lines[0].parent / "config.json").read_text())
        assert len({r["question_id"] for r in rows}) == config["prompts"]
        assert len(set(measured)) == len(measured) == config["prompts"] * config["iterations"] * len(config["modes"])
        assert notebook.exists()
    finally:
        for p in builds:  # a failed check leaves nothing running
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(execute.build_dir(str(params)).parent, ignore_errors=True)
