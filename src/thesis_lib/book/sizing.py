"""The sample a book build can afford on this machine: the default set's sizes (``PER_CATEGORY``, ``MAX_NEW_TOKENS``,
``ITERATIONS``) may be ``auto``, and :func:`plan` then measures this machine's step costs, scales a reference
build's measured costs by them, and picks the largest sample whose predicted build time fits ``BUDGET_MINUTES``.

The cost model (:func:`predict`): a build's time is ``speed x (other + sample x P*T*I + sweep x T*I + tokens x T)``
seconds, where P is the number of prompts, T the new tokens per generation, I the iterations; ``sample`` is the
generation time per prompt-token-iteration of the runs on the main prompts, ``sweep`` that of the runs on
``SWEEP_PROMPTS`` prompts (the K grid), ``tokens`` the work outside the runs that grows with T only (calibration
outputs, lookaheads), ``other`` everything else (installs, model loads, warm-ups, the model bench, rendering).
The coefficients come from reference builds (:func:`build_costs`, saved as ``data/reference/book-costs-*.json``);
``speed`` is this machine's target-plus-draft step time over the reference's, on the same prompts.

The choice (:func:`choose`): prompts first (the ratios' spread comes mostly from prompt to prompt: speedups depend
on the category), then new tokens, then iterations; never fewer than one prompt per category and
:data:`MIN_TOKENS` new tokens. Sizes the parameter set gives as numbers are kept as given.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

AUTO = "auto"
SIZED = ("PER_CATEGORY", "MAX_NEW_TOKENS", "ITERATIONS")
TOKENS = (16, 24, 32, 48, 64)  # the new-token counts the planner chooses from
MIN_TOKENS = TOKENS[0]  # below this a K = 4 block runs about three rounds: the ratios would describe the first ones
MAX_ITERATIONS = 3
COST_PROMPTS = 3  # prompts the step costs are measured on


@dataclass(frozen=True)
class Costs:
    """A build's time split into what scales with the sample (seconds per unit, at the reference's speed)."""

    other: float
    sample: float  # per prompt x new token x iteration
    sweep: float  # per new token x iteration (the runs on SWEEP_PROMPTS prompts)
    tokens: float = 0.0  # per new token (work outside the runs)


def predict(costs: Costs, speed: float, prompts: int, tokens: int, iterations: int) -> float:
    """Predicted seconds of a build of ``prompts`` x ``tokens`` x ``iterations`` at ``speed`` times the reference's
    step time."""
    return speed * (costs.other + costs.sample * prompts * tokens * iterations + costs.sweep * tokens * iterations
                    + costs.tokens * tokens)


def choose(costs: Costs, speed: float, budget_s: float, *, categories: int, max_per_category: int,
           fixed: dict | None = None) -> dict:
    """The sizes to run: the most prompts per category that fit with :data:`MIN_TOKENS` new tokens and one
    iteration, then the most new tokens, then the most iterations; ``fixed`` sizes (``per_category``,
    ``max_new_tokens``, ``iterations``) are kept. Where even the smallest sample does not fit, the smallest is
    returned with ``fits`` False. Returns the sizes, the predicted seconds and ``fits``."""
    fixed = fixed or {}
    per = [fixed["per_category"]] if "per_category" in fixed else list(range(1, max_per_category + 1))
    toks = [fixed["max_new_tokens"]] if "max_new_tokens" in fixed else list(TOKENS)
    its = [fixed["iterations"]] if "iterations" in fixed else list(range(1, MAX_ITERATIONS + 1))

    def cost(pc, t, i):
        return predict(costs, speed, categories * pc, t, i)

    pc = max((n for n in per if cost(n, toks[0], its[0]) <= budget_s), default=per[0])
    t = max((n for n in toks if cost(pc, n, its[0]) <= budget_s), default=toks[0])
    it = max((n for n in its if cost(pc, t, n) <= budget_s), default=its[0])
    seconds = cost(pc, t, it)
    return {"per_category": pc, "max_new_tokens": t, "iterations": it, "predicted_s": round(seconds, 1),
            "fits": seconds <= budget_s}


def fit(builds: list[dict]) -> Costs:
    """The cost coefficients from reference builds (:func:`build_costs`' documents), each normalised to its own
    step time: ``sample`` and ``sweep`` from the runs' generation times, ``other`` and ``tokens`` from the rest by
    least squares over the builds' new-token counts (with a single new-token count, ``tokens`` is 0 and ``other``
    holds all of it)."""
    if not builds:
        raise ConfigError("No reference build to size the sample from.")
    base = builds[0]["step_s"]
    rows = []
    for b in builds:
        norm = base / b["step_s"]  # to the first build's speed
        s = b["sizes"]
        units = s["prompts"] * s["new_tokens"] * s["iterations"]
        rows.append((s["new_tokens"], b["parts_s"]["sample"] * norm / units,
                     b["parts_s"]["sweep"] * norm / (s["new_tokens"] * s["iterations"]), b["parts_s"]["other"] * norm))
    sample = statistics.fmean(r[1] for r in rows)
    sweep = statistics.fmean(r[2] for r in rows)
    ts = {r[0] for r in rows}
    if len(ts) < 2:
        return Costs(other=statistics.fmean(r[3] for r in rows), sample=sample, sweep=sweep)
    slope, intercept = statistics.linear_regression([r[0] for r in rows], [r[3] for r in rows])
    if slope < 0:  # noise larger than the effect: no per-token term
        return Costs(other=statistics.fmean(r[3] for r in rows), sample=sample, sweep=sweep)
    return Costs(other=intercept, sample=sample, sweep=sweep, tokens=slope)


def build_costs(runs_dir: Path, label: str, total_s: float, *, sweep_prompts: int) -> dict:
    """One finished build's costs from its run folders in ``runs_dir`` (``<label>-*``): each run's generation time
    (prefill and decode of every sample) is ``sample`` work when the run used the main prompts and ``sweep`` work
    when it used ``sweep_prompts`` prompts; ``other`` is the rest of ``total_s``. The step time (target plus draft
    step, median of the main run's baseline samples on its first :data:`COST_PROMPTS` prompts) sets its speed."""
    runs_dir = Path(runs_dir)
    parts = {"sample": 0.0, "sweep": 0.0}
    sizes = None
    for cfg_path in sorted(runs_dir.glob(f"{label}-*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        rows = [json.loads(line) for line in (cfg_path.parent / "samples.jsonl").read_text().splitlines() if line]
        gen = sum(r["ttft_s"] + r["decode_s"] for r in rows)
        part = "sweep" if cfg.get("prompts") == sweep_prompts else "sample"
        parts[part] += gen
        if cfg_path.parent.name.startswith(f"{label}-bench-"):
            qids = list(dict.fromkeys(r["question_id"] for r in rows))
            sizes = {"prompts": len(qids), "new_tokens": cfg["max_new_tokens"], "iterations": cfg["iterations"],
                     "sweep_prompts": sweep_prompts}
            step = {q: r["component_costs_s"] for r in rows if r["mode"] == "baseline" and r["iteration"] == 0
                    for q in [r["question_id"]]}
            step_by_prompt = {q: step[q]["target_step_s"] + step[q]["draft_step_s"] for q in qids[:COST_PROMPTS]}
    if sizes is None:
        raise ConfigError(f"No main run ({label}-bench-*) in {runs_dir}.")
    parts["other"] = total_s - parts["sample"] - parts["sweep"]
    return {"sizes": sizes, "total_s": round(total_s, 1), "parts_s": {k: round(v, 1) for k, v in parts.items()},
            "step_by_prompt_s": step_by_prompt, "step_s": statistics.median(step_by_prompt.values())}


def measure_speed(p, reference_steps: dict[str, float], *, progress: bool = True) -> dict:
    """This machine's step time against the reference's: the pair loaded as the book loads it, then, twice over the
    reference's prompts, a short generation and one target step and one draft step timed (median of seven) at the
    prompt's context, as the runs time them; a prompt's time is the faster of its two passes (the first pass also
    warms the process up). Returns the seconds per prompt and ``speed``, the median of the per-prompt ratios (above
    1: slower than the reference)."""
    import time

    import torch

    from ..bench.execute import component_costs
    from ..bench.prompts import encode, load_prompts, prompt_text
    from ..bench.protocol import available_cores
    from ..bench.runner import Runner
    from ..models import loading

    t0 = time.perf_counter()
    torch.set_num_threads(available_cores())
    target, draft = loading.load_pair(p.target, p.draft, device=p.device, draft_device=p.draft_device,
                                      dtype=p.dtype, progress=progress)
    runner = Runner(target, draft, k=p.k, max_new_tokens=12)
    pool = {q.question_id: q for q in load_prompts(p.prompt_file)}
    missing = [q for q in reference_steps if q not in pool]
    if missing:
        raise ConfigError(f"The cost reference's prompts {', '.join(missing)} are not in {p.prompt_file!r}.")
    here: dict[str, float] = {}
    for _ in range(2):
        for qid in reference_steps:
            ids = encode(target.tokenizer, prompt_text(pool[qid], "first"), chat=True, thinking=p.thinking)
            runner.run("baseline", ids)
            c = component_costs(runner, ids, reps=7)
            here[qid] = min(here.get(qid, math.inf), c["target_step_s"] + c["draft_step_s"])
    ratios = [here[q] / reference_steps[q] for q in reference_steps]
    return {"step_by_prompt_s": {q: round(v, 5) for q, v in here.items()}, "speed": statistics.median(ratios),
            "measure_s": round(time.perf_counter() - t0, 1)}


def sized_keys(values: dict) -> list[str]:
    """The size parameters a set leaves to the planner (given as ``auto``)."""
    return [k for k in SIZED if values.get(k) == AUTO]


def plan_path(values: dict) -> Path:
    from .params import ROOT

    return ROOT / values.get("RUNS_DIR", "runs/book") / f"{values['SET_NAME']}-plan.json"


def resolve(values: dict, *, measure: bool = True, replan: bool = False, progress: bool = True) -> dict:
    """``values`` with every ``auto`` size replaced: by the saved plan of this set where it was made on this
    machine for the same budget, pair and fixed sizes (``replan`` makes a new one), else by a new plan
    (``measure``), else by the smallest sample. The plan is saved beside the runs (``<set>-plan.json``) and the
    chapter 4 page shows it."""
    import sys

    import os

    from ..models.cpu import cpu_name, fast_bf16
    from .params import ROOT, Params

    auto = sized_keys(values)
    if not auto:
        return values
    budget = values.get("BUDGET_MINUTES")
    if not isinstance(budget, (int, float)) or budget <= 0:
        raise ConfigError(f"{', '.join(auto)} = auto needs BUDGET_MINUTES > 0 (got {budget!r}).")
    ref_file = values.get("COST_REFERENCE")
    if not ref_file or not (ROOT / ref_file).is_file():
        raise ConfigError(f"{', '.join(auto)} = auto needs COST_REFERENCE, a saved build-costs file (got {ref_file!r}).")
    fixed = {k.lower(): values[k] for k in SIZED if k not in auto}
    key = {"budget_minutes": budget, "machine": f"{cpu_name()}, {os.cpu_count()} cores, native bf16 {fast_bf16()}", "target": values.get("TARGET"),
           "draft": values.get("DRAFT"), "dtype": values.get("DTYPE"), "fixed": fixed, "reference": ref_file}
    path = plan_path(values)
    saved = json.loads(path.read_text()) if path.is_file() else None
    if saved and saved.get("key") == key and not replan:
        chosen = saved["chosen"]
    elif not measure:
        chosen = {"per_category": 1, "max_new_tokens": MIN_TOKENS, "iterations": 1}
    else:
        reference = json.loads((ROOT / ref_file).read_text())
        builds = reference["builds"]
        costs = fit(builds)
        p = Params.from_namespace({k: v for k, v in values.items() if k not in SIZED}).check()
        if progress:
            print(f"sizing the sample for a {budget}-minute build: timing this machine's steps", file=sys.stderr)
        speed = measure_speed(p, builds[0]["step_by_prompt_s"], progress=progress)
        from ..bench.prompts import load_prompts

        pool = load_prompts(p.prompt_file)
        cats = sorted({q.category for q in pool})
        per_cat = min(sum(q.category == c for q in pool) for c in cats) - values.get("CALIBRATION_PER_CATEGORY", 0)
        chosen = choose(costs, speed["speed"], budget * 60 - speed["measure_s"], categories=len(cats),
                        max_per_category=max(1, per_cat), fixed=fixed)  # the timing itself is part of the build
        chosen["predicted_s"] = round(chosen["predicted_s"] + speed["measure_s"], 1)
        doc = {"key": key, "chosen": chosen, "budget_minutes": budget, "speed": round(speed["speed"], 4),
               "step_by_prompt_s": speed["step_by_prompt_s"], "measure_s": speed["measure_s"],
               "costs": costs.__dict__, "reference": ref_file, "prompts": len(cats) * chosen["per_category"],
               "planned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        if progress:
            print(said(doc), file=sys.stderr)
    out = dict(values)
    for k in auto:
        out[k] = chosen[k.lower()]
    return out


def said(plan: dict) -> str:
    """A plan in one sentence: the sizes, the budget, the measured speed and whether the sample fits."""
    c = plan["chosen"]
    text = (f"{plan['prompts']} prompts x {c['max_new_tokens']} new tokens x {c['iterations']} iteration"
            f"{'s' if c['iterations'] > 1 else ''}, chosen for a {plan['budget_minutes']:g}-minute build: this "
            f"machine's steps take {plan['speed']:.2f}x the reference build's, so the build is predicted to take "
            f"{c['predicted_s'] / 60:.0f} minutes")
    if not c["fits"]:
        text += " (over the budget: this is the smallest sample the book runs)"
    return text


def record_build(set_name: str, total_s: float, overrides: dict | None = None) -> Path | None:
    """After a build that executed every notebook of a sized set: its costs (:func:`build_costs`, ``total_s`` being
    ``thesis-lib book``'s own seconds), its plan and where it ran, as ``<RUNS_DIR>/<set>-build-costs.json``, the
    form ``COST_REFERENCE``'s ``builds`` take. None for a set with no ``auto`` size."""
    from ..bench.environment import git_revision
    from .params import ROOT, load_parameters, values_of

    raw = load_parameters(set_name)
    if not sized_keys(raw):
        return None
    values = values_of(set_name, overrides)
    plan = json.loads(plan_path(values).read_text())
    doc = build_costs(ROOT / values["RUNS_DIR"], values["SET_NAME"], total_s, sweep_prompts=values["SWEEP_PROMPTS"])
    doc.update({"measured": "thesis-lib book (notebooks and rendering; installs and model preparation not included)",
                "date": datetime.date.today().isoformat(), "revision": git_revision().get("commit"),
                "machine": plan["key"]["machine"], "planned": plan})
    out = plan_path(values).with_name(f"{values['SET_NAME']}-build-costs.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def page_said(p) -> str:
    """Chapter 4's sentence on its sample (``p``: the notebook's :class:`~.params.Params`): the plan that sized it
    where its saved plan chose these sizes, else that the parameter set fixed them."""
    from .params import selected_prompts

    path = plan_path({"RUNS_DIR": p.runs_dir, "SET_NAME": p.set_name})
    plan = json.loads(path.read_text()) if path.is_file() else None
    sizes = {"per_category": p.per_category, "max_new_tokens": p.max_new_tokens, "iterations": p.iterations}
    if plan and all(plan["chosen"][k] == v for k, v in sizes.items()):
        return said(plan) + f" (measured on {plan['key']['machine']}; {Path(plan['reference']).name} is the reference)"
    n = len(selected_prompts(p))
    return (f"{n} prompts x {p.max_new_tokens} new tokens x {p.iterations} iteration{'s' if p.iterations > 1 else ''}, "
            "as the parameter set fixes them")
