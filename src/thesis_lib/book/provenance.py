"""Where the book's numbers come from: the machine a run names (:func:`hardware`), the ``Source`` label of this
project's rows (:func:`source_label`) and the environment page's table (:func:`environment_table`)."""

from __future__ import annotations

import json

import pandas as pd

from ..bench.disturbance import judge, judge_timed
from ..bench.environment import environment, measured_when
from .params import Params
from .shared import digest


def hardware(env: dict) -> str:
    """One line naming the machine of a run's environment (GPU names if any, else the CPU and threads)."""
    cuda = env.get("cuda_devices") or env.get("cuda") or []
    if cuda:
        names = [d.get("name", str(d)) if isinstance(d, dict) else str(d) for d in cuda]
        return ", ".join(dict.fromkeys(names)) + (f" x{len(names)}" if len(names) > 1 else "")
    cpu = env.get("cpu") or env.get("processor") or "CPU"
    threads = env.get("threads") or env.get("torch_threads")
    return f"{cpu}" + (f", {threads} threads" if threads else "")


def run_folders(*runs) -> list[str]:
    """The run folders behind ``runs``, each once, in order (views of one run, e.g. the grid run's, share it)."""
    return list(dict.fromkeys(r.name for r in runs))


def source_label(run_or_doc, p: Params, set_name: str | None = None) -> str:
    """The ``Source`` of this project's rows in a table: parameter set (``p``'s, or ``set_name``: a run of another
    set of the same pair), when and with which revision the numbers were measured, models and machine; ``None``:
    measured live, now."""
    if run_or_doc is None:
        env = record = environment()
    elif hasattr(run_or_doc, "environment"):
        env = run_or_doc.environment
        record = env
    else:
        env = run_or_doc.get("environment", {})
        record = run_or_doc.get("measured") or env
    short = lambda s: s.split(":")[-1].split("/")[-1]
    return f"this run ({set_name or p.set_name}, {measured_when(record)}): {short(p.target)} + {short(p.draft)}, {hardware(env)}"


def rows_exact_said(model_env: dict) -> str:
    """What a run's record of a model's row probe (:func:`thesis_lib.models.loading.probe_rows`) says, in words."""
    probed = model_env.get("rows_probed")
    where = (f"every block of {probed['sizes'][0]} to {probed['sizes'][1]} rows probed at {probed['threads']} "
             "threads" if probed else "probed at load")
    if model_env.get("rows_exact"):
        return (f"yes ({where}: each row of a block equals that row alone, so with row-exact attention a verified "
                "block computes what one-token steps compute)")
    if model_env.get("rows_exact") is None:
        return "not probed (not on a CPU)"
    bad = f"; not at {', '.join(map(str, probed['inexact']))} rows" if probed and probed["inexact"] else ""
    return (f"no ({where}{bad}: a block's products may round differently from one-token steps, so outputs may part "
            "at near ties)")


def environment_table(run, model_bench_doc: dict | None = None):
    """The environment page's table (versions, machine, models, FlashHead settings) from a run's environment."""
    env = run.environment
    rows = [("run folder", run.name), ("recorded at", env.get("recorded_at")), ("git commit", (env.get("git") or {}).get("commit")),
            ("uncommitted changes", (env.get("git") or {}).get("dirty")), ("python", env.get("python")),
            ("torch", env.get("torch")), ("transformers", env.get("transformers")), ("platform", env.get("platform")),
            ("machine", hardware(env)), ("CPU cores", env.get("cpu_count")),
            ("CUDA devices", ", ".join(env.get("cuda_devices") or []) or "none")]
    for role, m in (env.get("models") or {}).items():
        rows.append((f"{role} model", f"{m.get('spec')} ({m.get('dtype')}, {m.get('device')})"))
        if m.get("gguf_sha256"):
            rows.append((f"{role} GGUF sha256", m["gguf_sha256"]))
        pkgs = m.get("packages") or []
        if pkgs:
            rows.append((f"{role} packages", f"{len(pkgs)} PyPI packages: {pkgs[0]} ... {pkgs[-1]}"))
        if m.get("cpu_kernels"):
            rows.append((f"{role} CPU kernels", m["cpu_kernels"]))
        if m.get("attention"):
            rows.append((f"{role} attention", m["attention"]))
        if m.get("rows_exact") is not None:
            rows.append((f"{role} block rows as single rows", rows_exact_said(m)))
        if m.get("dtype_reason"):
            rows.append((f"{role} precision (DTYPE auto)", m["dtype_reason"]))
        q = m.get("quantization") or {}
        if q:
            rows.append((f"{role} quantisation", f"{q.get('method')}, {q.get('bits')}-bit, group {q.get('group_size')} "
                                               f"({q.get('package')} {q.get('package_version')})"))
    fh = env.get("flashhead") or {}
    if fh:
        rows.append(("FlashHead", f"C = {fh.get('n_clusters')}, p = {fh.get('n_probes')}, path {fh.get('path')}, "
                                  f"centroids {fh.get('centroid_dtype')}"))
        clus = fh.get("clustering") or {}
        if clus.get("shipped"):
            rows.append(("FlashHead clustering", f"shipped with the library ({clus['shipped']}; k-means of "
                                                 f"{clus.get('iterations')} iterations, centroids rebuilt here)"))
        sha = clus.get("sha256")
        if sha:
            rows.append(("FlashHead clustering sha256", json.dumps(sha)))
    if model_bench_doc:
        rows.append(("model-bench key", digest(model_bench_doc.get("key", {}))))
    return pd.DataFrame([(k, "" if v is None else str(v)) for k, v in rows], columns=["Item", "Value"])


#: The glued keys of chapter 4 that each timed part measured (their verdicts are not judged when it was disturbed).
#: Acceptance (acc_*) is left out: greedy tokens, and so what is accepted, do not depend on the machine's load.
MEASURED_BY = {"the main run": ("ord_", "def_", "draft_ms_tok_", "path_", "ci_"),
               "the head timings": ("head_speedup", "dense_head_ms", "flash_head_ms"),
               "the decode-step timings": ("step_speedup",)}


def disturbance(run, model_bench_doc: dict | None) -> dict[str, dict]:
    """Per timed part (the main run, the model bench's head and step timings): whether the machine was disturbed
    while it ran (:func:`thesis_lib.bench.disturbance.judge`), from what the run and the document recorded."""
    env = run.environment
    out = {"the main run": judge((env["resumed"][-1] if env.get("resumed") else env).get("machine"))}
    for part, name in (("head", "the head timings"), ("step", "the decode-step timings")):
        if model_bench_doc and part in model_bench_doc:
            out[name] = judge_timed(model_bench_doc[part])
    return out


def disturbance_said(parts: dict[str, dict]) -> str:
    """The page's sentence on the machine during the timed parts."""
    bad = {name: j for name, j in parts.items() if j["disturbed"]}
    if not bad:
        return ("No timed part shows a disturbance (" + "; ".join(f"{name}: {j['why']}" for name, j in parts.items())
                + ").")
    return ("Disturbed: " + "; ".join(f"during {name}, {j['why']}" for name, j in bad.items()) + ". The figures "
            "of " + " and ".join(bad) + " are not the method's alone, and no verdict below is drawn from them.")


def disturbed_keys(parts: dict[str, dict], glued) -> dict[str, str]:
    """The glued keys (of ``glued``) measured by a disturbed part, each with why."""
    return {k: parts[name]["why"] for name, prefixes in MEASURED_BY.items()
            if parts.get(name, {}).get("disturbed") for k in glued if k.startswith(prefixes)}
