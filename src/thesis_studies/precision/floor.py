"""Chapter 2's byte floor: a decode step's weights over the rate this machine reads memory, each precision's steps
over it (:func:`floor_rows`), and what a document that measured the weight-only formats beside float32 says
(:func:`weight_only`, :func:`fastest_precision`, the latter with a paired bootstrap interval over the prompts)."""

from __future__ import annotations

import pandas as pd

from thesis_lib.bench.environment import capability
from thesis_studies.precision.tables import flash_costs


#: the columns of :func:`floor_rows`, short enough for the page
FLOOR_COLUMNS = {"doc": "document (its number in the list)", "precision": "the precision",
                 "GB": "the target's weights read per step", "step ms": "the target's one-token step",
                 "/ floor": "that step over its floor", "5 tok / step": "a block of five over one step",
                 "draft / floor": "the draft's step over its floor",
                 "FH def. ms/tok": "FlashHead deferred decoding, ms per token", "equal": "outputs equal to target-only"}


def floor_rows(docs: list[tuple[dict, str]]) -> pd.DataFrame:
    """The byte floor per precision of each ``(document, label)`` (none: a one-cell table saying so) (:data:`FLOOR_COLUMNS`): a step's weights over
    the machine's 1 GiB read rate; the target's one-token step, over its floor, a block of five over the step; the
    draft's step over its floor; FlashHead deferred ms per token and how many outputs equalled target-only output.
    One row per precision."""
    nan = float("nan")
    if not docs:
        return pd.DataFrame({"weight-only documents": ["none named (PRECISION_FILES_WEIGHT_ONLY)"]})
    rows = []
    for doc, label in docs:
        bw = doc.get("bandwidth") or {}
        stream = bw.get("stream_read_gbps")
        e2e = (doc.get("end_to_end") or {}).get("summary") or {}
        prompts = (doc.get("end_to_end") or {}).get("prompts")

        def over_floor(name: str) -> float:
            nbytes = (bw.get("step_bytes") or {}).get(name)
            return _curve_ms(doc, name)[1] / (nbytes / stream / 1e6) if nbytes and stream else nan

        for p in doc["precisions"]:
            ms = _curve_ms(doc, f"target/{p}")
            nbytes = (bw.get("step_bytes") or {}).get(f"target/{p}")
            costs = flash_costs(doc, p)
            rows.append({"doc": label, "precision": p, "GB": nbytes / 1e9 if nbytes else nan, "step ms": ms[1],
                         "/ floor": over_floor(f"target/{p}"), "5 tok / step": ms[5] / ms[1] if 5 in ms else nan,
                         "draft / floor": over_floor(f"draft/{p}"),
                         "FH def. ms/tok": costs["flash_ms_token"] if costs else nan,
                         "equal": (f"{e2e[p]['vs_baseline']['flash_deferred']['equal_outputs']}/{prompts}"
                                   if p in e2e else "not run")})
    return pd.DataFrame(rows, columns=list(FLOOR_COLUMNS))


def _curve_ms(doc: dict, name: str) -> dict[int, float]:
    return {int(n): float(v) for n, v in doc["verify"][name]["ms"].items()}


#: the low-byte formats chapter 2 describes, with the prefix of their glued names
FORMAT_PREFIXES = (("int8-weights", "wo_"), ("int8-dynamic", "dyn_"))


def kernel_path_of(doc: dict, fmt: str) -> str:
    """Which of the kernel's paths a document ran ``fmt`` on: "AVX2" where its loader said so (forced, or a CPU
    without AVX-512), else "own"."""
    return "AVX2" if any("AVX2 kernel" in k for k in (doc.get("kernels") or {}).get(fmt, ())) else "own"


def weight_only(doc: dict | None, fmt: str = "int8-weights", prefix: str = "wo_") -> dict:
    """Glued numbers (names prefixed ``prefix``) of a document that measured ``fmt`` beside ``float32``: the
    target's step over float32's (and over bfloat16's and int8-weights' where measured), its block of five in
    steps (and int8-weights' in the same document), its step over the byte floor, the fastest precision end to end and whether the target-only text was the
    same in every precision. NaN (and "not measured") without such a document."""
    nan = float("nan")
    keys = ("step_over_f32", "step_over_bf16", "step_over_wo", "verify5", "verify5_wo", "floor", "step_ms",
            "f32_step_ms", "stream_gbps")
    if not doc or fmt not in doc.get("precisions", ()) or "float32" not in doc["precisions"]:
        return {**{prefix + k: nan for k in keys}, prefix + "fastest": "not measured", prefix + "cpu": "not measured",
                prefix + "same_text": "not measured"}
    ms = {p: _curve_ms(doc, f"target/{p}") for p in doc["precisions"]}
    bw = doc["bandwidth"]
    floor = bw["step_bytes"][f"target/{fmt}"] / bw["stream_read_gbps"] / 1e6
    step = ms[fmt][1]
    out = {"step_over_f32": ms["float32"][1] / step,
           "step_over_bf16": ms["bfloat16"][1] / step if "bfloat16" in ms else nan,
           "step_over_wo": ms["int8-weights"][1] / step if "int8-weights" in ms else nan,
           "verify5": ms[fmt][5] / step, "floor": step / floor, "step_ms": step,
           "verify5_wo": ms["int8-weights"][5] / ms["int8-weights"][1] if "int8-weights" in ms else nan,
           "f32_step_ms": ms["float32"][1], "stream_gbps": bw["stream_read_gbps"], "cpu": capability(doc),
           "fastest": fastest_precision(doc)}
    e2e = doc.get("end_to_end") or {}
    same = (e2e.get("summary") or {}).get("same_text_across_precisions")
    out["same_text"] = f"{same} of {e2e['prompts']}" if same is not None else "not measured"
    return {prefix + k: v for k, v in out.items()}


def weight_only_glued(docs: list[tuple[dict, str]]) -> dict:
    """Chapter 2's glued values from ``PRECISION_FILES_WEIGHT_ONLY``: the documents' labels (``wo_sources``), and
    for each of :data:`FORMAT_PREFIXES` the :func:`weight_only` values of the first document that ran it on the
    CPU's own kernel path, and of the first that ran it on the AVX2 path (prefixed ``avx2_``), with each one's
    number in the list (``<prefix>doc``)."""
    docs = list(docs)
    out = {"wo_sources": "; ".join(label for _, label in docs) or "no weight-only document named"}
    for fmt, prefix in FORMAT_PREFIXES:
        for path, extra in (("own", ""), ("AVX2", "avx2_")):
            at = next((i for i, (d, _) in enumerate(docs)
                       if fmt in d.get("precisions", ()) and kernel_path_of(d, fmt) == path), None)
            out.update({extra + k: v for k, v in weight_only(None if at is None else docs[at][0], fmt, prefix).items()})
            out[f"{extra}{prefix}doc"] = "none" if at is None else str(at + 1)  # its number in the floor table
    return out


def fastest_precision(doc: dict, mode: str = "flash_deferred") -> str:
    """Which precision decodes ``mode`` in the least time over the document's prompts, and its speed over the next
    one's with a paired bootstrap interval over the prompts (:func:`thesis_lib.analysis.uncertainty.bootstrap`);
    "cannot tell" where that interval holds 1."""
    import numpy as np

    from thesis_lib.analysis.uncertainty import bootstrap, side

    rows = (doc.get("end_to_end") or {}).get("rows") or []
    precisions = [p for p in doc["precisions"] if rows and all(f"{p}/{mode}" in r for r in rows)]
    if len(precisions) < 2:
        return "not measured (fewer than two precisions decoded end to end)"
    seconds = {p: np.array([r[f"{p}/{mode}"]["seconds"] / r[f"{p}/{mode}"]["tokens"] for r in rows])
               for p in precisions}
    best, nxt = sorted(precisions, key=lambda p: seconds[p].sum())[:2]
    ci = bootstrap([np.array([[a, b]]) for a, b in zip(seconds[nxt], seconds[best])], lambda v: v[0] / v[1])
    ms = {p: 1e3 * seconds[p].mean() for p in (best, nxt)}
    said = (f"{best} ({ms[best]:.0f} ms per token with the FlashHead draft and deferred verification) over {nxt} "
            f"({ms[nxt]:.0f} ms): {ci['value']:.2f}x, 95 % interval {ci['lo']:.2f}-{ci['hi']:.2f} over "
            f"{len(rows)} prompts")
    if side(ci["lo"], ci["hi"]) <= 0:
        return f"cannot tell which precision is the fastest: {said}"
    return f"the fastest is {said}"


#: the parts of a step the profile table shows, in ms, and the ones with a byte floor beside them
STEP_PARTS = ("linear", "attention", "norms", "activation", "other", "head")
_OVERHEAD = ("attention", "norms", "activation", "rotary_table", "embedding", "other")


def step_rows(doc: dict | None) -> pd.DataFrame:
    """``thesis-lib studies step-profile``'s steps (none: a one-cell table saying so; the ``<switch> off`` halves of a
    comparison left out): each step's time without the hooks,
    each part with the hooks (ms, medians), the linear layers', attention's and the head's byte floors, the aten
    operations of one forward."""
    if not doc:
        return pd.DataFrame({"step profile": ["none named (STEP_PROFILE_FILE)"]})
    rows = []
    for name, step in doc["steps"].items():
        if name.endswith(tuple(f", {w} off" for w in SWITCH_NAMES)):  # a comparison's other half: switch_rows
            continue
        ms, floor = step["ms"], step["floor_ms"]
        row = {"step": name, "ms": ms["bare_body"] + ms["bare_head"]}
        for part in STEP_PARTS:
            row[part] = ms[part]
            if part in ("linear", "head"):
                row[f"{part} floor"] = floor[part]
        row["aten ops"] = step["aten_ops"]
        rows.append(row)
    return pd.DataFrame(rows)


def step_glued(doc: dict | None) -> dict:
    """The profile's numbers for the page (``sp_*``; nan without a document): the FlashHead draft's step and the
    target's in ms and their ratio (and the same draft's in another precision, where the profile has one); the
    draft's linear layers over their floor; what of the draft's body is neither weights nor head (ms, share of the
    hooked body, µs per aten operation); a block of five over one step, and how much of its growth the linear
    layers, attention and the head take; the target-only loop's time beyond its model."""
    nan = float("nan")
    keys = ("draft_ms", "target_ms", "ratio", "linear_over_floor", "overhead_ms", "overhead_share", "ops",
            "us_per_op", "block5", "growth_linear", "growth_attention", "growth_head", "loop_beyond_share",
            "stream_gbps", "other_draft_ms", "other_ratio")
    if not doc:
        return {f"sp_{k}": nan for k in keys} | {"sp_other_label": "no other draft",
                                                 "sp_other_said": "no other precision of the draft was profiled"}
    steps = doc["steps"]
    draft, one, five = steps["draft, FlashHead"], steps["target, block of 1"], steps["target, block of 5"]
    bare = {name: s["ms"]["bare_body"] + s["ms"]["bare_head"] for name, s in steps.items()}
    overhead = sum(draft["ms"][p] for p in _OVERHEAD)
    grow = bare["target, block of 5"] - bare["target, block of 1"]
    other = next((name for name in steps if name.startswith("draft (") and name.endswith("), FlashHead")), None)
    label = other[len("draft ("):-len("), FlashHead")] if other else "no other draft"
    other_ms = bare[other] if other else nan
    other_ratio = other_ms / bare["target, block of 1"]
    said = (f"the same draft with {label} weights took {other_ms:.1f} ms, {other_ratio:.2f} of a target step"
            if other else "no other precision of the draft was profiled")
    return {"sp_other_label": label, "sp_other_said": said, "sp_other_draft_ms": other_ms, "sp_other_ratio": other_ratio,
            "sp_draft_ms": bare["draft, FlashHead"], "sp_target_ms": bare["target, block of 1"],
            "sp_ratio": bare["draft, FlashHead"] / bare["target, block of 1"],
            "sp_linear_over_floor": draft["ms"]["linear"] / draft["floor_ms"]["linear"],
            "sp_overhead_ms": overhead, "sp_overhead_share": overhead / draft["ms"]["body"],
            "sp_ops": float(draft["aten_ops"]), "sp_us_per_op": 1000 * overhead / draft["aten_ops"],
            "sp_block5": bare["target, block of 5"] / bare["target, block of 1"],
            **{f"sp_growth_{p}": (five["ms"][p] - one["ms"][p]) / grow for p in ("linear", "attention", "head")},
            "sp_loop_beyond_share": doc["loop"]["beyond_share"], "sp_stream_gbps": doc["stream_gbps"]}


#: what a profile's ``--compare`` switched off, as tables name it
SWITCH_NAMES = {"fused": "fused operations", "compact": "compact step", "native": "layers in one call",
                "head-kernel": "FlashHead kernel"}
#: the letter each switch's glued values carry (``sp<letter>_*``)
SWITCH_KEYS = {"fused": "f", "compact": "c", "native": "n", "head-kernel": "h"}


def switch_rows(doc: dict | None, switch: str = "fused") -> pd.DataFrame:
    """A profile run with ``--compare <switch>``: per step, its time with ``switch`` off over its time with it on
    (the mean over repetitions, each repetition timing both), with a bootstrap interval over repetitions. The
    compact step needs the fused operations, so a step without them runs through the modules: they are set against
    the step's "compact off" twin where the profile has one (the modules with them), else against the step."""
    from thesis_lib.analysis.uncertainty import timing_interval

    what = SWITCH_NAMES[switch]
    rows = []
    for name, step in ((doc or {}).get("steps") or {}).items():
        off = doc["steps"].get(f"{name}, {switch} off")
        if off is None:
            continue
        if switch == "fused":
            step = doc["steps"].get(f"{name}, compact off", step)
        iv = timing_interval(off["bare_ms"], step["bare_ms"], 1)
        rows.append({"step": name, f"ms, {what}": sum(step["bare_ms"]) / len(step["bare_ms"]),
                     f"ms, no {what}": sum(off["bare_ms"]) / len(off["bare_ms"]), "speedup": iv["value"],
                     "lo": iv["lo"], "hi": iv["hi"]})
    return pd.DataFrame(rows) if rows else pd.DataFrame({what: ["not compared in this profile"]})


def switch_glued(doc: dict | None, switch: str = "fused") -> dict:
    """What ``switch`` buys the FlashHead draft's step, the target's one-token step and its block of five: each
    speedup with its interval (``spf_*`` for the fused operations, ``spc_*`` for the compact step, ``spn_*`` for its
    layers in one call, ``sph_*`` for FlashHead's kernel; nan where the profile did not compare them)."""
    rows = switch_rows(doc, switch)
    out = {}
    for key, name in (("draft", "draft, FlashHead"), ("target1", "target, block of 1"), ("target5", "target, block of 5")):
        row = rows[rows["step"] == name] if "step" in rows else rows.iloc[0:0]
        for part in ("speedup", "lo", "hi"):
            out[f"sp{SWITCH_KEYS[switch]}_{key}_{part}"] = float(row[part].iloc[0]) if len(row) else float("nan")
    return out
