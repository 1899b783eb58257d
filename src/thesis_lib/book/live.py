"""The live explorer as a web app (``thesis-lib explore``): ``notebooks/live_explorer.ipynb`` parameterised with a
set's values (:func:`prepare`) and served by Voila on localhost (:func:`start`, :func:`stop`, :func:`serve`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import ConfigError
from .execute import NOTEBOOK_DIR, build_dir, notebook_parameters
from .params import ROOT, Params, set_label
from .sizing import values_of

APP = "live_explorer"
#: the app's Voila template (Voila's lab template without its stylesheets from a CDN), found through JUPYTER_PATH
TEMPLATE = "thesis"
JUPYTER_DATA = Path(__file__).resolve().parents[1] / "data" / "jupyter"


def prepare(set_name: str, overrides: dict | None = None) -> Path:
    """Write the app notebook for ``set_name`` (with ``overrides``) and return its path; bad input fails here."""
    import nbformat
    from papermill.parameterize import parameterize_notebook

    values = values_of(set_name, overrides)
    Params.from_namespace(values).check()
    declared = notebook_parameters(APP)
    given = {k: v for k, v in values.items() if k in declared}
    nb = nbformat.read(str(NOTEBOOK_DIR / f"{APP}.ipynb"), as_version=4)
    for cell in nb.cells:  # papermill's parameterisation reads every cell's tags
        cell.metadata.setdefault("tags", [])
    nb.metadata.setdefault("papermill", {})
    nb = parameterize_notebook(nb, given, kernel_name="python3", language="python")
    out = build_dir(set_name).parent / "explore"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{APP}.ipynb"
    nbformat.write(nb, str(path))
    return path


def voila_path() -> str:
    exe = Path(sys.executable).with_name("voila")
    if exe.exists():
        return str(exe)
    found = shutil.which("voila")
    if found is None:
        raise ConfigError("Voila is not installed: pip install -e '.[book]' (voila 0.5.13; `make explore` does it).")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(notebook: Path, *, port: int | None = None, log: Path | None = None, env: dict | None = None,
          timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start Voila on ``notebook`` (localhost only, no browser); return the process and the URL once it answers."""
    port = port or free_port()
    cmd = [voila_path(), str(notebook), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
           "--show_tracebacks=True", f"--Voila.root_dir={ROOT}", f"--template={TEMPLATE}", "--theme=light"]
    env = {**(env or {}), "JUPYTER_PATH": os.pathsep.join(filter(None, [str(JUPYTER_DATA), os.environ.get("JUPYTER_PATH")]))}
    out = open(log, "w", encoding="utf-8") if log else subprocess.DEVNULL  # noqa: SIM115 - the server's lifetime
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, **env}, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise ConfigError(f"Voila exited with {proc.returncode}" + (f"; its log: {log}" if log else ""))
        try:  # any HTTP answer means the server is up (the app's own page would start a kernel)
            with urllib.request.urlopen(url + "favicon.ico", timeout=2):
                return proc, url
        except urllib.error.HTTPError:
            return proc, url
        except OSError:
            time.sleep(0.3)
    stop(proc)
    raise ConfigError(f"Voila did not answer on {url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and the kernels it started (its own process group)."""
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def serve(set_name: str, *, port: int = 8866, overrides: dict | None = None) -> int:
    """``thesis-lib explore``: prepare, start, print the address, run until interrupted."""
    path = prepare(set_name, overrides)
    proc, url = start(path, port=port)
    print(f"explorer for parameter set {set_label(set_name)!r} at {url} (Ctrl-C stops it); the models load in the "
          "page, then the first generation runs", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(proc)
