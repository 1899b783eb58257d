"""Progress of long work: where it is shown, and what a book build's terminal learns from its notebook kernels.

Every long loop of the library shows a bar through :func:`tqdm`. Run by hand it is the usual ``tqdm.auto`` bar
(a widget in Jupyter, text in a terminal). While ``thesis-lib book`` executes the chapters, the notebook kernels
get ``THESIS_LIB_PROGRESS`` (a file): bars and :func:`note` lines go to that file instead of into the
notebooks (so no progress output reaches the rendered pages), the build's terminal shows them as they come
(:class:`Follower`), and each kernel writes its peak memory there when it exits. This module is shared by all
layers, like :mod:`thesis_lib.errors`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

ENV = "THESIS_LIB_PROGRESS"
_STREAM = None
_LIBRARY_STATE = threading.RLock()
#: How often a bar still running is shown again where the terminal cannot redraw a line (a pipe, a log file), and
#: work without a bar says it goes on: no silence of a build's output lasts 15 s.
PIPE_EVERY_S = 10.0


class _KnownNoise:
    """A logging filter for two warnings nobody using this project can act on: torchao failing to load its CUDA
    kernels into a torch built without CUDA, and torch deprecating a call torchao makes at import."""

    def filter(self, record) -> bool:
        msg = record.getMessage()
        if record.name == "torchao" and msg.startswith("Failed to load") and "/torchao/_C" in msg:
            import torch

            return torch.version.cuda is not None  # a CUDA build failing to load them is worth hearing about
        return not (record.name == "torch.utils._pytree" and "is an Enum subclass and is now natively" in msg)


def quiet_known_noise() -> None:
    """Install :class:`_KnownNoise` on the two loggers it concerns (before they log: at the library's import)."""
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _KnownNoise) for f in logger.filters):
            logger.addFilter(_KnownNoise())


def _stream():
    global _STREAM
    path = os.environ.get(ENV)
    if not path:
        return None
    if _STREAM is None:
        _STREAM = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - kept open for the process
    return _STREAM


class _Lines:
    """A stream for a bar where lines cannot be redrawn (a pipe, a log file): each redraw becomes a line."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.out.write(part + "\n")

    def flush(self) -> None:
        self.out.flush()


def tqdm(*args, **kwargs):
    """A progress bar: ``tqdm.auto``'s on a terminal or in Jupyter; where stderr is a pipe or a file, a line every
    :data:`PIPE_EVERY_S` seconds; inside a book build's kernel, a text bar into the progress file."""
    stream = _stream()
    from tqdm import tqdm as text

    if stream is None:
        err = kwargs.get("file") or sys.stderr
        if getattr(err, "isatty", lambda: False)() or "ipykernel" in sys.modules:
            from tqdm.auto import tqdm as auto

            return auto(*args, **kwargs)
        kwargs.update(file=_Lines(err), ascii=True, dynamic_ncols=False, ncols=100)
        kwargs["mininterval"] = max(kwargs.get("mininterval", 0.0), PIPE_EVERY_S)
        return text(*args, **kwargs)

    kwargs.update(file=stream, ascii=True, dynamic_ncols=False, ncols=100)
    kwargs.setdefault("mininterval", 2.0)
    return text(*args, **kwargs)


class heartbeat:
    """``with heartbeat(what):`` a line every :data:`PIPE_EVERY_S` seconds on stderr saying ``what`` goes on, for work
    without a bar of its own (a compile, a conversion, a load); in a book build's kernel the build's terminal says it
    (:class:`Follower`)."""

    def __init__(self, what: str):
        self.what, self.done = what, None

    def __enter__(self):
        if _stream() is not None:
            return self
        self.done, t0 = threading.Event(), time.monotonic()

        def beat():
            while not self.done.wait(PIPE_EVERY_S):
                print(f"  {self.what}: still working ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        self.thread = threading.Thread(target=beat, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.done is not None:  # no line after the work has ended
            self.done.set()
            self.thread.join()


@contextlib.contextmanager
def without_library_bars(warnings: bool = True):
    """transformers' bars off while a model loads from local files ("Loading weights", and its GGUF reader's own
    "Converting and de-quantizing" bar): the load is one step of ours, said by our own lines (:class:`heartbeat`).
    ``warnings=False`` silences its warnings too (a conversion's: how a GGUF model would run, which it never does)."""
    from functools import partial

    from tqdm import tqdm as plain
    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging

    with _LIBRARY_STATE:  # one load at a time changes and restores transformers' process-wide settings
        on, saved, verbosity = logging.is_progress_bar_enabled(), gguf.tqdm, logging.get_verbosity()
        logging.disable_progress_bar()
        if not warnings:
            logging.set_verbosity_error()
        gguf.tqdm = partial(plain, disable=True)
        try:
            yield
        finally:
            gguf.tqdm = saved
            logging.set_verbosity(verbosity)
            if on:
                logging.enable_progress_bar()


def note(message: str) -> None:
    """A line of progress (a finished run folder, a reused document): to the build's terminal, or to stderr."""
    stream = _stream()
    print(f"  {message}", file=stream or sys.stderr, flush=True)


def peak_rss_mib() -> float | None:
    """This process' peak resident memory so far (MiB; ``VmHWM``), or None where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _report_peak() -> None:
    stream = _stream()
    peak = peak_rss_mib()
    if stream is not None and peak is not None:
        print(f"\n#peak_rss_mib {os.getpid()} {peak:.0f}", file=stream, flush=True)


if os.environ.get(ENV):
    atexit.register(_report_peak)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' and the hub's bars stay out too


class Follower:
    """The build's side: shows what the kernels write to the progress file, and collects their peak memory."""

    def __init__(self, path: Path, out=sys.stderr, pipe_every: float = PIPE_EVERY_S):
        self.path, self.out, self.pos, self.peaks, self.partial = Path(path), out, 0, [], ""
        self.pipe_every, self.shown_at, self.shown = pipe_every, time.monotonic(), ""
        self.active_at, self.started, self.label, self.planned = self.shown_at, self.shown_at, "working", None
        self.path.write_text("")

    def poll(self) -> None:
        """Show what arrived since the last poll: each finished line once (a bar's last state); the bar still
        running is redrawn in place on a terminal, and elsewhere shown as a line of its own every
        ``pipe_every`` seconds when it has moved; after 1.25 of those with nothing to show (12.5 s), a line says
        the work goes on. Peak-memory records are kept, not shown."""
        with open(self.path, encoding="utf-8", newline="") as f:  # keep the bars' \r as written
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        self.partial += data
        *lines, self.partial = self.partial.split("\n")
        tty = getattr(self.out, "isatty", lambda: False)()
        for line in lines:
            last = line.split("\r")[-1]
            if last.startswith("#peak_rss_mib "):
                self.peaks.append(float(last.split()[2]))
            elif last.strip():
                self.out.write(("\r\033[K" if tty else "") + last + "\n")
                self.shown_at = self.active_at = time.monotonic()
        running = self.partial.split("\r")[-1][:150]
        now = time.monotonic()
        if tty and running.strip():
            self.out.write("\r\033[K" + running)
            if running != self.shown:
                self.shown, self.active_at = running, now
        elif running.strip() and running != self.shown and now - self.shown_at >= self.pipe_every:
            self.out.write(running + "\n")
            self.shown_at = self.active_at = now
            self.shown = running
        if now - self.active_at >= 1.25 * self.pipe_every:
            of = f" of about {self.planned:.0f} planned" if self.planned else ""
            self.out.write(("\r\033[K" if tty else "") + f"  {self.label}: still working ({now - self.started:.0f} s{of})\n")
            self.active_at = now
        self.out.flush()

    def follow(self, stop, interval: float = 1.0, label: str = "working", planned: float | None = None) -> None:
        """Poll until ``stop()`` is true (run in a thread beside the notebook's execution), naming the work
        ``label`` in the lines that say it goes on, beside the seconds ``planned`` for it where a plan said."""
        self.label, self.started, self.planned = label, time.monotonic(), planned
        self.active_at = self.started
        while not stop():
            self.poll()
            time.sleep(interval)
        self.poll()
