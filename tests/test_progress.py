"""What a build's terminal shows (:mod:`thesis_lib.progress`): bars and lines from the notebook kernels, a running
bar repeated at intervals where the terminal cannot redraw it, and no warning nobody can act on."""

from __future__ import annotations

import io
import subprocess
import sys

from thesis_lib import progress


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_a_running_bar_reaches_a_pipe_at_intervals_and_finished_lines_once(tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = _Pipe()
    f = progress.Follower(tmp_path / "progress.log", out=out, pipe_every=20.0)
    def step(text: str, seconds: float):
        with f.path.open("a", encoding="utf-8") as file:
            file.write(text)
        now[0] += seconds
        f.poll()

    step("  run folder x: measuring\n", 1)  # a finished line: shown at once
    step("x:  10%|#  | 1/10 [00:05<00:45]", 5)  # a bar in flight: not yet (5 s since the last line)
    step("\rx:  20%|## | 2/10 [00:10<00:40]", 16)  # 21 s since the last line: shown
    step("\rx:  30%|###| 3/10 [00:15<00:35]", 5)  # 5 s since: not yet
    now[0] += 30
    f.poll()  # 35 s since and moved: shown; nothing new after it, so a second poll adds nothing
    f.poll()
    step("\rx: 100%|###| 10/10 [00:50<00:00]\n#peak_rss_mib 7 512\n", 1)  # the bar's end; a memory record
    assert out.getvalue().splitlines() == ["  run folder x: measuring", "x:  20%|## | 2/10 [00:10<00:40]",
                                           "x:  30%|###| 3/10 [00:15<00:35]", "x: 100%|###| 10/10 [00:50<00:00]"]
    assert f.peaks == [512.0]


def test_a_terminal_redraws_the_running_bar_in_place(tmp_path):
    class Tty(_Pipe):
        def isatty(self) -> bool:
            return True

    out = Tty()
    f = progress.Follower(tmp_path / "progress.log", out=out)
    f.path.write_text("x:  10%|#  | 1/10\rx:  20%|## | 2/10")
    f.poll()
    assert out.getvalue() == "\r\033[Kx:  20%|## | 2/10"


def _stderr_of(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr


def test_torchaos_import_noise_is_filtered_and_only_that():
    import torch

    plain = _stderr_of("import torchao")
    quiet = _stderr_of("import thesis_lib, torchao, logging; logging.getLogger('torchao').warning('kept')")
    if torch.version.cuda is None:  # a CPU build: torchao's CUDA kernels cannot load, and it says so
        assert "Failed to load" in plain
    assert "Failed to load" not in quiet and "is an Enum subclass" not in quiet
    assert "kept" in quiet  # other warnings of the same loggers still show


def test_notebook_kernels_talk_over_local_sockets_and_do_not_warn(tmp_path):
    """The book's kernels use IPC sockets (no TCP port, so no warning about unencrypted TCP); a kernel on
    papermill's default transport does warn, which is what the manager removes."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    run = ("import papermill, sys; from pathlib import Path; from thesis_lib.book import execute; "
           "kw = {'kernel_manager_class': execute.kernel_manager(Path(sys.argv[2]))} if sys.argv[3] == 'ipc' else {}; "
           "papermill.execute_notebook(sys.argv[1] + '/in.ipynb', sys.argv[1] + '/out.ipynb', kernel_name='python3', "
           "progress_bar=False, **kw)")
    stderr = {}
    for how in ("ipc", "tcp"):
        proc = subprocess.run([sys.executable, "-c", run, str(tmp_path), str(tmp_path / "s"), how],
                              capture_output=True, text=True, check=True)
        stderr[how] = proc.stderr
        assert "42" in (tmp_path / "out.ipynb").read_text()
    assert "without encryption" in stderr["tcp"] and "without encryption" not in stderr["ipc"]


def test_a_bar_on_a_pipe_prints_lines_at_intervals(monkeypatch):
    """Outside a notebook and a terminal (CI, a log file) each redraw is a line of its own, at most one per
    interval, the last state included."""
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    for every, want in ((60.0, ["0%", "100%"]), (0.0, ["0%", "17%", "33%", "50%", "67%", "83%", "100%"])):
        monkeypatch.setattr(progress, "PIPE_EVERY_S", every)
        out = _Pipe()
        for _ in progress.tqdm(range(6), desc="work", file=out, miniters=1):
            pass
        shown = [line.split("|")[0].split()[-1] for line in out.getvalue().splitlines()]
        shown = [x for i, x in enumerate(shown) if i == 0 or x != shown[i - 1]]  # closing repeats the last state
        assert shown == want and "\r" not in out.getvalue()


def test_silent_work_still_says_it_goes_on(tmp_path, monkeypatch):
    """A notebook step that writes nothing for 25 s (loading, a computation without a bar) gets a line naming the
    notebook; a step that keeps writing gets none."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = _Pipe()
    f = progress.Follower(tmp_path / "progress.log", out=out, pipe_every=20.0)
    f.label, f.started, f.active_at = "ch4_results", 0.0, 0.0
    for t in (10, 20, 24):
        now[0] = t
        f.poll()
    assert out.getvalue() == ""
    now[0] = 26
    f.poll()
    assert out.getvalue() == "  ch4_results: still working (26 s)\n"
    now[0] = 45
    f.poll()  # 19 s since that line: quiet again
    assert out.getvalue().count("\n") == 1


def test_a_heartbeat_speaks_on_a_pipe(monkeypatch, capsys):
    import time

    monkeypatch.setattr(progress, "PIPE_EVERY_S", 0.05)
    t0 = time.monotonic()
    with progress.heartbeat("converting x"):
        time.sleep(0.18)
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    # one line per interval while it lasts (none more than the time allows), then silence
    assert err.startswith("  converting x: still working (0 s)") and 1 <= err.count("\n") <= elapsed / 0.05 + 1
    time.sleep(0.12)
    assert capsys.readouterr().err == ""


def test_a_heartbeat_speaks_on_a_terminal_too_but_not_inside_a_book_kernel(monkeypatch, tmp_path):
    """Work without a bar of its own (a compile) says it goes on on a terminal as on a pipe; inside a book build's
    kernel it stays quiet, since the build's terminal says it (the Follower)."""
    import time

    class _Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(progress, "PIPE_EVERY_S", 0.05)
    for in_kernel in (False, True):
        if in_kernel:
            monkeypatch.setattr(progress, "_STREAM", None)  # opened afresh for this file, and reset after
            monkeypatch.setenv(progress.ENV, str(tmp_path / "progress.log"))
        term = _Terminal()
        monkeypatch.setattr(progress.sys, "stderr", term)
        with progress.heartbeat("compiling"):
            time.sleep(0.15)
        assert ("compiling: still working" in term.getvalue()) != in_kernel
