"""Sweeps: a grid expands to named runs, the local executor runs them and resumes, failures are recorded and
resubmitted, and (where Slurm can run) a smoke sweep goes through a real one-node Slurm cluster on localhost:
every run finishes as a job whose id its run folder records, a killed job is reported with its log and
resubmitted, and the runs generate exactly what the same sweep run locally generates."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from thesis_lib.bench import protocol
from thesis_lib.bench.runs import load_run
from thesis_lib.errors import ConfigError
from thesis_lib.sweep import driver, grid, ledger, local, slurm, table

import slurm_cluster as cluster

#: Tiny models, two prompts, two modes: a run takes seconds.
BASE = {"target": "tiny:target", "draft": "tiny:draft", "modes": ["baseline", "flash_deferred"], "prompts": 2,
        "per_category": 1, "max_new_tokens": 12, "warmup": 0, "costs": False, "clusters": 17, "kmeans_iterations": 4,
        "flash_path": "eager", "threads": 1}
GRID = {"k": [1, 3], "probes": [1, 8]}


#: A sample's fields that say what was generated (not when, where or how fast).
CONTENT = ("iteration", "question_id", "mode", "k", "tokens", "new_tokens", "first_emit", "stopped_by", "drafted",
           "accepted", "rounds", "emitted", "verify_calls", "append_calls", "matches_baseline", "accepted_per_round")


def _submissions(home, run: str) -> list[str]:
    """Every job id the ledger says was submitted for a run, oldest first."""
    return [e["job_id"] for e in ledger.entries(home) if e["event"] == "submitted" and e["run"] == run]


def _content(run) -> list[dict]:
    rows = [{k: r.get(k) for k in CONTENT} for r in run.samples]
    return sorted(rows, key=lambda r: (r["iteration"] or 0, str(r["question_id"]), r["mode"]))


def _compare(a: grid.Sweep, b: grid.Sweep) -> dict[str, list[str]]:
    """Two sweeps of one grid (Slurm and local) compared by what their runs generated, which does not depend on
    where or how fast they ran: per run name of ``a``, what differs from ``b``'s run of that name."""
    out = {}
    for name in a.names:
        if name not in b.names:
            out[name] = [f"{b.name} has no run {name}"]
            continue
        ca, cb = _content(load_run(a.path(name))), _content(load_run(b.path(name)))
        diffs = [] if len(ca) == len(cb) else [f"{len(ca)} samples against {len(cb)}"]
        diffs += [f"{x['question_id']} {x['mode']}: {', '.join(k for k in CONTENT if x[k] != y[k])} differ"
                  for x, y in zip(ca, cb) if x != y]
        out[name] = diffs
    return out


def test_a_grid_expands_to_one_named_run_per_point(tmp_path):
    sw = grid.from_grid("kp", BASE, GRID, tmp_path)
    assert sw.names == ["k1-probes1", "k1-probes8", "k3-probes1", "k3-probes8"]
    assert [(c.k, c.probes) for c in sw.configs] == [(1, 1), (1, 8), (3, 1), (3, 8)]
    assert all(c.out == str(tmp_path / "kp") and c.max_new_tokens == 12 for c in sw.configs)
    assert sw.points["k3-probes1"] == {"k": 3, "probes": 1}
    models = grid.from_grid("m", BASE, {"draft": ["tiny:draft", "tiny:target"]}, tmp_path)
    assert models.names == ["draft-tiny_draft", "draft-tiny_target"]


@pytest.mark.parametrize("base, values, message", [
    (BASE, {"kk": [1]}, "Unknown benchmark parameter"),
    (BASE, {"k": []}, "non-empty list"),
    (BASE, {}, "grid is empty"),
    ({**BASE, "out": "elsewhere"}, {"k": [1]}, "may not set out"),
])
def test_a_bad_grid_is_refused_before_anything_is_written(tmp_path, base, values, message):
    with pytest.raises(ConfigError, match=message):
        grid.from_grid("bad", base, values, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_run_out_of_range_is_refused_before_any_job(tmp_path):
    sw = grid.from_grid("bad", BASE, {"probes": [1, 99]}, tmp_path)
    with pytest.raises(ConfigError, match="probes99"):
        driver.run_sweep(sw, local.LocalExecutor(progress=False), progress=False)
    assert not (tmp_path / "bad").exists()


def test_another_grid_under_the_same_name_is_refused(tmp_path):
    grid.from_grid("kp", BASE, GRID, tmp_path).save()
    with pytest.raises(ConfigError, match="another sweep"):
        grid.from_grid("kp", BASE, {"k": [1, 2]}, tmp_path).save()
    assert grid.from_grid("kp", BASE, GRID, tmp_path).save() == "resumed"


def _files(sw) -> dict:
    return {p: p.read_bytes() for c in sw.configs for p in sorted(c.path.iterdir())}


def test_local_sweep_runs_resumes_and_tabulates(tmp_path):
    sw = grid.from_grid("kp", BASE, GRID, tmp_path)
    states = driver.run_sweep(sw, local.LocalExecutor(progress=False), progress=False)
    assert [s.state for s in states] == [ledger.DONE] * 4
    before = _files(sw)
    again = driver.run_sweep(grid.from_grid("kp", BASE, GRID, tmp_path), local.LocalExecutor(progress=False),
                             progress=False)
    assert [s.state for s in again] == [ledger.DONE] * 4
    assert _files(sw) == before  # nothing redone or rewritten
    assert len([e for e in ledger.entries(sw.home) if e["event"] == "submitted"]) == 4
    df = table.summary(sw.home)
    assert len(df) == 8 and set(df["mode"]) == {"baseline", "flash_deferred"}
    flash = df[df["mode"] == "flash_deferred"].set_index("run")
    assert (flash["lossless"] == "2/2").all()
    assert flash.loc["k3-probes8", "k"] == 3 and flash.loc["k3-probes8", "probes"] == 8
    # the comparison the Slurm test relies on sees a difference in what was generated
    shorter = grid.from_grid("kp", {**BASE, "max_new_tokens": 8}, GRID, tmp_path / "shorter")
    driver.run_sweep(shorter, local.LocalExecutor(progress=False), progress=False)
    diffs = _compare(sw, shorter)
    assert all(any("tokens" in d for d in diffs[name]) for name in sw.names), diffs
    assert _compare(sw, grid.open_sweep(sw.home)) == {name: [] for name in sw.names}


def test_a_failed_run_is_reported_and_only_it_is_resubmitted(tmp_path, monkeypatch):
    sw = grid.from_grid("kp", BASE, {"k": [1, 3]}, tmp_path)
    real = protocol.run

    def flaky(cfg, **kw):
        if cfg.k == 3:
            raise RuntimeError("node lost")
        return real(cfg, **kw)

    monkeypatch.setattr(protocol, "run", flaky)
    states = driver.run_sweep(sw, local.LocalExecutor(progress=False), progress=False)
    assert [(s.state, s.detail) for s in states] == [(ledger.DONE, ""), (ledger.FAILED, "RuntimeError: node lost")]
    assert "k3: failed" in states[1].describe()
    monkeypatch.setattr(protocol, "run", real)
    states = driver.run_sweep(grid.from_grid("kp", BASE, {"k": [1, 3]}, tmp_path), local.LocalExecutor(progress=False),
                              progress=False)
    assert [s.state for s in states] == [ledger.DONE, ledger.DONE]
    assert len(_submissions(sw.home, "k1")) == 1 and len(_submissions(sw.home, "k3")) == 2


def test_the_command_line_runs_a_sweep_from_a_file_and_flags(tmp_path, capsys):
    import yaml

    from thesis_lib import cli

    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"name": "kp", "set": BASE, "grid": {"k": [1, 3]}, "out": str(tmp_path)}))
    assert cli.main(["sweep", "run", "--file", str(spec), "--grid", "probes=[1, 8]"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in ("k1-probes1", "k1-probes8", "k3-probes1", "k3-probes8"))
    assert cli.main(["sweep", "status", str(tmp_path / "kp")]) == 0
    assert capsys.readouterr().out.strip().endswith("done 4")
    bad = ["sweep", "run", "--name", "bad", "--out", str(tmp_path), "--grid", "k=0,1"]
    bad += [f"--set={k}={json.dumps(v)}" for k, v in BASE.items()]
    assert cli.main(bad) == 2
    assert "K must be an integer >= 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_a_look_without_the_scheduler_concludes_nothing(tmp_path, monkeypatch):
    """A job the ledger has no end for is 'unknown' when no scheduler is asked, or when it does not answer: not
    failed, not written down, not resubmitted; a torn ledger line is skipped."""
    sw = grid.from_grid("kp", BASE, {"k": [1]}, tmp_path)
    sw.save()
    ledger.submitted(sw.home, "k1", "slurm", "77", None)
    assert [s.state for s in ledger.states(sw)] == [ledger.UNKNOWN]
    assert list(table.summary(sw)["state"]) == [ledger.UNKNOWN]
    with open(sw.home / ledger.LEDGER, "a", encoding="utf-8") as f:
        f.write('{"event": "ended", "run": "k1", "job_')  # a crash while writing
    assert [s.state for s in ledger.states(sw)] == [ledger.UNKNOWN]
    assert [e["event"] for e in ledger.entries(sw.home)] == ["submitted"]
    bin_dir = tmp_path / "bin"  # a controller that does not answer, as squeue reports it
    bin_dir.mkdir()
    fake = bin_dir / "squeue"
    fake.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    states = ledger.states(sw, slurm.SlurmExecutor())
    assert [s.state for s in states] == [ledger.UNKNOWN] and "Unable to contact" in states[0].detail
    assert [e["event"] for e in ledger.entries(sw.home)] == ["submitted"]


def test_slurm_options_follow_the_runs_devices():
    two = protocol.BenchConfig(device="cuda:0", draft_device="cuda:1")
    assert slurm.gpus_of(two) == 2 and slurm.gpus_of(protocol.BenchConfig(device="cuda:0")) == 1
    assert slurm.gpus_of(protocol.BenchConfig()) == 0
    opts = slurm.Resources(partition="gpu").options(two)
    assert "--gres=gpu:2" in opts and "--mem=64G" in opts and "--partition=gpu" in opts
    cpu = slurm.Resources().options(protocol.BenchConfig(threads=1))
    assert "--cpus-per-task=1" in cpu and not any(o.startswith(("--gres", "--mem")) for o in cpu)


# --- a real one-node Slurm cluster on localhost ---------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    why = cluster.unavailable()
    if why:
        pytest.skip(why)
    c = cluster.LocalCluster(tmp_path_factory.mktemp("slurm"), cpus=os.cpu_count())
    try:
        c.start()
    except BaseException:
        c.stop()  # what did start stops here, not after the tests
        raise
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(c.environment())
    yield c
    c.stop()
    if saved is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = saved


def _wait_running(sw, executor, timeout=60.0) -> ledger.RunState:
    """A job of the sweep that Slurm reports running and whose script has begun (its first line is in its log:
    squeue can say RUNNING before the batch script has printed anything)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [s for s in ledger.states(sw, executor) if s.state == ledger.RUNNING and s.log is not None
                   and s.log.is_file() and f"job {s.job_id} on" in s.log.read_text()]
        if running:
            return running[0]
        time.sleep(0.1)
    raise AssertionError("no job of the sweep was seen running")


def test_a_smoke_sweep_through_a_real_slurm_cluster(slurm_cluster, tmp_path):
    executor = slurm.SlurmExecutor(slurm.Resources(time="00:10:00"))
    sw = grid.from_grid("kp", BASE, GRID, tmp_path / "slurm")
    driver.run_sweep(sw, executor, wait=False, progress=False)
    victim = _wait_running(sw, executor)
    executor.cancel(victim.job_id)
    states = driver.watch(sw, executor, poll=0.5, progress=False)
    by_run = {s.run: s for s in states}
    assert by_run[victim.run].state == ledger.CANCELLED, slurm_cluster.log_tail()
    assert "CANCELLED" in by_run[victim.run].detail
    assert f"job {victim.job_id} on" in by_run[victim.run].log.read_text()  # the job's own log, named in the report
    assert victim.run in driver.report(states)
    others = [s for s in states if s.run != victim.run]
    assert all(s.state == ledger.DONE for s in others), [s.describe() for s in others]

    states = driver.run_sweep(grid.from_grid("kp", BASE, GRID, tmp_path / "slurm"), executor, poll=0.5,
                              progress=False)  # the same command again: only the cancelled run is resubmitted
    assert all(s.state == ledger.DONE for s in states), [s.describe() for s in states]
    for s in states:
        env = json.loads((sw.config(s.run).path / "environment.json").read_text())
        jobs = [env.get("scheduler", {}).get("job_id")] + [r.get("scheduler", {}).get("job_id")
                                                            for r in env.get("resumed", [])]
        assert s.job_id in jobs and jobs[0] is not None, (s.run, jobs)
        assert _submissions(sw.home, s.run) == ([victim.job_id, s.job_id] if s.run == victim.run else [s.job_id])
    deadline = time.monotonic() + 30  # a done run's job may still be exiting: then the queue empties, nothing stays
    while (left := subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, check=True).stdout.strip()):
        assert time.monotonic() < deadline, left
        time.sleep(0.5)

    here = grid.from_grid("kp", BASE, GRID, tmp_path / "local")
    driver.run_sweep(here, local.LocalExecutor(progress=False), progress=False)
    assert _compare(sw, here) == {name: [] for name in sw.names}


def test_the_books_runs_go_through_slurm_before_its_notebooks(slurm_cluster, tmp_path):
    """make book EXECUTOR=slurm's first step on the smoke set: its five planned runs finish as Slurm jobs in the
    book's run folder (tests/test_book.py checks that these are the very runs its notebooks obtain)."""
    from thesis_lib.book import scheduled

    overrides = {"RUNS_DIR": str(tmp_path / "runs")}
    executor = slurm.SlurmExecutor(slurm.Resources(cpus=1, time="00:10:00"))
    states = scheduled.run_on("smoke", executor, poll=0.5, progress=False, overrides=overrides)
    assert [s.state for s in states] == [ledger.DONE] * 5, [s.describe() for s in states]
    for cfg in scheduled.book_sweep("smoke", overrides).configs:
        assert cfg.path.parent == tmp_path / "runs"
        env = json.loads((cfg.path / "environment.json").read_text())
        assert env["scheduler"]["job_id"] == ledger.jobs(scheduled.book_sweep("smoke", overrides).home)[cfg.name]["job_id"]
