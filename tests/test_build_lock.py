"""A build that can be killed: one builder at a time per folder, a dead builder's locks taken over, a live one
waited for with a message and a time limit (``thesis_lib.models.cache.build_lock``); the weight-only kernel's build
survives a SIGKILL mid-compile and torch's own lock left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thesis_lib.errors import ConfigError
from thesis_lib.models.cache import build_lock

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "from thesis_lib.models import weight_only; weight_only.kernel(); print('built')"


def _python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


def _kernel_builds_here() -> bool:
    from thesis_lib.models import weight_only

    return weight_only.available()


def test_a_live_holder_is_named_then_a_killed_one_is_taken_over(tmp_path):
    holder = _python(f"from thesis_lib.models.cache import build_lock\nfrom pathlib import Path\nimport time\n"
                     f"with build_lock(Path({str(tmp_path)!r}), 'x'):\n    print('held', flush=True); time.sleep(60)")
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"process {holder.pid} on .* holds it \\(waited 1 s\\)"):
            with build_lock(tmp_path, "the thing", timeout=1):
                pass
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    (tmp_path / "lock").write_text("")  # what a killed torch build leaves
    t0 = time.monotonic()
    with build_lock(tmp_path, "the thing", timeout=5, stale=("lock",)):
        assert not (tmp_path / "lock").exists()
        assert (tmp_path / ".build-owner").read_text().startswith(f"process {os.getpid()} on ")
    assert time.monotonic() - t0 < 2


def test_a_filesystem_without_flock_builds_unlocked_and_removes_nothing(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_flock(f, how):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    (tmp_path / "lock").write_text("")  # perhaps a live builder's, which nothing here can tell
    with build_lock(tmp_path, "the thing", stale=("lock",)):
        assert (tmp_path / "lock").exists()
    assert "cannot be locked here; going ahead without a lock" in capsys.readouterr().err


def test_the_kernel_loads_past_a_lock_a_killed_build_left():
    """torch's loader waits forever while its ``lock`` file exists; the kernel's build removes it once it holds the
    folder's own lock (the built kernel is only loaded: seconds)."""
    if not _kernel_builds_here():
        pytest.skip("the weight-only kernel cannot be built here")
    from thesis_lib.models import weight_only

    planted = weight_only.build_dir() / "lock"
    planted.write_text("")
    proc = _python(KERNEL)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        planted.unlink(missing_ok=True)
    assert proc.returncode == 0 and out.strip() == "built", err


def test_a_build_killed_mid_compile_leaves_nothing_that_stops_the_next(tmp_path):
    """A build is killed (SIGKILL, the compiler with it) once torch's lock exists and the compiler runs; the next
    build completes. The cache starts as the built kernel's folder without its library and its largest object, so
    each build compiles that one source and links (the whole kernel would take minutes on two cores)."""
    import shutil

    if not _kernel_builds_here():
        pytest.skip("the weight-only kernel cannot be built here")
    from thesis_lib.models import weight_only

    weight_only.kernel()
    built = weight_only.build_dir()
    folder = tmp_path / "kernels" / built.name
    shutil.copytree(built, folder)  # the times kept: ninja finds the other objects up to date
    largest = max(folder.glob("*.o"), key=lambda f: f.stat().st_size)
    for f in (largest, *folder.glob("*.so")):
        f.unlink()
    env = {"THESIS_LIB_CACHE": str(tmp_path)}
    first = _python(KERNEL, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "lock").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first build ended before it was killed"
            time.sleep(0.2)
        time.sleep(2)  # the compiler is running
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert (folder / "lock").exists(), "torch's lock should be left behind by the kill"
    assert not largest.exists() and not list(folder.glob("*.so")), "the first build finished before it was killed"
    second = _python(KERNEL, env=env)
    try:
        out, err = second.communicate(timeout=900)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 0 and out.strip() == "built", err
    assert largest.exists() and list(folder.glob("*.so"))


def test_a_writer_killed_before_its_rename_leaves_the_old_file_whole(tmp_path):
    """The writer is killed (SIGKILL) with the new document fully in its temporary file but not yet renamed (its
    fsync held): the old document is what a reader finds, and the next write replaces it."""
    from thesis_lib.models.cache import write_json

    path = tmp_path / "plan.json"
    write_json(path, {"plan": "old"})
    writer = _python("import os, time\nfrom thesis_lib.models import cache\n"
                     "os.fsync = lambda fd: (print('written', flush=True), time.sleep(60))\n"
                     f"cache.write_json({str(path)!r}, {{'plan': 'new', 'rows': list(range(100000))}})")
    assert writer.stdout.readline().strip() == "written"
    os.killpg(writer.pid, signal.SIGKILL)
    writer.wait()
    assert path.read_text() == '{\n "plan": "old"\n}\n'
    write_json(path, {"plan": "next"})
    assert path.read_text() == '{\n "plan": "next"\n}\n'


def test_a_write_that_fails_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    from thesis_lib.models import cache

    path = tmp_path / "doc.json"
    cache.write_atomic(path, "old")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        cache.write_atomic(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["doc.json"]
