"""Chapter 2's precision section from a saved ``precision-bench`` document (:mod:`thesis_lib.bench.precision`): the
verify-cost curve per CPU precision (:func:`curve_table`), the speedup model on each one's costs beside the measured
speedups (:func:`model_rows`), the glued numbers (:func:`summary`, :func:`machine`, :func:`glued`), and the retired
``float32-row`` and ``bfloat16-unpadded`` variants in documents that have them (:func:`layouts`, :func:`padding`).
"""

from __future__ import annotations

import re

import pandas as pd

from . import theory

PRECISIONS = ("float32", "bfloat16", "int4")


def _curve(doc: dict, name: str) -> dict[int, float]:
    return {int(n): float(v) for n, v in doc["verify"][name]["over_step"].items()}


def flash_costs(doc: dict, precision: str) -> dict | None:
    """Target-only and FlashHead deferred ms per token (lossless: the baseline's over the pooled speedup) and that
    speedup; None without end-to-end runs."""
    e2e = ((doc.get("end_to_end") or {}).get("summary") or {}).get(precision)
    if not e2e:
        return None
    base, pooled = float(e2e["baseline_ms_per_token"]), float(e2e["vs_baseline"]["flash_deferred"]["speedup_pooled"])
    return {"base_ms_token": base, "measured": pooled, "flash_ms_token": base / pooled}


def curve_table(doc: dict, gpu_doc: dict | None = None) -> pd.DataFrame:
    """Rows n = 1 .. max_block: the target's block cost over one step in each precision (and the GPU's)."""
    cols = {f"target, {p}": _curve(doc, f"target/{p}") for p in doc["precisions"]}
    # the int4 pair's draft is the bf16 draft again (only the target is quantised): no column of its own
    cols.update({f"draft, {p}": _curve(doc, f"draft/{p}") for p in doc["precisions"] if p != "int4"})
    verify = ((gpu_doc or {}).get("gpu_check") or gpu_doc or {}).get("verify")
    if verify:
        how = ", CUDA graphs" if "graph" in verify.get("how", "") else ""
        cols[f"GPU: {verify['layers']} Qwen3-32B-shaped layers, bf16 (random weights{how})"] = {
            int(n): float(v) for n, v in verify["over_step"].items()}
    ns = range(1, int(doc["max_block"]) + 1)
    return pd.DataFrame({"block of n tokens": list(ns), **{c: [v.get(n) for n in ns] for c, v in cols.items()}})


def model_rows(doc: dict, alpha: float) -> pd.DataFrame:
    """Per precision: step costs, c and v at the document's K, the acceptance its dense-draft runs imply (else
    ``alpha``), the modelled deferred speedup and the measured ones."""
    rows = []
    nan = float("nan")
    k = int(doc["k"])
    for p in doc["precisions"]:
        t = {int(n): v for n, v in doc["verify"][f"target/{p}"]["ms"].items()}
        d = {int(n): v for n, v in doc["verify"][f"draft/{p}"]["ms"].items()}
        c, v = d[1] / t[1], t[min(k + 1, max(t))] / t[1]
        e2e = ((doc.get("end_to_end") or {}).get("summary") or {}).get(p, {}).get("vs_baseline", {})
        emitted = e2e.get("dense_deferred", {}).get("mean_emitted")
        a = theory.alpha_from_emitted(emitted, k) if emitted else alpha
        rows.append({"precision": p, "target step (ms)": t[1], "draft step (ms)": d[1], "c": c,
                     f"v = verify({k + 1}) / step": v, "alpha": a,
                     "model speedup, dense deferred": theory.speedup(a, k, c, v, 0.0),
                     "measured, dense deferred": e2e.get("dense_deferred", {}).get("speedup_pooled", nan),
                     "measured, FlashHead deferred": e2e.get("flash_deferred", {}).get("speedup_pooled", nan)})
    return pd.DataFrame(rows)


#: The glued keys of :func:`summary` (nan each without a document).
KEYS = tuple(f"prec_{k}_{p}" for p in PRECISIONS for k in ("verify5", "verify9", "target_step_ms", "draft_step_ms",
                                                             "model", "measured_dense", "measured", "base_ms_token",
                                                             "flash_ms_token")) + (
    "prec_target_ratio_bfloat16", "prec_draft_ratio_bfloat16", "prec_target_ratio_int4", "prec_draft_ratio_int4",
    "prec_context", "prec_reps", "prec_stream_gbps", "prec_step_gbps_float32", "prec_step_gbps_bfloat16",
    "prec_read_gbps_float32", "prec_read_gbps_bfloat16", "prec_step_share_float32", "prec_step_share_bfloat16",
    "prec_bytes_ratio_bfloat16") + tuple(f"prec_jumps_{p}" for p in PRECISIONS)

#: A block size where the curve rises by at least this many steps over the block one token shorter is a jump.
JUMP = 0.4


def jumps(curve: dict[int, float]) -> str:
    """How a verify-cost curve rises, in words: at which block sizes it jumps by :data:`JUMP` steps or more."""
    at = [n for n in sorted(curve) if n - 1 in curve and curve[n] - curve[n - 1] >= JUMP]
    if not at:
        return f"rises without jumps (no block costs {JUMP} steps more than the block one token shorter)"
    sizes = ", ".join(map(str, at[:-1])) + (" and " if len(at) > 1 else "") + str(at[-1])
    return f"rises in jumps, at blocks of {sizes} tokens (each {JUMP} steps or more over the block one token shorter)"


def summary(doc: dict | None, alpha: float) -> dict:
    """The glued values of :data:`KEYS` (step ratios, verify curves, modelled and measured speedups, bandwidth)."""
    out = {key: float("nan") for key in KEYS}
    if doc is None:
        return out
    rows = model_rows(doc, alpha).set_index("precision")
    for p in (p for p in doc["precisions"] if p in PRECISIONS):  # float32-row: see layouts()
        out[f"prec_verify5_{p}"] = _curve(doc, f"target/{p}").get(5, float("nan"))
        out[f"prec_verify9_{p}"] = _curve(doc, f"target/{p}").get(9, float("nan"))
        out[f"prec_jumps_{p}"] = jumps(_curve(doc, f"target/{p}"))
        costs = flash_costs(doc, p)
        if costs:
            out[f"prec_base_ms_token_{p}"] = costs["base_ms_token"]
            out[f"prec_flash_ms_token_{p}"] = costs["flash_ms_token"]
        out[f"prec_target_step_ms_{p}"] = float(rows.loc[p, "target step (ms)"])
        out[f"prec_draft_step_ms_{p}"] = float(rows.loc[p, "draft step (ms)"])
        out[f"prec_model_{p}"] = float(rows.loc[p, "model speedup, dense deferred"])
        out[f"prec_measured_dense_{p}"] = float(rows.loc[p, "measured, dense deferred"])
        out[f"prec_measured_{p}"] = float(rows.loc[p, "measured, FlashHead deferred"])
    for p, r in ((p, r) for p, r in (doc.get("ratios") or {}).items() if p in PRECISIONS):
        out[f"prec_target_ratio_{p}"] = float(r["target_step"])
        out[f"prec_draft_ratio_{p}"] = float(r["draft_step"])
    bw = doc.get("bandwidth") or {}
    if bw:
        out["prec_stream_gbps"] = float(bw["stream_read_gbps"])
        for p in ("float32", "bfloat16"):
            if bw["step_gbps"].get(f"target/{p}") is not None:
                out[f"prec_step_gbps_{p}"] = float(bw["step_gbps"][f"target/{p}"])
            if p in bw.get("read_gbps", {}):
                out[f"prec_read_gbps_{p}"] = float(bw["read_gbps"][p])
            if f"target/{p}" in bw.get("step_share", {}):
                out[f"prec_step_share_{p}"] = 100 * float(bw["step_share"][f"target/{p}"])
        b32, b16 = bw["step_bytes"].get("target/float32"), bw["step_bytes"].get("target/bfloat16")
        if b32 and b16:
            out["prec_bytes_ratio_bfloat16"] = b32 / b16
    out["prec_context"] = int(doc["context_tokens"])
    out["prec_reps"] = int(doc["reps"])
    return out


def float32_layout(doc: dict) -> str:
    """The packed layout of a document's float32 kernels: "general", "one-row" (also documents predating the
    layout's name) or "not measured"."""
    kernels = (doc.get("kernels") or {}).get("float32")
    if not kernels:
        return "not measured"
    return "one-row" if "row layout" in kernels[0] or "layout" not in kernels[0] else "general"


def capability(doc: dict) -> str:
    """A document's CPU in words: its name and vector extensions (older documents lack ``cpu_capability``)."""
    cap = doc.get("cpu_capability") or ("AVX-512" if doc.get("fast_bf16") else "unknown vector extensions")
    bf16 = "native bf16 dot products" if doc.get("fast_bf16") else "no native bf16 dot products"
    return f"{doc['processor']} ({cap}, {bf16})"


def float32_rows(doc: dict) -> str:
    """How a document's float32 products ran: "padded to N rows", "unpadded" (also documents predating the
    padding) or "not measured"."""
    kernels = (doc.get("kernels") or {}).get("float32")
    if not kernels:
        return "not measured"
    found = re.search(r"padded to (\d+)", kernels[0])
    return f"padded to {found.group(1)} rows" if found else "unpadded"


def machine(doc: dict | None) -> dict:
    """The document's CPU: what ``DTYPE: auto`` picks there and why, :func:`capability`, :func:`float32_layout`,
    :func:`float32_rows`; "unknown" each without a document."""
    if doc is None:
        return {"auto": "unknown", "auto_reason": "unknown", "cpu": "unknown", "float32_layout": "unknown",
                "float32_rows": "unknown"}
    return {"auto": doc["auto"]["dtype"], "auto_reason": doc["auto"]["reason"], "cpu": capability(doc),
            "float32_layout": float32_layout(doc), "float32_rows": float32_rows(doc)}


def glued(doc: dict | None, alpha: float, prefix: str = "prec_") -> dict:
    """:func:`summary` and :func:`machine` under ``prefix`` (``prec_`` for ``PRECISION_FILE``, ``nobf16_`` for
    ``PRECISION_FILE_NO_BF16``)."""
    out = {prefix + k[len("prec_"):]: v for k, v in summary(doc, alpha).items()}
    out.update({prefix + k: v for k, v in machine(doc).items()})
    return out


#: The glued keys of :func:`layouts`: per layout ("block": float32 as packed now, "row": ``float32-row``).
LAYOUT_KEYS = tuple(f"layout_{k}_{lay}" for lay in ("block", "row") for k in ("step_ms", "verify5", "measured",
                                                                              "base_ms_token", "flash_ms_token"))


def layouts(doc: dict | None) -> dict:
    """:data:`LAYOUT_KEYS` from a document with ``float32`` and ``float32-row`` (nan each where either is missing)."""
    return _side_by_side(doc, LAYOUT_KEYS, "layout", (("block", "float32"), ("row", "float32-row")))


def _costs(doc: dict, precision: str) -> dict:
    """One precision's step ms, verify(5)/step, target ratio over float32 and :func:`flash_costs`."""
    out = {"step_ms": float(doc["verify"][f"target/{precision}"]["ms"]["1"]),
           "verify5": _curve(doc, f"target/{precision}").get(5, float("nan"))}
    if f"draft/{precision}" in doc["verify"]:
        out["draft_step_ms"] = float(doc["verify"][f"draft/{precision}"]["ms"]["1"])
    if precision in (doc.get("ratios") or {}):
        out["target_ratio"] = float(doc["ratios"][precision]["target_step"])
    return {**out, **(flash_costs(doc, precision) or {})}


def _side_by_side(doc: dict | None, keys: tuple, prefix: str, pairs: tuple) -> dict:
    """``keys`` (``<prefix>_<cost>_<variant>``) from each ``(variant, precision)`` of ``pairs``; nan where missing."""
    out = {key: float("nan") for key in keys}
    if doc is None or not {p for _, p in pairs} <= set(doc["precisions"]):
        return out
    for variant, precision in pairs:
        for cost, value in _costs(doc, precision).items():
            if f"{prefix}_{cost}_{variant}" in out:
                out[f"{prefix}_{cost}_{variant}"] = value
    return out


#: The glued keys of :func:`padding`: per variant ("padded": bfloat16 as loaded now, "unpadded": ``bfloat16-unpadded``).
PADDING_KEYS = tuple(f"pad_{k}_{v}" for v in ("padded", "unpadded") for k in ("step_ms", "draft_step_ms", "verify5",
                                                                              "measured", "base_ms_token",
                                                                              "flash_ms_token", "target_ratio"))


def padding(doc: dict | None) -> dict:
    """:data:`PADDING_KEYS` from a document with ``bfloat16`` and ``bfloat16-unpadded`` (nan where either is
    missing)."""
    return _side_by_side(doc, PADDING_KEYS, "pad", (("padded", "bfloat16"), ("unpadded", "bfloat16-unpadded")))
