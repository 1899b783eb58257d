"""The heads at batch B (:mod:`thesis_studies.serving.heads`'s document) as a table with intervals, and where
FlashHead's advantage over the dense head is gone."""

from __future__ import annotations

import pandas as pd

from thesis_lib.analysis.uncertainty import timing_interval

#: what the heads' names in a batch document mean on the page
HEAD_NAMES = {"dense": "dense", "flashhead": "FlashHead", "flashhead_shared": "FlashHead, shared rows"}


def batch_rows(doc: dict | None) -> pd.DataFrame:
    """One row per batch size: B, each head's median ms per call, each other head's speed over the base head (the
    ratio of mean times) with its 95 % bootstrap interval over the groups of states (``lo``/``hi`` kept as numbers
    for :func:`advantage_gone`), and the union of the probed clusters over one row's probes. A one-cell table
    where there is no document."""
    if not doc:
        return pd.DataFrame({"batch document": ["none (model-bench --parts batch)"]})
    base = doc["base"]
    rows = []
    for b, part in doc["by_batch"].items():
        row = {"B": int(b)}
        others = [k for k in part["times_ms"] if k != base]
        for k in [base, *others]:
            row[f"{HEAD_NAMES.get(k, k)} ms"] = part["stats"][k]["p50_ms"]
        for k in others:
            ci = timing_interval(part["times_ms"][base], part["times_ms"][k], part["groups"])
            name = HEAD_NAMES.get(k, k)
            row[f"{name} speedup"] = f"{ci['value']:.2f} [{ci['lo']:.2f}, {ci['hi']:.2f}]"
            row[f"{name} value"], row[f"{name} lo"], row[f"{name} hi"] = ci["value"], ci["lo"], ci["hi"]
        row["clusters / one row's"] = part["union"]["over_one_row"]
        rows.append(row)
    return pd.DataFrame(rows)


def shown(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`batch_rows` without the numeric interval columns (the page's table)."""
    return rows[[c for c in rows if not c.endswith((" value", " lo", " hi"))]]


def advantage_gone(rows: pd.DataFrame, head: str = "FlashHead") -> str:
    """Where ``head`` (a name of :data:`HEAD_NAMES`' values) first stops being faster than the dense head: the
    smallest batch whose interval lies below 1, else the smallest whose interval holds 1 ("cannot tell" there),
    else faster at every batch measured."""
    if "B" not in rows or f"{head} lo" not in rows:
        return "not measured"
    rows = rows.sort_values("B")
    below = rows[rows[f"{head} hi"] < 1]
    if len(below):
        return (f"{head} is first slower than the dense head at {_states(int(below['B'].iloc[0]))} per call "
                f"({below[f'{head} value'].iloc[0]:.2f}x)")
    unclear = rows[rows[f"{head} lo"] <= 1]
    if len(unclear):
        return (f"at {_states(int(unclear['B'].iloc[0]))} per call the data first cannot tell whether {head} is "
                f"faster than the dense head")
    return f"{head} stays faster at every batch measured, up to {_states(int(rows['B'].max()))} per call"


def _states(n: int) -> str:
    return "one state" if n == 1 else f"{n} states"


#: what batched decoding's modes are called on the page
MODE_NAMES = {"baseline": "target-only", "dense_ordinary": "dense, ordinary", "dense_deferred": "dense, deferred",
              "flash_ordinary": "FlashHead, ordinary", "flash_deferred": "FlashHead, deferred"}


def decode_rows(doc: dict | None) -> pd.DataFrame:
    """One row per batch size and mode of a batched-decoding document (:func:`thesis_studies.serving.heads.decode_by_batch`):
    tokens/s over all rows (decode time: the per-row prefills left out), the speed over batched target-only
    decoding at the same B with its 95 % bootstrap interval over the groups of prompts (``lo``/``hi`` kept), the
    median row's latency, the acceptance, the rows equal to target-only's, and the speed the round's cost model
    gives from the step costs measured at that B and the measured acceptance (:func:`_modelled`)."""
    if not doc:
        return pd.DataFrame({"batched decoding": ["none (serving-bench --parts decode)"]})
    rows = []
    for b, part in doc["by_batch"].items():
        base = part["decode_s"]["baseline"]
        for m in doc["modes"]:
            row = {"B": int(b), "mode": MODE_NAMES.get(m, m),
                   "tokens/s": sum(part["tokens"][m]) / sum(part["decode_s"][m]),
                   "row latency s": float(pd.Series(part["latency_s"][m]).median()),
                   "acceptance": float(pd.Series(part["acceptance"][m]).mean()) if part["acceptance"][m] else None,
                   "rows equal": f"{part['rows_equal'][m]}/{part['rows']}"}
            row["modelled"] = _modelled(m, part.get("costs_ms"), row["acceptance"], doc["k"])
            if m == "baseline":
                row.update({"speed": "1", "value": 1.0, "lo": 1.0, "hi": 1.0})
            else:
                ci = timing_interval(base, part["decode_s"][m], part["groups"])
                row.update({"speed": f"{ci['value']:.2f} [{ci['lo']:.2f}, {ci['hi']:.2f}]", "value": ci["value"],
                            "lo": ci["lo"], "hi": ci["hi"]})
            rows.append(row)
    return pd.DataFrame(rows)


def decode_shown(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`decode_rows` without the numeric interval columns."""
    return rows[[c for c in rows if c not in ("value", "lo", "hi")]]


def fastest_at(rows: pd.DataFrame, batch: int) -> dict | None:
    """The fastest speculative mode at ``batch`` (by its speed over target-only), with its interval and a verdict:
    ``faster``, ``slower`` or ``cannot tell`` (the interval holds 1). None where the batch was not measured."""
    at = rows[(rows.get("B") == batch) & (rows.get("mode") != MODE_NAMES["baseline"])] if "B" in rows else rows[:0]
    if not len(at):
        return None
    best = at.loc[at["value"].idxmax()]
    verdict = "faster" if best["lo"] > 1 else "slower" if best["hi"] < 1 else "cannot tell"
    return {"B": batch, "mode": best["mode"], "value": float(best["value"]), "lo": float(best["lo"]),
            "hi": float(best["hi"]), "verdict": verdict}


def speculation_gone(rows: pd.DataFrame) -> str:
    """The smallest batch at which no speculative mode is faster than batched target-only decoding (its best
    mode's interval holds 1 or lies below it), or that every batch measured still gains."""
    if "B" not in rows:
        return "not measured"
    for b in sorted(rows["B"].unique()):
        best = fastest_at(rows, int(b))
        if best and best["verdict"] != "faster":
            word = "is slower than" if best["verdict"] == "slower" else "cannot be told apart from"
            at = "one prompt at a time" if int(b) == 1 else f"{int(b)} prompts at once"
            return (f"from {at} on, the fastest speculative mode ({best['mode']}, {best['value']:.2f}x) {word} "
                    f"batched target-only decoding")
    return f"speculative decoding stays faster at every batch measured, up to {int(rows['B'].max())} prompts at once"


def _modelled(mode: str, costs: dict | None, acceptance: float | None, k: int) -> float | None:
    """Speed over target-only decoding under chapter 2's model with measured inputs: tokens per round
    E(acceptance, K) times one batched target step, over the round's cost at this B (K draft steps and the
    deferred verify over K + 1 tokens, or the ordinary verify over K plus an append)."""
    from thesis_lib.decoding.costs import expected_emitted, round_cost

    if mode == "baseline":
        return 1.0
    draft = mode.split("_")[0]
    if not costs or acceptance is None or f"{draft}_1" not in costs:
        return None
    step = costs["target_1"]
    if mode.endswith("deferred"):
        cost = round_cost(k, costs[f"{draft}_1"], costs[f"target_{k + 1}"])
    else:
        cost = round_cost(k, costs[f"{draft}_1"], costs[f"target_{k}"], step)
    return float(expected_emitted(acceptance, k)) * step / cost


def draft_step_rows(doc: dict | None) -> pd.DataFrame:
    """The whole draft step at batch B (one forward of B rows, one token each, greedy tokens read back), from a
    batched-decoding document's step costs: each draft's median ms and range over its timings, and the dense
    draft's median over FlashHead's."""
    if not doc:
        return pd.DataFrame({"draft step": ["none"]})
    rows = []
    for b, part in doc["by_batch"].items():
        c = part.get("costs_ms") or {}
        if "dense_1" not in c or "flash_1" not in c:
            continue
        times = c.get("times_ms", {})
        row = {"B": int(b)}
        for name, label in (("dense_1", "dense"), ("flash_1", "FlashHead")):
            ts = times.get(name) or [c[name]]
            row[f"{label} ms"] = c[name]
            row[f"{label} range"] = f"{min(ts):.1f}-{max(ts):.1f}"
        row["dense / FlashHead"] = c["dense_1"] / c["flash_1"]
        rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame({"draft step": ["none"]})


def heads_values(rows: pd.DataFrame) -> dict:
    """What chapter 7 says of the heads at batch B (:func:`batch_rows`): FlashHead's speed over the dense head with
    its interval at the smallest and the largest batch, the union of clusters and the shared-rows head there."""
    first, last = rows.iloc[0], rows.iloc[-1]
    out = {"heads_gone": advantage_gone(rows), "heads_b_max": int(last["B"]),
           "union_bmax": float(last["clusters / one row's"]), "shared_bmax": float(last["FlashHead, shared rows value"])}
    for key, row in (("b1", first), ("bmax", last)):
        out.update({f"heads_{key}_{part}": float(row[f"FlashHead {part}"]) for part in ("value", "lo", "hi")})
    return out


def gpu_batch_sentence(gpu: dict | None) -> str:
    """The heads at batch B on a GPU, from a saved gpu-check document's batch part (``gpu["gpu_check"]``), or why
    there is none: each call with its launches, and, where the part has them, both heads captured in CUDA graphs
    and timed on the device alone (where the first batch FlashHead loses to the dense head is named)."""
    check = (gpu or {}).get("gpu_check") or {}
    gb = check.get("batch_heads")
    if not gb:
        return "not measured yet: the saved GPU document predates gpu-check's batch part, which the next lent GPU runs"
    g = batch_rows(gb)
    said = (f"on the lent {check['versions'].get('gpu', 'GPU')} with random weights, each call timed with its "
            f"launches (not in a CUDA graph), FlashHead over the dense head is {g['FlashHead value'].iloc[0]:.2f}x at "
            f"one state and {g['FlashHead value'].iloc[-1]:.2f}x at {int(g['B'].iloc[-1])} ({advantage_gone(g)})")
    captured = (gb.get("captured") or {}).get("by_batch")
    if not captured:
        return said
    ratio = {int(b): part["ms"]["dense"] / part["ms"]["batched"] for b, part in captured.items()}
    sizes = sorted(ratio)
    slower = [b for b in sizes if ratio[b] < 1.0]
    where = (f"first slower than the dense head at {slower[0]} states" if slower
             else f"faster than the dense head at every batch up to {sizes[-1]}")
    return (said + "; with both heads captured in CUDA graphs and timed on the device alone, as a serving engine "
            "runs them, it is " + ", ".join(f"{ratio[b]:.2f}x at {b}" for b in sizes) + f" ({where})")


def decode_values(doc: dict, rows: pd.DataFrame, steps: pd.DataFrame, asked: int = 4) -> dict:
    """What chapter 7 says of batched decoding (:func:`decode_rows`, :func:`draft_step_rows`): the run's sizes, how
    many rows equal their one-row output, the fastest speculative mode at ``asked`` prompts at once (or the largest
    batch measured below it) with its interval and modelled speed, the step costs there and at the smallest batch
    (a target step in ms; the verify over K + 1 tokens and a FlashHead draft step in target steps), and the draft
    step's dense-over-FlashHead ratio at the smallest and largest batch."""
    out = {f"decode_{key}": doc[key] for key in ("k", "max_new_tokens", "prompts", "reps")}
    equal = sum(n for part in doc["by_batch"].values() for n in part["rows_equal"].values())
    total = sum(part["rows"] for part in doc["by_batch"].values()) * len(doc["modes"])
    out["decode_rows"] = total
    out["decode_lossless"] = (f"all {total} rows equal their prompt's one-row target-only output" if equal == total
                              else f"ONLY {equal} OF {total} ROWS EQUAL THEIR PROMPT'S ONE-ROW TARGET-ONLY OUTPUT")
    batches = sorted(int(b) for b in doc["by_batch"])
    at = max(b for b in batches if b <= asked) if batches[0] <= asked else batches[0]
    best = fastest_at(rows, at)
    out.update(batch_at=at, batch_best_mode=best["mode"], speculation_gone=speculation_gone(rows),
               **{f"batch_best_{part}": best[part] for part in ("value", "lo", "hi")})
    modelled = rows[(rows["B"] == at) & (rows["mode"] == best["mode"])]["modelled"].iloc[0]
    out["modelled_at"] = float("nan") if modelled is None else float(modelled)
    k = doc["k"]
    for key, b in (("first", batches[0]), ("at", at)):
        c = doc["by_batch"][str(b)]["costs_ms"]
        out.update({f"cost_{key}_step": c["target_1"], f"cost_{key}_verify": c[f"target_{k + 1}"] / c["target_1"],
                    f"cost_{key}_draft": c.get("flash_1", c.get("dense_1")) / c["target_1"]})
    out["cost_first_b"] = batches[0]
    out.update(draft_first_b=int(steps["B"].iloc[0]), draft_last_b=int(steps["B"].iloc[-1]),
               draft_first_ratio=float(steps["dense / FlashHead"].iloc[0]),
               draft_last_ratio=float(steps["dense / FlashHead"].iloc[-1]))
    return out


def part_text(batch: dict) -> str:
    """``model-bench``'s report of its ``batch`` part: the table with intervals, and whether FlashHead's advantage
    holds."""
    rows = batch_rows(batch)
    return "\n".join(["\nthe heads at batch B (ms per call; speedup: the dense head's time over each head's, 95 % interval)",
                      shown(rows).round(2).to_string(index=False), advantage_gone(rows)])
