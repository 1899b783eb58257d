"""Chapter 2's precision section from a saved ``precision-bench`` document (:mod:`thesis_studies.precision.bench`): the
verify-cost curve per CPU precision (:func:`curve_table`), the speedup model on each one's costs beside the measured
speedups (:func:`model_rows`), the glued numbers (:func:`summary`, :func:`machine`, :func:`glued`), and the retired
``float32-row`` and ``bfloat16-unpadded`` variants in documents that have them (:func:`layouts`, :func:`padding`),
and the verdict sentences on all of these (:func:`cost_shift`, :func:`memory_bound`, :func:`int4_effect`, ...).
"""

from __future__ import annotations

import re

import pandas as pd

from thesis_lib.bench.environment import capability
from thesis_lib.analysis import theory

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


# The precision appendix's verdict sentences (their rules, binding each to its glued inputs, in .verdicts).

#: The settings :func:`fastest_setting` names, in its arguments' order.
SETTINGS = tuple(f"{m} with the {p} target" for p in ("float32", "bfloat16", "4-bit") for m in
                 ("target-only decoding", "FlashHead deferred"))


def best_precision(speedup_float32: float, speedup_bfloat16: float) -> str:
    """Which precision gives FlashHead deferred the larger speedup over its own target-only decoding (tie within
    1 %)."""
    if speedup_float32 != speedup_float32 or speedup_bfloat16 != speedup_bfloat16:
        return "was not measured"
    if abs(speedup_bfloat16 - speedup_float32) <= 0.01 * speedup_float32:
        return "is about the same in both precisions"
    return "is larger in bfloat16" if speedup_bfloat16 > speedup_float32 else "is larger in float32"


def cost_shift(target_ratio: float, draft_ratio: float, verify5_float32: float, verify5_bfloat16: float) -> str:
    """How bfloat16 moves the model's costs (c rises if the draft gains less than the target, v falls if
    verify(5)/step does) and whether the two pull the speedup the same way."""
    values = (target_ratio, draft_ratio, verify5_float32, verify5_bfloat16)
    if any(x != x for x in values):
        return "the costs were not measured"
    c_up = draft_ratio < target_ratio
    v_down = verify5_bfloat16 < verify5_float32
    c_text = ("the draft gains less than the target, so c rises" if c_up
              else "the draft gains no less than the target, so c does not rise")
    v_text = "v falls" if v_down else "v does not fall"
    pull = ("the two pull the speedup in opposite directions" if c_up == v_down
            else "both favour bfloat16" if v_down else "both favour float32")
    return f"{c_text} while {v_text}: {pull}"


def memory_bound(step_gbps_float32: float, read_gbps_float32: float, step_gbps_bfloat16: float,
                 read_gbps_bfloat16: float, bytes_ratio: float, target: float = 2.5) -> str:
    """Each step's rate over a plain read of the same bytes (80 % or more: bound by memory), and whether bfloat16
    at the full read rate could be ``target`` times faster than float32: ``bytes_ratio * read_bf16 / step_fp32``."""
    if any(x != x for x in (step_gbps_float32, read_gbps_float32, step_gbps_bfloat16, read_gbps_bfloat16,
                            bytes_ratio)):
        return "was not measured"
    s32, s16 = step_gbps_float32 / read_gbps_float32, step_gbps_bfloat16 / read_gbps_bfloat16
    cap = bytes_ratio * read_gbps_bfloat16 / step_gbps_float32
    bound = "bound by memory" if s32 >= 0.8 else "not bound by memory"
    reach = "out of reach" if cap < target else "within reach"
    return (f"float32 reads its weights at {100 * s32:.0f} % of that rate ({bound}) and bfloat16 at {100 * s16:.0f} %: "
            f"a bfloat16 step reading its {bytes_ratio:.2f} times fewer bytes at the full rate would be {cap:.1f} times "
            f"faster than the float32 one, so {target}x is {reach} by the bytes alone")


def int4_effect(verify5_int4: float, verify5_bfloat16: float, speedup_int4: float, speedup_bfloat16: float) -> str:
    """The 4-bit target beside bf16: does a block of five cost more of its own steps (by 5 %), and is FlashHead
    deferred's speedup smaller or larger (tie within 1 %)."""
    if any(x != x for x in (verify5_int4, verify5_bfloat16, speedup_int4, speedup_bfloat16)):
        return "was not measured"
    if verify5_int4 >= 1.05 * verify5_bfloat16:
        v = "verification is dearer with the 4-bit target: a block of five costs more of its own steps"
    elif verify5_int4 <= verify5_bfloat16 / 1.05:
        v = "verification is cheaper with the 4-bit target: a block of five costs fewer of its own steps"
    else:
        v = "a block of five costs about as many of its own steps with the 4-bit target"
    if abs(speedup_int4 - speedup_bfloat16) <= 0.01 * speedup_bfloat16:
        s = "about the same"
    else:
        s = "smaller" if speedup_int4 < speedup_bfloat16 else "larger"
    below = " (below 1: slower than the target alone)" if speedup_int4 < 1 else ""
    return f"{v}, and FlashHead deferred's speedup over its own target-only decoding is {s}{below}"


def auto_pick(auto: str, ms_float32: float, ms_bfloat16: float) -> str:
    """Whether ``DTYPE: auto``'s pick is the one where FlashHead deferred spends fewer ms per token."""
    if ms_float32 != ms_float32 or ms_bfloat16 != ms_bfloat16:
        return f"DTYPE auto picks {auto} there; the document did not decode in both precisions, so the pick is untested"
    faster, slower = ("float32", "bfloat16") if ms_float32 <= ms_bfloat16 else ("bfloat16", "float32")
    ratio = max(ms_float32, ms_bfloat16) / min(ms_float32, ms_bfloat16)
    verb = "is" if auto == faster else "is not"
    return (f"DTYPE auto picks {auto} there, which {verb} the faster of the two: FlashHead deferred spends "
            f"{ms_float32:.0f} ms per token in float32 and {ms_bfloat16:.0f} ms in bfloat16 ({slower} "
            f"{ratio:.2f} times {faster}'s)")


def layout_effect(step_block: float, step_row: float, v5_block: float, v5_row: float, sp_block: float,
                  sp_row: float, ms_block: float, ms_row: float) -> str:
    """float32's general (``block``) against one-row (``row``) layout: step ms and a block of five in steps, then
    FlashHead deferred's speedup and ms per token in each, the latter deciding the faster layout."""
    if any(x != x for x in (step_block, step_row, v5_block, v5_row)):
        return "the document comparing the two layouts is missing, so this is not measured here"
    block_ms, row_ms = v5_block * step_block, v5_row * step_row
    cheaper = "general" if block_ms < row_ms else "one-row"
    head = (f"a block of five costs {v5_block:.2f} steps ({block_ms:.0f} ms) in the general layout and {v5_row:.2f} "
            f"({row_ms:.0f} ms) in the one-row layout, so verification is cheaper in the {cheaper} layout, while one "
            f"step takes {step_block / step_row:.2f} times as long in the general layout as in the one-row one")
    if any(x != x for x in (sp_block, sp_row, ms_block, ms_row)):
        return head + "; the document decoded nothing end to end, so which layout decodes faster is not measured"
    pays = {lay: ("pays" if sp > 1 else "does not pay") + f" ({sp:.2f}x)" for lay, sp in
            (("general", sp_block), ("one-row", sp_row))}
    faster = "general" if ms_block < ms_row else "one-row"
    return (head + f"; FlashHead deferred {pays['general']} over target-only decoding in the general layout and "
            f"{pays['one-row']} in the one-row layout, and spends {ms_block:.0f} against {ms_row:.0f} ms per token, "
            f"so speculative decoding is faster in the {faster} layout here")


def padding_effect(step_padded: float, step_unpadded: float, base_padded: float, base_unpadded: float,
                   ms_padded: float, ms_unpadded: float) -> str:
    """Padding bf16 products of 1-4 rows to five: the target's step and both decodings' ms per token, padded and
    not; which decoding gains more decides whether FlashHead deferred's ratio rises or falls."""
    def change(padded: float, unpadded: float) -> str:
        if padded == unpadded:
            return "the same either way"
        return f"{unpadded / padded:.2f} times as fast" if padded < unpadded else f"slower ({padded:.0f} against {unpadded:.0f} ms)"

    if step_padded != step_padded or step_unpadded != step_unpadded:
        return "the document comparing the two is missing, so this is not measured here"
    step = f"padding makes the target's one-token step {change(step_padded, step_unpadded)}"
    if any(x != x for x in (base_padded, base_unpadded, ms_padded, ms_unpadded)):
        return step + "; the document decoded nothing end to end, so its effect on decoding is not measured"
    gain_base, gain_flash = base_unpadded / base_padded, ms_unpadded / ms_padded
    more = ("target-only decoding gains more, so FlashHead deferred's ratio over it falls" if gain_base > gain_flash
            else "FlashHead deferred gains at least as much, so its ratio over target-only does not fall")
    return (f"{step}, target-only decoding {change(base_padded, base_unpadded)} per token ({base_padded:.0f} against "
            f"{base_unpadded:.0f} ms) and FlashHead deferred {change(ms_padded, ms_unpadded)} ({ms_padded:.0f} "
            f"against {ms_unpadded:.0f} ms): {more}")


def unpadded_there(verify5: float) -> str:
    """Whether float32 left unpadded fits the CPU's curve: ``verify5`` > 1 means padding to five rows costs."""
    if verify5 != verify5:
        return "its verify curve is not measured, so whether padding would pay there is not known"
    if verify5 > 1:
        return (f"there a block of five costs {verify5:.2f} of a one-token step, so a step padded to five rows would "
                f"be longer")
    return (f"yet there a block of five costs only {verify5:.2f} of a one-token step, so padding might pay on that CPU "
            f"too: a rule to revisit")


def fastest_setting(*ms_per_token: float) -> str:
    """The setting with the fewest milliseconds per token among :data:`SETTINGS` (nan: not measured)."""
    got = [(ms, name) for ms, name in zip(ms_per_token, SETTINGS) if ms == ms]
    if not got:
        return "was not measured"
    ms, name = min(got)
    return f"{name} ({ms:.0f} ms per token)"

