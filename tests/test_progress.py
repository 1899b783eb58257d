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
