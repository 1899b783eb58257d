"""What a finished book build cost, and the cost coefficients fitted from such builds (the planner's inputs,
:mod:`~thesis_lib.book.sizing`).

:func:`build_costs` splits a build's wall time by what it grows with: each run's prefill, decode and the rest of its
wall time, on the main prompts and on ``SWEEP_PROMPTS`` prompts, and the rest of the build. :func:`fit` turns
reference builds of that form into :class:`Costs`, the coefficients of the planner's formula.

Two refinements, where the reference builds allow them (:func:`model`):

- **Precision.** A build's time scales with this machine's step time only among builds of the same precisions
  (``precision``: the target's and the draft's, as ``auto`` resolved): an int8 prefill shrinks less than an int8 step
  against bfloat16, and the notebooks' own work (loading, calibration, rendering) not at all. The builds of this
  machine's precisions are fitted where there are any; else all of them.
- **This machine.** Where a build of this machine (and these precisions) is recorded, the newest such build alone is
  the model, at its own speed (:func:`newest_of`): no step is timed and no other build scaled.
- **Notebooks.** A build that knows its notebooks (``notebooks``: each one's seconds, and the runs it made, split as
  above) is fitted per notebook: each notebook's runs and the rest of its time by the same formula, and what lies
  outside the notebooks (rendering, the step timing) as a fixed part. The plan then predicts each chapter, and a
  build's record shows each chapter predicted against measured.
"""

from __future__ import annotations

import datetime
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

COST_PROMPTS = 3  # prompts the step costs are measured on
RUN_PARTS = ("main_prefill", "main_decode", "main_overhead", "sweep_prefill", "sweep_decode", "sweep_overhead")
#: the part of a per-notebook model outside every notebook (rendering, start-up)
OUTSIDE = "outside notebooks"


@dataclass(frozen=True)
class Costs:
    """A build's time by what it grows with (seconds at the reference's speed; see the module's formula)."""

    fixed: float
    per_generation: float  # per main prompt x iteration
    per_token: float  # per main prompt x new token x iteration
    sweep_per_prompt: float = 0.0  # per sweep prompt, whatever the length (the runs on SWEEP_PROMPTS prompts)
    sweep_per_token: float = 0.0  # per sweep prompt x new token
    other_per_token: float = 0.0  # per new token at the reference's prompt count, outside the runs
    reference_prompts: int = 7


def _line(ts: list[float], ys: list[float], *, through_origin: bool) -> tuple[float, float]:
    """Intercept and slope of ``ys`` over ``ts`` (least squares); with one distinct ``t`` (or a negative slope,
    noise larger than the effect) all of it is slope (``through_origin``) or all intercept."""
    if len(set(ts)) > 1:
        slope, intercept = statistics.linear_regression(ts, ys)
        if slope >= 0 and intercept >= 0:
            return intercept, slope
    if through_origin:
        return 0.0, statistics.fmean(y / t for y, t in zip(ys, ts))
    return statistics.fmean(ys), 0.0


def fit(builds: list[dict]) -> Costs:
    """The cost coefficients from reference builds (:func:`build_costs`' documents), each brought to the first
    build's speed by its step time. A main generation's decode and a sweep prompt's are split into a part per
    generation and one per token by their lengths across builds (with one length, all per token); a sweep prompt's
    prefill is per prompt; the work outside the runs (the sweep runs' loading and warm-up included) into a fixed part
    and one per token the same way (with one length, all fixed)."""
    if not builds:
        raise ConfigError("No reference build to size the sample from.")
    base = builds[0]["step_s"]
    ts, gen, dec, spf, swp, oth = [], [], [], [], [], []
    for b in builds:
        s, parts = b["sizes"], {k: v * base / b["step_s"] for k, v in b["parts_s"].items()}
        runs = s["prompts"] * s["iterations"]
        ts.append(s["new_tokens"])
        gen.append((parts["main_prefill"] + parts["main_overhead"]) / runs)
        dec.append(parts["main_decode"] / runs)
        sweeps = s["sweep_prompts"]
        spf.append(parts["sweep_prefill"] / sweeps)
        swp.append(parts["sweep_decode"] / sweeps)
        oth.append(parts["other"] + parts["sweep_overhead"])
    dec_a, dec_b = _line(ts, dec, through_origin=True)
    swp_a, swp_b = _line(ts, swp, through_origin=True)
    oth_a, oth_b = _line(ts, oth, through_origin=False)
    return Costs(fixed=oth_a, per_generation=statistics.fmean(gen) + dec_a, per_token=dec_b,
                 sweep_per_prompt=statistics.fmean(spf) + swp_a, sweep_per_token=swp_b, other_per_token=oth_b,
                 reference_prompts=builds[0]["sizes"]["prompts"])


def _recorded(env: dict) -> float:
    return datetime.datetime.strptime(env["recorded_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()


def build_costs(runs_dir: Path, values: dict, total_s: float, *, started: float | None = None,
                measure_s: float = 0.0, steps: dict[str, float] | None = None,
                notebooks: list[dict] | None = None, cost_prompts: list[str] | None = None) -> dict | None:
    """One finished build's costs from the run folders of ``values`` (its resolved parameters) in ``runs_dir``:
    the folders of this set's pair and sizes (``<SET_NAME>-*``), each run's generation split into prefill and decode
    (every sample's), the rest of its wall time its overhead; a run on ``SWEEP_PROMPTS`` prompts is sweep work, any
    other main-prompt work; ``other`` is what remains of ``total_s`` (less ``measure_s``, the step timing). With
    ``started`` (a time stamp), None where any of those folders was written before it (a build that reused runs).
    The step time per prompt, ``steps`` (what the planner measured as the build began; the same measurement a later
    plan makes) or else the main run's (target plus draft step of its baseline samples on ``cost_prompts`` where
    it ran them all, else on its first :data:`COST_PROMPTS` prompts), sets the build's speed by its median. With ``notebooks`` (the build's notebooks in
    order, each ``{"notebook", "started" (a time stamp), "seconds"}``), each run is charged to the notebook that was
    running when it began, and ``notebooks`` in the result gives each one's seconds and parts (``other``: the rest of
    its time)."""
    parts = dict.fromkeys(RUN_PARTS, 0.0)
    by_notebook = {n["notebook"]: dict.fromkeys(RUN_PARTS, 0.0) for n in notebooks or ()}
    sizes, step_by_prompt = None, {}
    for cfg_path in sorted(Path(runs_dir).glob(f"{values['SET_NAME']}-*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        env = json.loads((cfg_path.parent / "environment.json").read_text())
        sweep = cfg.get("prompts") == values["SWEEP_PROMPTS"]
        if (cfg["target"], cfg["max_new_tokens"]) != (values["TARGET"], values["MAX_NEW_TOKENS"]) or (
                not sweep and (cfg["per_category"], cfg["iterations"]) != (values["PER_CATEGORY"],
                                                                           values["ITERATIONS"])):
            continue  # another set's or another sample's run
        if started is not None and _recorded(env) < started:
            return None
        rows = [json.loads(line) for line in (cfg_path.parent / "samples.jsonl").read_text().splitlines() if line]
        kind = "sweep" if sweep else "main"
        prefill, decode = sum(r["ttft_s"] for r in rows), sum(r["decode_s"] for r in rows)
        split = {f"{kind}_prefill": prefill, f"{kind}_decode": decode,
                 f"{kind}_overhead": max(0.0, env["machine"]["wall_s"] - prefill - decode)}
        owner = _owner(notebooks or (), _recorded(env))
        for k, v in split.items():
            parts[k] += v
            if owner is not None:
                by_notebook[owner][k] += v
        if cfg_path.parent.name.startswith(f"{values['SET_NAME']}-bench-"):
            qids = list(dict.fromkeys(r["question_id"] for r in rows))
            sizes = {"prompts": len(qids), "new_tokens": cfg["max_new_tokens"], "iterations": cfg["iterations"],
                     "sweep_prompts": values["SWEEP_PROMPTS"]}
            step = {r["question_id"]: r["component_costs_s"] for r in rows
                    if r["mode"] == "baseline" and r["iteration"] == 0}
            timed = cost_prompts if cost_prompts and all(q in step for q in cost_prompts) else qids[:COST_PROMPTS]
            step_by_prompt = {q: step[q]["target_step_s"] + step[q]["draft_step_s"] for q in timed}
    if sizes is None:
        raise ConfigError(f"No main run ({values['SET_NAME']}-bench-*) of these sizes in {runs_dir}.")
    parts["other"] = total_s - measure_s - sum(parts.values())
    step_by_prompt = steps or step_by_prompt
    doc = {"sizes": sizes, "total_s": round(total_s, 1), "measure_s": round(measure_s, 1),
           "parts_s": {k: round(v, 1) for k, v in parts.items()},
           "step_by_prompt_s": {q: round(v, 5) for q, v in step_by_prompt.items()},
           "step_s": round(statistics.median(step_by_prompt.values()), 5)}
    if notebooks:
        doc["notebooks"] = {}
        for n in notebooks:
            runs = by_notebook[n["notebook"]]
            doc["notebooks"][n["notebook"]] = {"seconds": n["seconds"], "parts_s": {
                **{k: round(v, 1) for k, v in runs.items()}, "other": round(n["seconds"] - sum(runs.values()), 1)}}
    return doc


def _owner(notebooks, at: float) -> str | None:
    """The notebook that was running at time stamp ``at`` (each ``{"notebook", "started", "seconds"}``), if any."""
    return next((n["notebook"] for n in notebooks if n["started"] <= at <= n["started"] + n["seconds"]), None)


def matching(builds: list[dict], precision: str) -> list[dict]:
    """The builds made with ``precision`` (the target's and the draft's, ``"<target>/<draft>"``), where there are
    any; else all of them."""
    same = [b for b in builds if b.get("precision") == precision]
    return same or list(builds)


def newest_of(builds: list[dict], machine: str, precision: str) -> list[dict]:
    """The newest of ``builds`` (the last in the list) made on ``machine`` (as :func:`~.sizing.machine` names it) with
    ``precision`` (as :func:`matching`'s), as a list of one; empty where none was. Such a build is the planner's whole model on that machine: a build's time
    does not follow the step time across revisions of the code (the loop's other modes, the prefills and the
    notebooks' own work change differently or not at all), and the newest build ran the newest code."""
    return [b for b in builds if (b.get("machine"), b.get("precision")) == (machine, precision)][-1:]


def model(builds: list[dict]) -> dict[str, Costs]:
    """The planner's cost model from reference builds (already :func:`matching` this machine): per notebook, and
    :data:`OUTSIDE` for the rest, where every build knows its notebooks (the notebooks all of them ran); else one
    :class:`Costs` for the whole build, under the key ``"build"``. The predictions of the parts add up."""
    if not builds or not all("notebooks" in b for b in builds):
        return {"build": fit(builds)}
    names = [n for n in builds[0]["notebooks"] if all(n in b["notebooks"] for b in builds)]
    out = {name: fit([{**b, "parts_s": b["notebooks"][name]["parts_s"]} for b in builds]) for name in names}
    outside = [{**b, "parts_s": {**dict.fromkeys(RUN_PARTS, 0.0), "other": b["total_s"] - b["measure_s"] - sum(
        b["notebooks"][n]["seconds"] for n in names)}} for b in builds]
    out[OUTSIDE] = fit(outside)
    return out


