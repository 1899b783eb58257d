"""Where the library keeps what it builds (:func:`cache_dir`: ``hf/``, ``gguf/``, ``flashhead/``, ``tiny/``,
``kernels/``, ``llama.cpp/``, ``prompts/``, token counts, the book's npm packages), one builder at a time in a
folder (:func:`build_lock`), files written whole or not at all (:func:`write_atomic`, :func:`write_json`), and file
checksums (:func:`sha256_file`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import ConfigError


def cache_dir() -> Path:
    """Root of the cache: ``$THESIS_LIB_CACHE`` or ``~/.cache/thesis-companion``."""
    root = os.environ.get("THESIS_LIB_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "thesis-companion"


def write_atomic(path: str | Path, data: str | bytes, *, replace: bool = True) -> Path:
    """``data`` written to ``path`` whole or not at all: into a temporary file beside it, forced to disk, then
    renamed over it, so a reader never sees half a file and a process killed midway leaves the old one. With
    ``replace`` False the file is linked to ``path`` instead, which raises FileExistsError where ``path`` exists:
    a file made there by someone else is never overwritten, however late it appeared."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: the name reserved first, then the file renamed onto it
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: str | Path, doc, indent: int = 1, *, replace: bool = True) -> Path:
    """A JSON document written by :func:`write_atomic`."""
    return write_atomic(path, json.dumps(doc, indent=indent) + "\n", replace=replace)


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _flock(f) -> bool | None:
    """Take ``f``'s OS lock without waiting: True, taken; False, another process holds it; None, no flock here."""
    import fcntl

    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


@contextlib.contextmanager
def build_lock(directory: Path, what: str, *, timeout: float = 1800.0, stale: tuple[str, ...] = (),
               owner_file: str = ".build-owner"):
    """The right to build ``what`` in ``directory``, one process at a time: an OS lock on its ``owner_file``,
    which the kernel releases when the holder dies however it dies (killed, out of memory, a closed terminal), with
    the holder's process and host written in it. A live holder is waited for up to ``timeout`` seconds, said on
    stderr every 15 s, then a :class:`ConfigError` names it. Files named in ``stale`` (torch's own build lock, which
    nothing times out) are removed once the lock is held: only a builder that died can have left them. On a
    filesystem without ``flock`` the build goes ahead unlocked, removing nothing (as torch alone would); where
    ``flock`` holds only within one host (some NFS mounts), a cache shared by several hosts is not guarded."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / owner_file, "a+") as f:
        start = said = time.monotonic()
        while (held := _flock(f)) is False:
            f.seek(0)
            owner, waited = f.read().strip() or "another process", time.monotonic() - start
            if waited >= timeout:
                raise ConfigError(f"{what}: {owner} holds it (waited {waited:.0f} s); wait for it or stop it.")
            if time.monotonic() - said >= 15:
                print(f"{what}: waiting for {owner}, which is building it ({waited:.0f} s)", file=sys.stderr)
                said = time.monotonic()
            time.sleep(0.2)
        if held is None:
            print(f"{what}: {directory} cannot be locked here; going ahead without a lock", file=sys.stderr)
            yield
            return
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}")
        f.flush()
        for name in stale:
            (directory / name).unlink(missing_ok=True)
        yield  # the lock goes with the file's closing, however the build ends
