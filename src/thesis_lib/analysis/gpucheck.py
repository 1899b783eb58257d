"""What a saved ``thesis-lib gpu-check`` document says, as the book shows it: one table and its numbers.

The document (``data/reference/gpu-check-*.json``) holds latencies at the thesis' shapes with random weights,
so it speaks of cost, never of acceptance. This module reads it; the verdicts on its numbers are
:mod:`thesis_lib.analysis.verdicts`' like every other page's.
"""

from __future__ import annotations

import pandas as pd


def best_flash_path(row: dict) -> str:
    """The FlashHead path the table shows for a probe count: the Triton kernel captured in a CUDA graph where
    the document has it (the GPU's fast path), else the compiled one."""
    return "triton_captured" if "flash_triton_captured_ms" in row else "compiled"


def _pair_ms(row: dict) -> tuple[str, float, float]:
    """The path shown for a probe count and the (dense, FlashHead) medians on its like-for-like footing."""
    path = best_flash_path(row)
    dense = row["dense_captured_ms"] if path == "triton_captured" else row["dense_ms"]
    return path, dense, row[f"flash_{path}_ms"]


def head_rows(doc: dict) -> pd.DataFrame:
    """One row per probe count: the dense head and FlashHead, each on the document's like-for-like footing,
    their ratio, and how many states each FlashHead path gave the float32 reference's token."""
    rows = []
    check = doc["gpu_check"]
    n = check["head"]["rows"]
    for r in check["head"]["curve"]:
        path, dense, flash = _pair_ms(r)
        agree = r.get("agree_with_reference", {})
        rows.append({"Probes": r["n_probes"], "Candidates": r["candidates"], "Dense head (ms)": dense,
                     "FlashHead (ms)": flash, "Speedup": dense / flash,
                     "Same token, this path": f"{agree.get(path, '–')}/{n}",
                     "Same token, torch.compile": f"{agree.get('compiled', '–')}/{n}"})
    return pd.DataFrame(rows)


#: what :func:`summary` gives when there is no document: every number nan
NUMBERS = ("head_speedup", "agree_path", "agree_compiled", "rows", "probes", "body_ms", "topk_us", "dense_mm_us",
           "step_speedup", "step_speedup_eager")


def summary(doc: dict | None) -> dict:
    """The numbers the page glues (``gpu_<key>``): head speedup and agreement at the most probes, draft-step
    speedups (body in a CUDA graph, and eager), the profiled kernels; nan each, and no GPU's name, without a
    document."""
    nan = float("nan")
    if doc is None:
        return {**{k: nan for k in NUMBERS}, "name": "no GPU"}
    check = doc["gpu_check"]
    top = max(check["head"]["curve"], key=lambda r: r["n_probes"])
    path, dense, flash = _pair_ms(top)
    graphs = check.get("draft_step_graphs", {})
    agree = top.get("agree_with_reference", {})
    return {"probes": float(top["n_probes"]), "rows": float(check["head"]["rows"]), "head_speedup": dense / flash,
            "agree_path": float(agree.get(path, nan)), "agree_compiled": float(agree.get("compiled", nan)),
            "step_speedup": graphs.get("speedup_triton", graphs.get("speedup", nan)),
            "step_speedup_eager": check["draft_step"]["speedup"], "body_ms": graphs.get("body_ms", nan),
            "topk_us": _kernel_us(check, "flashhead", "aten::topk"),
            "dense_mm_us": _kernel_us(check, "dense", "aten::mm"), "name": check["versions"].get("gpu", "?")}


def _kernel_us(check: dict, head: str, name: str) -> float:
    """Device microseconds per head call of one profiled operator (nan where the profile lacks it)."""
    rows = (check.get("head_profile") or {}).get(head, [])
    return next((r["us_per_head_call"] for r in rows if r["name"] == name), float("nan"))
