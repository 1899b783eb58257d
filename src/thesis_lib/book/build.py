"""Staging and building the book: the prose (``book/``), ``_config.yml``, ``_toc.yml``, the executed notebooks and
the vendored JavaScript go into ``build/<set>/book``; ``jupyter-book build -W -n`` renders it, executing nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import ConfigError
from .execute import NOTEBOOKS, build_dir, execute
from .params import DEFAULT_SET, ROOT
from .vendor import vendor

PROSE_DIR = ROOT / "book"


def stage(set_name: str = DEFAULT_SET) -> Path:
    """Put the book's sources together in ``build/<set>/book`` (the executed notebooks are already there)."""
    out = build_dir(set_name)
    missing = [n for n in NOTEBOOKS if not (out / "notebooks" / f"{n}.ipynb").is_file()]
    if missing:
        raise ConfigError(f"Not yet executed for {set_name!r}: {', '.join(missing)} (run `thesis-lib book` first).")
    for f in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / f, out / f)
    for f in PROSE_DIR.rglob("*"):
        if f.is_file() and "_build" not in f.parts:
            dest = out / f.relative_to(PROSE_DIR)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
    vendor(out / "_vendor")
    return out


def build(set_name: str = DEFAULT_SET, *, recompute: bool = False, progress: bool = True,
          overrides: dict | None = None) -> Path:
    """Execute (or reuse) the notebooks with the parameter set (and ``overrides``), stage, and build the HTML with
    warnings as errors; returns the folder of the built pages."""
    execute(set_name, recompute=recompute, progress=progress, overrides=overrides)
    out = stage(set_name)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(out), "-W", "-n", "--keep-going",
           "--builder", "html"]
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"jupyter-book build failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}")
    return out / "_build" / "html"
