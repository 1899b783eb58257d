"""Executing the chapter notebooks with papermill (``thesis-lib book``): the heavy chapter first, a notebook
reused when its source, parameters and the library's code are unchanged since its last execution."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..bench.environment import code_digest
from ..errors import ConfigError
from ..models.cache import write_atomic, write_json
from ..progress import ENV as PROGRESS_ENV
from ..progress import Follower
from .params import DEFAULT_SET, ROOT, Params, set_label
from .sizing import planned_s, values_of
from .shared import digest

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = ("ch2_theory", "ch3_methods", "ch4_results", "ch5_conclusion", "ch6_beyond", "ch7_serving", "ch8_trees",
             "explorer")
#: Chapter 4 runs the benchmarks the others read, so it goes first.
RUN_ORDER = ("ch4_results", "ch2_theory", "ch3_methods", "ch5_conclusion", "ch6_beyond", "ch7_serving", "ch8_trees",
             "explorer")


def kernel_manager(folder: Path):
    """A kernel manager class whose kernels talk to the build over local sockets in ``folder`` (IPC), not TCP: no
    port is opened, and the kernel has no reason to warn that its TCP traffic is unencrypted. ``folder`` should
    have a short path (a socket's path is limited to about 100 characters)."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _default_transport(self):
            return "ipc"

        @default("ip")
        def _default_ip(self):
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder / "kernel")

    return IPCKernelManager


def notebook_parameters(name: str) -> set[str]:
    import papermill

    return set(papermill.inspect_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb")))


@contextlib.contextmanager
def _environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_dir(set_name: str) -> Path:
    """Where a parameter set's book is staged and built."""
    return ROOT / "build" / set_label(set_name) / "book"


def execute(set_name: str = DEFAULT_SET, *, recompute: bool = False, only: list[str] | None = None,
            overrides: dict | None = None, progress: bool = True) -> dict[str, str]:
    """Run the chapter notebooks with a parameter set into ``build/<set>/book/notebooks``; returns each
    notebook's fate ("executed" or "reused"). Every bad name fails before any notebook runs."""
    import papermill

    names = list(only or RUN_ORDER)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        raise ConfigError(f"Unknown notebook(s) {', '.join(unknown)}; the chapters are {', '.join(NOTEBOOKS)}.")
    values = values_of(set_name, overrides, measure=True, replan=recompute, progress=progress)
    p = Params.from_namespace(values).check()
    from ..models.loading import check_quantization
    from ..models.specs import resolve

    for spec in (p.target, p.draft):  # a load-time quantisation's package is checked before any notebook runs
        if spec and resolve(spec).quant:
            check_quantization(spec)
    env = {}
    if p.rehearsal:
        from . import rehearsal

        env = rehearsal.environment(rehearsal.prepare(), devices=(values.get("DEVICE"), values.get("DRAFT_DEVICE")))
    out_dir = build_dir(set_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    follower = Follower(out_dir / "progress.log", out=sys.stderr if progress else open(os.devnull, "w"))
    env.update({PROGRESS_ENV: str(follower.path), "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    values["FIG_DIR"] = str((out_dir / "figures").relative_to(ROOT))
    lib, planned = code_digest(), planned_s(values)
    fates, report = {}, []
    sockets = tempfile.TemporaryDirectory(prefix="thesis-kernels-")  # the kernels' IPC sockets
    order = sorted(names, key=RUN_ORDER.index)
    for i, name in enumerate(order, 1):
        src = NOTEBOOK_DIR / f"{name}.ipynb"
        declared = notebook_parameters(name)
        given = {k: v for k, v in values.items() if k in declared}
        key = digest({"source": hashlib.sha256(src.read_bytes()).hexdigest(), "parameters": given, "library": lib})
        dest = out_dir / "notebooks" / f"{name}.ipynb"
        if not recompute and dest.is_file():
            meta = json.loads(dest.read_text(encoding="utf-8")).get("metadata", {}).get("thesis_companion", {})
            if meta.get("key") == key:
                fates[name] = "reused"
                report.append({"notebook": name, "fate": "reused", "seconds": 0.0, "peak_rss_gib": None})
                continue
        t0, started = time.perf_counter(), time.time()
        if progress:
            plan = f"; planned at {planned[name] / 60:.1f} min" if name in planned else ""
            print(f"[{i}/{len(order)}] {name}: executing ({time.strftime('%H:%M:%S')}{plan})", file=sys.stderr, flush=True)
        tmp = dest.with_suffix(".partial.ipynb")
        done = threading.Event()
        watcher = threading.Thread(target=follower.follow, args=(done.is_set,), daemon=True,
                                   kwargs={"label": name, "planned": planned.get(name)})
        watcher.start()
        try:
            with _environment(env):  # the kernels inherit it
                papermill.execute_notebook(str(src), str(tmp), parameters=given, cwd=str(ROOT),
                                           kernel_name="python3", progress_bar=False, log_output=False,
                                           kernel_manager_class=kernel_manager(Path(sockets.name)))
        finally:
            done.set()
            watcher.join()
        seconds = round(time.perf_counter() - t0, 1)
        peak = follower.peaks[-1] / 1024 if follower.peaks else None
        report.append({"notebook": name, "fate": "executed", "seconds": seconds, "started": round(started, 1),
                       "peak_rss_gib": None if peak is None else round(peak, 2)})
        if progress:
            print(f"[{i}/{len(order)}] {name}: done in {seconds:.0f} s"
                  + (f", kernel peak memory {peak:.1f} GiB" if peak is not None else ""), file=sys.stderr, flush=True)
        nb = json.loads(tmp.read_text(encoding="utf-8"))
        for cell in nb["cells"]:  # the parameter cells fold away in the book ("Show code cell source")
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if {"parameters", "injected-parameters"} & set(tags) and "hide-input" not in tags:
                tags.append("hide-input")
        nb.setdefault("metadata", {})["thesis_companion"] = {
            "key": key, "parameter_set": set_name, "parameters": given, "seconds": seconds,
            "peak_rss_gib": report[-1]["peak_rss_gib"]}
        write_atomic(dest, json.dumps(nb, indent=1, ensure_ascii=False))
        tmp.unlink()
        fates[name] = "executed"
    sockets.cleanup()
    write_json(out_dir / "execution.json", report)
    return fates


def execution_report(set_name: str = DEFAULT_SET) -> list[dict]:
    """The last :func:`execute`'s per-notebook fate, seconds and peak memory for ``set_name``."""
    return json.loads((build_dir(set_name) / "execution.json").read_text())
