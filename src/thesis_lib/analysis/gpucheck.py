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


def head_rows(doc: dict) -> pd.DataFrame:
    """One row per probe count: the dense head and FlashHead, each on the document's like-for-like footing,
    their ratio, and how many states each FlashHead path gave the float32 reference's token."""
    rows = []
    check = doc["gpu_check"]
    n = check["head"]["rows"]
    for r in check["head"]["curve"]:
        path = best_flash_path(r)
        dense = r["dense_captured_ms"] if path == "triton_captured" else r["dense_ms"]
        agree = r.get("agree_with_reference", {})
        rows.append({"Probes": r["n_probes"], "Candidates": r["candidates"], "Dense head (ms)": dense,
                     "FlashHead (ms)": r[f"flash_{path}_ms"], "Speedup": dense / r[f"flash_{path}_ms"],
                     "Same token, this path": f"{agree.get(path, '–')}/{n}",
                     "Same token, torch.compile": f"{agree.get('compiled', '–')}/{n}"})
    return pd.DataFrame(rows)


def summary(doc: dict) -> dict:
    """The numbers the page glues: head speedup and agreement at the most probes, draft-step speedups."""
    check = doc["gpu_check"]
    top = max(check["head"]["curve"], key=lambda r: r["n_probes"])
    path = best_flash_path(top)
    graphs = check.get("draft_step_graphs", {})
    agree = top.get("agree_with_reference", {})
    return {"probes": top["n_probes"], "rows": check["head"]["rows"],
            "head_speedup": (top["dense_captured_ms"] if path == "triton_captured" else top["dense_ms"])
            / top[f"flash_{path}_ms"],
            "agree_path": agree.get(path, float("nan")), "agree_compiled": agree.get("compiled", float("nan")),
            "step_speedup_eager": check["draft_step"]["speedup"],
            "step_speedup_graph": graphs.get("speedup_triton", graphs.get("speedup", float("nan"))),
            "body_ms": graphs.get("body_ms", float("nan")), "gpu": check["versions"].get("gpu", "?"),
            "topk_us": _kernel_us(check, "flashhead", "aten::topk"), "dense_mm_us": _kernel_us(check, "dense", "aten::mm"),
            "torch": check["versions"]["torch"]}


def _kernel_us(check: dict, head: str, name: str) -> float:
    """Device microseconds per head call of one profiled operator (nan where the profile lacks it)."""
    rows = (check.get("head_profile") or {}).get(head, [])
    return next((r["us_per_head_call"] for r in rows if r["name"] == name), float("nan"))
