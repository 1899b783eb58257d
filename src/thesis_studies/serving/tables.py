"""Longer generations and memory (``serving-bench``'s ``lengths`` and ``memory`` parts) as tables with intervals,
and the sentences the book glues from them. Batched decoding's tables live in :mod:`.batched`."""

from __future__ import annotations

import pandas as pd

from thesis_studies.serving.batch_tables import MODE_NAMES
from thesis_lib.analysis.uncertainty import reads, timing_interval

MIB = 2 ** 20


def length_rows(doc: dict | None) -> pd.DataFrame:
    """Per length N and speculative mode: tokens/s over all prompts (decode time), the speed over target-only
    decoding with its 95 % bootstrap interval over the prompts (``lo``/``hi`` kept), the prompts that ran to N
    tokens, and the outputs equal to target-only's."""
    if not doc:
        return pd.DataFrame({"longer generations": ["none (serving-bench --parts lengths)"]})
    rows = []
    for n, part in doc["by_length"].items():
        base = part["decode_s"]["baseline"]
        full = sum(t >= int(n) for t in part["tokens"]["baseline"])
        for m in doc["modes"]:
            if m == "baseline":
                continue
            ci = timing_interval(base, part["decode_s"][m], len(base))
            rows.append({"new tokens": int(n), "mode": MODE_NAMES.get(m, m),
                         "tokens/s": sum(part["tokens"][m]) / sum(part["decode_s"][m]),
                         "speed": f"{ci['value']:.2f} [{ci['lo']:.2f}, {ci['hi']:.2f}]",
                         "value": ci["value"], "lo": ci["lo"], "hi": ci["hi"],
                         "ran to N": f"{full}/{len(base)}", "equal": f"{part['equal'][m]}/{len(base)}"})
    return pd.DataFrame(rows)


def position_rows(doc: dict | None) -> pd.DataFrame:
    """Acceptance of the draft tokens proposed at each range of output positions, per speculative mode."""
    if not doc:
        return pd.DataFrame({"acceptance by position": ["none"]})
    e = doc["position_edges"]
    rows = []
    for i in range(len(e) - 1):
        row = {"output positions": f"{e[i]}-{e[i + 1] - 1}"}
        for m, c in doc["by_position"].items():
            d = c["drafted"][i]
            row[f"{MODE_NAMES.get(m, m)} acceptance"] = c["accepted"][i] / d if d else None
            row[f"{MODE_NAMES.get(m, m)} drafted"] = d
        rows.append(row)
    return pd.DataFrame(rows)


def head_share_rows(doc: dict | None) -> pd.DataFrame:
    """Per context length: the draft body's step, each head's time, and its share of a step (body + head)."""
    if not doc or "head_share" not in doc:
        return pd.DataFrame({"head share": ["none"]})
    rows = []
    for n, part in doc["head_share"].items():
        row = {"context tokens": int(n), "body ms": part["body_ms"]}
        for name in ("dense", "flashhead"):
            label = "dense head" if name == "dense" else "FlashHead"
            row[f"{label} ms"] = part[name]["head_ms"]
            row[f"{label} share"] = part[name]["share"]
        rows.append(row)
    return pd.DataFrame(rows)


def share_change(rows: pd.DataFrame, head: str = "dense head") -> dict | None:
    """The ``head``'s share of a draft step at the shortest and the longest context measured."""
    col = f"{head} share"
    if col not in rows:
        return None
    rows = rows.sort_values("context tokens")
    return {"short": int(rows["context tokens"].iloc[0]), "long": int(rows["context tokens"].iloc[-1]),
            "from": float(rows[col].iloc[0]), "to": float(rows[col].iloc[-1])}


def memory_rows(doc: dict | None, contexts=(256, 512), batch: int = 8) -> pd.DataFrame:
    """What each part holds, in MiB: the models' weights, FlashHead's tensors beside the dense head, the KV cache of
    one sequence at ``contexts`` tokens and of ``batch`` sequences at the longest, and each mode's peak resident
    memory and its rise over the memory held before the run."""
    if not doc:
        return pd.DataFrame({"memory": ["none (serving-bench --parts memory)"]})
    rows = [{"part": f"{name} weights", "MiB": b / MIB} for name, b in doc["models"].items()]
    fh = doc["flashhead"]
    rows.append({"part": "FlashHead's tensors (all)", "MiB": fh["total"] / MIB})
    rows += [{"part": f"  of which {name}", "MiB": b / MIB} for name, b in sorted(fh["tensors"].items(),
                                                                                 key=lambda x: -x[1]) if b >= MIB]
    rows.append({"part": "the draft's dense head (its storage)", "MiB": fh["dense_head"] / MIB})
    for name, kv in doc["kv"].items():
        for n in contexts:
            rows.append({"part": f"{name} KV cache, 1 sequence x {n} tokens", "MiB": kv["per_token"] * n / MIB})
        rows.append({"part": f"{name} KV cache, {batch} sequences x {max(contexts)} tokens",
                     "MiB": kv["per_token"] * max(contexts) * batch / MIB})
    for mode, p in doc["peak"].items():
        name = MODE_NAMES.get(mode.removeprefix("batched_"), mode)
        label = f"peak resident, {name}" + (f", {p['rows']} prompts at once" if p["rows"] > 1 else "")
        rows.append({"part": label, "MiB": p["peak"] / MIB if p.get("peak") else None, "rise MiB": _rise(p)})
    return pd.DataFrame(rows)


def _rise(peak: dict) -> float | None:
    """MiB a run's peak resident memory rose above what the process held before it (None where not read)."""
    return (peak["peak"] - peak["before"]) / MIB if peak.get("peak") and peak.get("before") else None


def memory_values(doc: dict, batch: int) -> dict:
    """What chapter 7 says of memory: FlashHead's tensors (MiB, and % of the draft's weights) beside the dense head,
    KV KiB per token of each model and MiB of both caches for ``batch`` sequences of 4,096 tokens, the memory held
    before the runs, the models' tensors, and the largest rise during a run."""
    fh, kv, before = doc["flashhead"], doc["kv"], doc["peak"]["baseline"].get("before")
    rises = [r for r in map(_rise, doc["peak"].values()) if r is not None]
    return {"fh_mib": fh["total"] / MIB, "fh_dense_mib": fh["dense_head"] / MIB,
            "fh_share_draft": 100 * fh["total"] / doc["models"]["draft"],
            "kv_target_kib": kv["target"]["per_token"] / 1024, "kv_draft_kib": kv["draft"]["per_token"] / 1024,
            "kv_batch_4096_mib": (kv["target"]["per_token"] + kv["draft"]["per_token"]) * 4096 * batch / MIB,
            "memory_batch": batch, "resident_mib": before / MIB if before else float("nan"),
            "models_mib": sum(doc["models"].values()) / MIB, "max_rise": max(rises) if rises else float("nan")}


def length_values(doc: dict, lengths: pd.DataFrame, positions: pd.DataFrame, shares: pd.DataFrame) -> dict:
    """What chapter 7 says of longer generations: the FlashHead draft's speedup with its interval at the shortest
    and the longest length, its acceptance in the first and last position bins, and the dense head's share of a
    draft step at the shortest and longest context."""
    flash = lengths[lengths["mode"] == MODE_NAMES["flash_deferred"]].sort_values("new tokens")
    out = {"length_prompts": doc["prompts"]}
    for key, row in (("short", flash.iloc[0]), ("long", flash.iloc[-1])):
        out[f"len_{key}"] = int(row["new tokens"])
        out.update({f"len_{key}_{part}": float(row[part]) for part in ("value", "lo", "hi")})
    change = share_change(shares)
    out.update(share_short=change["from"], share_long=change["to"], share_short_pct=100 * change["from"],
               share_long_pct=100 * change["to"], ctx_short=change["short"], ctx_long=change["long"])
    acc = positions[f"{MODE_NAMES['flash_deferred']} acceptance"]
    out.update(acc_first_bin=float(acc.iloc[0]), acc_last_bin=float(acc.iloc[-1]),
               first_bin=positions["output positions"].iloc[0], last_bin=positions["output positions"].iloc[-1])
    return out


def batched_verdict(lo: float, hi: float) -> str:
    """How the fastest speculative mode compares with batched target-only decoding at one batch size, by the
    interval of its speed over it."""
    return reads(lo, hi, "faster than batched target-only decoding", "slower than batched target-only decoding",
                 "not distinguishable from batched target-only decoding with these prompts")


def length_trend(short_lo: float, short_hi: float, long_lo: float, long_hi: float) -> str:
    """Whether the speedup at the longest generation differs from the shortest's, by their intervals: a direction
    only where they do not overlap."""
    if long_lo > short_hi:
        return "higher for the longest generations than for the shortest"
    if long_hi < short_lo:
        return "lower for the longest generations than for the shortest"
    return "not distinguishable between the shortest and the longest generations (the intervals overlap)"


def share_trend(share_short: float, share_long: float) -> str:
    """How the draft head's share of a step moves from the shortest to the longest context: falls or rises where the
    medians differ by more than a tenth, else stays."""
    if share_long < 0.9 * share_short:
        return "falls"
    if share_long > 1.1 * share_short:
        return "rises"
    return "stays within a tenth of where it was"


def model_gap(measured: float, modelled: float) -> str:
    """How a measured speed compares with the round's cost model's: below or above it where they differ by more
    than a tenth of the model's value, else within a tenth; no model where none was computed."""
    if modelled != modelled:
        return "has no model to compare with (no step costs recorded)"
    if measured < 0.9 * modelled:
        return "lies below the model's"
    if measured > 1.1 * modelled:
        return "lies above the model's"
    return "lies within a tenth of the model's"


def exactness(doc: dict) -> str:
    """How a serving document's rows relate to one-row decoding, from the attention and precision it records:
    bit for bit where attention is row-exact and the linear layers compute each row alone at any batch (the
    weight-only formats), by the loader's probe of blocks up to 13 rows for other CPU kernels, else only up to
    rounding."""
    from thesis_lib.models.weight_only import FORMATS

    if not str(doc.get("attention") or "").startswith("row-exact"):
        return ("attention here is the model's own batched kernel, so a row's logits can differ from its one-row "
                "decoding in the last bits, and a row's output can part from its target-only output where the "
                "target's top two logits nearly tie")
    if doc.get("precision") in FORMATS:
        return ("each row and position goes through the same attention call that a one-token step makes, and the "
                "weight-only kernels compute every row of a batch alone, so a row's logits equal, bit for bit, "
                "those of decoding that prompt by itself")
    return ("each row and position goes through the same attention call that a one-token step makes; the linear "
            "layers compute a row alone where the loader's probe says so, which covers blocks of up to 13 rows "
            f"(probe: {'held' if doc.get('rows_exact') else 'failed'} here), not every batch")


def rise_verdict(max_rise_mib: float) -> str:
    """What the largest rise of resident memory during a mode's run says: under one MiB, the runs' caches and
    activations fit in memory the process already held; else the runs needed that much more."""
    if max_rise_mib != max_rise_mib:
        return "the peak was not read on this system"
    if max_rise_mib < 1:
        return "the runs' caches and activations fit in memory the process already held"
    return "the runs needed that much memory beyond what the process held"


#: glued verdict key -> (function, {parameter: glued key}) (:data:`thesis_lib.analysis.verdicts.RULES`)
RULES = {
    "ch7_serving": {
        "batch_verdict": (batched_verdict, dict(lo="batch_best_lo", hi="batch_best_hi")),
        "model_verdict": (model_gap, dict(measured="batch_best_value", modelled="modelled_at")),
        "length_verdict": (length_trend, dict(short_lo="len_short_lo", short_hi="len_short_hi",
                                              long_lo="len_long_lo", long_hi="len_long_hi")),
        "share_verdict": (share_trend, dict(share_short="share_short", share_long="share_long")),
        "rise_verdict": (rise_verdict, dict(max_rise_mib="max_rise")),
    },
}
