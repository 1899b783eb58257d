"""What a run records about where it ran: versions, hardware, threads, the git revision and the models (no
paths of this machine)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from pathlib import Path

from ..models import virtual
from ..models.cpu import cpu_name


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A short hash of this library's source and its studies' (every ``.py`` under ``thesis_lib`` and
    ``thesis_studies`` and the C++ kernels' sources, paths included): what a result was measured with, so that a
    result made by other code can be told apart. Taken once, when this module is first imported (the code a process
    runs is the code it loaded)."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for package in ("thesis_lib", "thesis_studies"):
        for f in sorted(f for f in (root / package).rglob("*") if f.suffix in (".py", ".cpp", ".h")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def provenance() -> dict:
    """When and with which code a result is being made: the time, the git revision, the library's digest."""
    return {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": git_revision(), "library": code_digest()}


def git_revision(start: Path | None = None) -> dict:
    """The source tree's git commit and whether it had uncommitted changes (``{}`` outside a checkout)."""
    cwd = start or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return {"commit": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def environment(*loaded, extra: dict | None = None) -> dict:
    """Versions, hardware and models of this session (no paths of this machine)."""
    import torch
    import transformers

    env = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector kernels torch dispatches here
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() or virtual.active() else [],
        "git": git_revision(),
        "library": code_digest(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "models": {},
    }
    for role, m in loaded:
        info = {k: v for k, v in m.info.items() if k not in ("load_seconds",)}
        env["models"][role] = {"spec": m.spec, "device": m.device, "dtype": m.dtype, **info}
    job = scheduler_job()
    if job:
        env["scheduler"] = job
    env.update(extra or {})
    return env


def scheduler_job() -> dict | None:
    """The Slurm job this process runs in (a sweep's job: :mod:`thesis_lib.sweep.slurm`), or None outside one."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    keys = {"job_id": "SLURM_JOB_ID", "job_name": "SLURM_JOB_NAME", "node": "SLURMD_NODENAME",
            "partition": "SLURM_JOB_PARTITION", "cluster": "SLURM_CLUSTER_NAME", "cpus": "SLURM_CPUS_PER_TASK",
            "gpus": "SLURM_JOB_GPUS"}
    return {"system": "slurm", **{k: os.environ[v] for k, v in keys.items() if v in os.environ}}


def measured_when(record: dict, code_note: bool = True) -> str:
    """When and with which code a result was made, from its environment or ``measured`` record: the date, the
    git revision (``+`` if the tree had uncommitted changes), and (``code_note``) a note if the library's code
    differs now."""
    if not record:
        return "date and revision not recorded"
    date = (record.get("recorded_at") or "")[:10] or "date not recorded"
    git = record.get("git") or {}
    rev = (git.get("commit") or "")[:7] + ("+" if git.get("dirty") else "") if git.get("commit") else "revision not recorded"
    changed = code_note and record.get("library") and record["library"] != code_digest()
    return f"measured {date} at {rev}" + ("; the library's code has changed since" if changed else "")


code_digest()  # the code this process loaded


def capability(doc: dict) -> str:
    """A document's CPU in words: its name and vector extensions (older documents lack ``cpu_capability``; a
    document that records neither it nor ``fast_bf16``, such as model-bench's, is named by its processor alone)."""
    if "cpu_capability" not in doc and "fast_bf16" not in doc:
        return doc["processor"]
    cap = doc.get("cpu_capability") or ("AVX-512" if doc.get("fast_bf16") else "unknown vector extensions")
    bf16 = "native bf16 dot products" if doc.get("fast_bf16") else "no native bf16 dot products"
    return f"{doc['processor']} ({cap}, {bf16})"
