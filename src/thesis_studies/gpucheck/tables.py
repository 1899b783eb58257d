"""A saved ``thesis-lib studies gpu-check`` document as the book shows it: :func:`saved` (the document
``GPU_CHECK_FILE`` names), :func:`head_rows` (the table) and :func:`summary` (its numbers). Latencies at the thesis'
shapes with random weights, so cost only, never acceptance.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from thesis_lib.book.params import ROOT


def saved(p) -> tuple[dict | None, str]:
    """The saved GPU document ``GPU_CHECK_FILE`` names, and a label saying what and when it is."""
    if not p.gpu_check_file or not (ROOT / p.gpu_check_file).is_file():
        return None, "no GPU document named (GPU_CHECK_FILE)"
    doc = json.loads((ROOT / p.gpu_check_file).read_text(encoding="utf-8"))
    return doc, (f"{doc['command']}, {doc['label']}; measured {doc['measured']} at {doc['revision']} on "
                 f"{doc['machine']}; saved in {p.gpu_check_file}")


def best_flash_path(row: dict) -> str:
    """The FlashHead path shown: Triton in a CUDA graph timed on the device alone ("queued", no launch latency),
    else captured with the launch, else compiled."""
    for path in ("triton_queued", "triton_captured"):
        if f"flash_{path}_ms" in row:
            return path
    return "compiled"


def _pair_ms(row: dict) -> tuple[str, float, float]:
    """The path shown for a probe count and the (dense, FlashHead) medians on its like-for-like footing."""
    path = best_flash_path(row)
    dense = {"triton_queued": "dense_queued_ms", "triton_captured": "dense_captured_ms"}.get(path, "dense_ms")
    return path, row[dense], row[f"flash_{path}_ms"]


def _agreement(row: dict) -> dict:
    """Same-token counts per path; the device-timed path is the captured graph timed otherwise: its count."""
    agree = row.get("agree_with_reference", {})
    return {**agree, "triton_queued": agree.get("triton_captured", float("nan"))}


def head_rows(doc: dict) -> pd.DataFrame:
    """Per probe count: dense and FlashHead medians, their ratio, same-token counts against the float32 reference."""
    rows = []
    check = doc["gpu_check"]
    n = check["head"]["rows"]
    for r in check["head"]["curve"]:
        path, dense, flash = _pair_ms(r)
        agree = _agreement(r)
        rows.append({"Probes": r["n_probes"], "Candidates": r["candidates"], "Dense head (ms)": dense,
                     "FlashHead (ms)": flash, "Speedup": dense / flash,
                     "Same token, this path": f"{agree.get(path, '–')}/{n}",
                     "Same token, torch.compile": f"{agree.get('compiled', '–')}/{n}"})
    return pd.DataFrame(rows)


#: what :func:`summary` gives when there is no document: every number nan
NUMBERS = ("head_speedup", "head_speedup_launch", "flash_us", "dense_us", "agree_path", "agree_compiled", "rows",
           "probes", "body_ms", "topk_us", "dense_mm_us", "kernels_us", "n_kernels", "step_speedup", "step_ceiling",
           "step_head_share", "step_speedup_eager", "speedup_p64", "speedup_p128", "speedup_p256", "speedup_p593",
           "verify13", "verify5", "int4_step_ms", "int4_c", "int4_v5", "int4_v16", "int4_gb", "designs_five_us",
           "designs_best_us", "designs_n", "int4_layers", "int4_group", "chained_us", "chained_before_us",
           "chained_dense_us", "chained_mid_us", "chained_mid_before_us", "one_row_us", "one_row_before_us",
           "one_row_lo", "one_row_hi", "one_row_runs")


def summary(doc: dict | None) -> dict:
    """The page's ``gpu_<key>`` numbers: head ratios and agreement, per-probe ratios, the captured and eager draft
    step, the profiled kernels; all nan (name "no GPU") without a document."""
    nan = float("nan")
    if doc is None:
        return {**{k: nan for k in NUMBERS}, "name": "no GPU"}
    check = doc["gpu_check"]
    curve = check["head"]["curve"]
    top = max(curve, key=lambda r: r["n_probes"])
    path, dense, flash = _pair_ms(top)
    graphs = check.get("draft_step_graphs", {})
    captured = graphs.get("captured") or {}
    agree = _agreement(top)
    launch = (top["dense_captured_ms"] / top["flash_triton_captured_ms"] if "flash_triton_captured_ms" in top
              else nan)
    kernels = [r for r in (check.get("head_profile") or {}).get("flashhead", [])
               if r["name"] == "aten::mm" or r["name"].endswith("_kernel")]
    by_probes = {r["n_probes"]: _pair_ms(r) for r in curve}
    verify = check.get("verify", {}).get("over_step", {})
    return {"probes": float(top["n_probes"]), "rows": float(check["head"]["rows"]), "head_speedup": dense / flash,
            "head_speedup_launch": launch, "flash_us": 1000 * flash, "dense_us": 1000 * dense,
            "agree_path": float(agree.get(path, nan)), "agree_compiled": float(agree.get("compiled", nan)),
            "step_speedup": captured.get("speedup", graphs.get("speedup_triton", graphs.get("speedup", nan))),
            "step_ceiling": captured.get("ceiling", nan),
            "step_head_share": 100 * captured.get("dense_head_share", nan),
            "step_speedup_eager": check["draft_step"]["speedup"],
            "body_ms": captured.get("body_ms", graphs.get("body_ms", nan)),
            "topk_us": 1000 * (check.get("head_profile") or {}).get("topk_sorted_False_ms", nan),
            "dense_mm_us": _kernel_us(check, "dense", "aten::mm"),
            "kernels_us": sum(r["us_per_head_call"] for r in kernels) if kernels else nan,
            "n_kernels": float(len(kernels)) if kernels else nan,
            **{f"speedup_p{n}": (by_probes[n][1] / by_probes[n][2] if n in by_probes else nan)
               for n in (64, 128, 256, 593)},
            "verify13": float(verify.get("13", verify.get(13, nan))), "verify5": float(verify.get("5", verify.get(5, nan))),
            **_int4(check, captured), **_designs(doc.get("head_designs")),
            **_chained(doc.get("head_chained")), **_one_row(doc.get("head_score_count")),
            "name": check["versions"].get("gpu", "?")}


def _int4(check: dict, captured: dict) -> dict:
    """The 4-bit Qwen3-32B-shaped target: its layers and group size, its step (ms), the captured FlashHead draft
    step over it, its blocks of 5 and 16 in steps, its weights' GB (nan where the document has no such part)."""
    nan = float("nan")
    v = check.get("verify_int4") or {}
    if "ms" not in v:
        return {k: nan for k in ("int4_step_ms", "int4_c", "int4_v5", "int4_v16", "int4_gb", "int4_layers",
                                 "int4_group")}
    step = {int(n): float(x) for n, x in v["ms"].items()}[1]
    over = {int(n): float(x) for n, x in v["over_step"].items()}
    return {"int4_step_ms": step, "int4_c": captured.get("flashhead_ms", nan) / step, "int4_v5": over.get(5, nan),
            "int4_v16": over.get(16, nan), "int4_gb": float(v["weights_gb"]), "int4_layers": float(v["layers"]),
            "int4_group": float(v.get("group", nan))}


def _designs(designs: dict | None) -> dict:
    """Other designs of the head, each timed in a run of its own beside the five kernels of its day
    (``head_designs``: one design per ``run*`` part, its ``compare`` curve with those kernels as ``old`` and the
    design as ``new``, and its other settings as ``variants``): the run whose fastest setting came closest to its
    five kernels, at 593 probes, their and that setting's device times (µs), and how many runs were timed."""
    nan = float("nan")
    pairs = []
    for key, part in (designs or {}).items():
        run = part.get("compare") if key.startswith("run") and isinstance(part, dict) else None
        at = next((r for r in (run or {}).get("curve", []) if r["n_probes"] == 593), None)
        if at is None:
            continue
        best = min([at["ms"]["new"]] + [v["ms"]["variant"] for v in run.get("variants", [])])
        pairs.append((best / at["ms"]["old"], at["ms"]["old"], best))
    if not pairs:
        return {"designs_five_us": nan, "designs_best_us": nan, "designs_n": nan}
    _, kept, best = min(pairs)
    return {"designs_five_us": 1000 * kept, "designs_best_us": 1000 * best, "designs_n": float(len(pairs))}


def _chained(part: dict | None) -> dict:
    """The five kernels chained by programmatic dependent launch (``head_chained``): timed alone, their µs, the
    earlier kernels' and the dense head's (each the slower of its two passes); and interleaved between two other
    heads, theirs and the earlier kernels' at 593 probes (the last H100 compare run)."""
    nan = float("nan")
    if not part:
        return {k: nan for k in ("chained_us", "chained_before_us", "chained_dense_us", "chained_mid_us",
                                 "chained_mid_before_us")}
    alone = {name: max(r["us"]) for name, r in part["alone_h100"].items()}
    at = next(r for r in part["compare_h100"][-1]["curve"] if r["n_probes"] == 593)
    return {"chained_us": alone["pdl1-b128"], "chained_before_us": alone["old"], "chained_dense_us": alone["dense"],
            "chained_mid_us": 1000 * at["ms"]["new"], "chained_mid_before_us": 1000 * at["ms"]["old"]}


def _one_row(part: dict | None) -> dict:
    """One row's centroids scored and counted in one kernel (``head_score_count``), each run's pair timed alone:
    the medians over runs of the kept head's and the five kernels' µs, the smallest and largest ratio, the runs."""
    nan = float("nan")
    runs = [r for k, r in ((part or {}).get("alone_us") or {}).items() if k.startswith("run")]
    if not runs:
        return {k: nan for k in ("one_row_us", "one_row_before_us", "one_row_lo", "one_row_hi", "one_row_runs")}
    ratios = [r["five_kernels"] / r["score_count"] for r in runs]
    return {"one_row_us": float(np.median([r["score_count"] for r in runs])),
            "one_row_before_us": float(np.median([r["five_kernels"] for r in runs])),
            "one_row_lo": min(ratios), "one_row_hi": max(ratios), "one_row_runs": float(len(runs))}


def _kernel_us(check: dict, head: str, name: str) -> float:
    """Device microseconds per head call of one profiled operator (nan where the profile lacks it)."""
    rows = (check.get("head_profile") or {}).get(head, [])
    return next((r["us_per_head_call"] for r in rows if r["name"] == name), float("nan"))
