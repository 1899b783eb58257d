"""The sample a book build can afford on this machine: the default set's sizes (``PER_CATEGORY``, ``MAX_NEW_TOKENS``,
``ITERATIONS``) may be ``auto``, and :func:`resolve` then costs samples from this machine's newest recorded build
where the reference holds one (:func:`~.buildcosts.newest_of`), else times this machine's decoding steps
(:mod:`.speed`) and scales the reference builds' measured costs by them, and picks the largest sample whose predicted
build time fits ``BUDGET_MINUTES``.

The cost model (:class:`Costs`, :func:`predict`), in seconds at a reference build's speed, for P prompts, T new
tokens, I iterations and S sweep prompts: ``fixed + per_generation x P*I + per_token x P*T*I + other_per_token x
T*P/P0 + S x (sweep_per_prompt + sweep_per_token x T)``. ``per_generation`` is what a generation on the main prompts
costs whatever its length (the prefill, the per-prompt cost timings, a run's share of loading and warm-up),
``per_token`` what each of its new tokens costs; the runs on ``SWEEP_PROMPTS`` prompts (one iteration always) add
``sweep_per_prompt`` per sweep prompt and ``sweep_per_token`` per sweep prompt and new token;
the work outside the runs (calibration outputs, lookaheads, the model bench, rendering) is ``fixed`` plus
``other_per_token`` per new token, scaled with the prompts beyond the reference's P0 (an upper bound: part of it
does not grow with them). :func:`fit` takes the coefficients from reference builds (:func:`build_costs`); a
machine's ``speed`` is its target-plus-draft step time over the reference's, on the same prompts.

Clusterings the build would make by k-means (:func:`kmeans_to_run`: none for the default set, whose clusterings are
shipped) are timed on this machine before the choice, taken from the budget and said with the plan; so is what the
build has already spent before the planner runs (:func:`spent_s`: on a first build the environment, the models'
conversion and the kernels' compile).

The choice (:func:`choose`): prompts first (the intervals are mostly prompt-to-prompt spread: speedups depend on the
category), then new tokens, then iterations, never below one prompt per category and :data:`MIN_TOKENS` tokens.
Sizes the parameter set gives as numbers are kept as given. :func:`values_of` (a set's values, sizes resolved) and
:func:`of_notebook` (a chapter notebook's parameters as :class:`~.params.Params`, sizes from the saved plan) are
how the build, the CLI and the notebooks read a parameter set.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import ConfigError
from ..models.cache import write_json
from .buildcosts import Costs, build_costs, matching, model, newest_of
from .params import ROOT, Params, load_parameters, selected_prompts, set_label
from .speed import measure_speed

AUTO = "auto"
SIZED = ("PER_CATEGORY", "MAX_NEW_TOKENS", "ITERATIONS")
TOKENS = (16, 24, 32, 48, 64)  # the new-token counts the planner chooses from
MIN_TOKENS = TOKENS[0]  # below this a K = 4 block runs about three rounds: the ratios would describe the first ones
#: the smallest sample, taken where no plan is saved and none is made (and the sizes the first check assumes)
SMALLEST = {"per_category": 1, "max_new_tokens": MIN_TOKENS, "iterations": 1}
MAX_ITERATIONS = 3
#: when the build began, in seconds since the epoch: `make book` sets it before its set-up steps
STARTED_ENV = "THESIS_LIB_BUILD_STARTED"


def spent_s() -> float:
    """Seconds the build has run before this call, from :data:`STARTED_ENV` (0 where it is not set)."""
    given = os.environ.get(STARTED_ENV, "").strip()
    if given and not given.replace(".", "", 1).isdigit():
        raise ConfigError(f"{STARTED_ENV} must be the build's start in seconds since the epoch (got {given!r}).")
    return max(0.0, time.time() - float(given)) if given else 0.0


def predict(costs: Costs | dict[str, Costs], speed: float, prompts: int, tokens: int, iterations: int, *,
            sweep_prompts: int) -> float:
    """Predicted seconds of a build of ``prompts`` x ``tokens`` x ``iterations`` (and ``sweep_prompts`` x ``tokens``
    in the sweep runs) at ``speed`` times the reference's step time (``costs`` by part, :func:`~.buildcosts.model`'s:
    the sum of the parts)."""
    if isinstance(costs, dict):
        return sum(predict(c, speed, prompts, tokens, iterations, sweep_prompts=sweep_prompts) for c in costs.values())
    c = costs
    return speed * (c.fixed + c.per_generation * prompts * iterations + c.per_token * prompts * tokens * iterations
                    + c.other_per_token * tokens * max(1.0, prompts / c.reference_prompts)
                    + sweep_prompts * (c.sweep_per_prompt + c.sweep_per_token * tokens))


def choose(costs: Costs | dict[str, Costs], speed: float, budget_s: float, *, categories: int, max_per_category: int,
           sweep_prompts: int, fixed: dict | None = None) -> dict:
    """The sizes to run: the most prompts per category that fit with :data:`MIN_TOKENS` new tokens and one
    iteration, then the most new tokens, then the most iterations; ``fixed`` sizes (``per_category``,
    ``max_new_tokens``, ``iterations``) are kept. Where even the smallest sample does not fit, the smallest is
    returned with ``fits`` False. Returns the sizes, the predicted seconds and ``fits``."""
    fixed = fixed or {}
    per = [fixed["per_category"]] if "per_category" in fixed else list(range(1, max_per_category + 1))
    toks = [fixed["max_new_tokens"]] if "max_new_tokens" in fixed else list(TOKENS)
    its = [fixed["iterations"]] if "iterations" in fixed else list(range(1, MAX_ITERATIONS + 1))

    def cost(pc, t, i):
        return predict(costs, speed, categories * pc, t, i, sweep_prompts=sweep_prompts)

    pc = max((n for n in per if cost(n, toks[0], its[0]) <= budget_s), default=per[0])
    t = max((n for n in toks if cost(pc, n, its[0]) <= budget_s), default=toks[0])
    it = max((n for n in its if cost(pc, t, n) <= budget_s), default=its[0])
    seconds = cost(pc, t, it)
    return {"per_category": pc, "max_new_tokens": t, "iterations": it, "predicted_s": round(seconds, 1),
            "fits": seconds <= budget_s}


def kmeans_to_run(values: dict, draft_precision: str) -> dict[int, float]:
    """The draft's clusterings this build would make by k-means, each with its predicted seconds
    (:func:`~..heads.for_model.kmeans_ahead`): the main head's (``CLUSTERS``) and the co-design study's (V over each
    ``CODESIGN_CLUSTER_SIZES``); none where the set gives FlashHead's assets."""
    from ..heads.for_model import kmeans_ahead

    if values.get("ASSETS"):
        return {}
    return kmeans_ahead(str(values.get("DRAFT") or Params.draft), draft_precision, clusters=values.get("CLUSTERS"),
                        block_sizes=values.get("CODESIGN_CLUSTER_SIZES") or (),
                        iterations=int(values.get("KMEANS_ITERATIONS", 20)))


def sized_keys(values: dict) -> list[str]:
    """The size parameters a set leaves to the planner (given as ``auto``)."""
    return [k for k in SIZED if values.get(k) == AUTO]


#: keys a parameter set holds beside the parameters: the planner's (this module's)
PLANNER_KEYS = ("BUDGET_MINUTES", "COST_REFERENCE")


def check_set(values: dict) -> None:
    """Every key and value of a parameter set, checked before the planner times anything and before any model file
    is read: an unknown key named with the closest known one; the values as the notebooks check them (sizes left
    to the planner at their smallest); the main run's configuration (modes, probes, clusters, models, precisions,
    devices, prompts, context), all in one line each."""
    import difflib

    known = {n.upper() for n in Params.names()} | set(PLANNER_KEYS)
    for key in sorted(set(values) - known):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        raise ConfigError(f"{key} is no parameter" + (f"; did you mean {close[0]}?" if close else "."))
    sized = {k.upper(): v for k, v in SMALLEST.items() if values.get(k.upper()) == "auto"}
    p = Params.from_namespace({**values, **sized}).check()
    if not p.rehearsal:  # a rehearsal's stand-in models exist only in its notebooks' environment
        p.bench().check()


def plan_path(values: dict) -> Path:
    """Where a set's plans are kept: ``<RUNS_DIR>/<SET_NAME>-plan.json`` (a list, newest last)."""

    return ROOT / values.get("RUNS_DIR", "runs/book") / f"{values['SET_NAME']}-plan.json"


def _plans(path: Path) -> list[dict]:
    """The plans saved in ``path`` (none without the file). A file that is no JSON (torn by a version that wrote it
    in place, or edited by hand) is moved aside, which is said, and the sizes are planned again."""
    try:
        return json.loads(path.read_text()) if path.is_file() else []
    except ValueError:
        path.replace(aside := path.with_name(path.name + ".unreadable"))
        print(f"{path.name} is no JSON; moved aside to {aside.name}, the sizes are planned again", file=sys.stderr)
        return []


def _plan_that_chose(path: Path, sizes: dict) -> dict | None:
    """The newest plan in ``path`` that chose ``sizes`` (``per_category``, ``max_new_tokens``, ``iterations``)."""
    return next((pl for pl in reversed(_plans(path)) if all(pl["chosen"][k] == v for k, v in sizes.items())), None)


def planned_s(values: dict) -> dict[str, float]:
    """The seconds the newest plan of this machine and budget that chose ``values``' sizes predicted for each
    notebook ({} where none did)."""
    sizes = {k.lower(): values.get(k) for k in SIZED}
    return next((pl.get("predicted_by_part_s", {}) for pl in reversed(_plans(plan_path(values)))
                 if pl["key"].get("machine") == machine() and pl["key"].get("budget_minutes") ==
                 values.get("BUDGET_MINUTES") and pl["chosen"].items() >= sizes.items()), {})


def machine() -> str:
    """This machine as a plan names it: CPU model, cores, whether bf16 is native."""
    import os

    from ..models.cpu import cpu_name, fast_bf16

    return f"{cpu_name()}, {os.cpu_count()} cores, {'native bf16' if fast_bf16() else 'no native bf16'}"


def resolve(values: dict, *, measure: bool = True, replan: bool = False, progress: bool = True) -> dict:
    """``values`` with every ``auto`` size replaced: by the newest saved plan of this set made on this machine for
    the same budget, parameters and reference (``replan`` makes a new one), else by a new plan (``measure``), else
    by the smallest sample. A new plan is added to :func:`plan_path`; the results page shows it."""
    auto = sized_keys(values)
    if not auto:
        return values

    if values.get("READ_ONLY"):  # the sizes the recorded build chose, on whatever machine it ran
        plans = _plans(plan_path(values))
        if not plans:
            raise ConfigError(f"READ_ONLY reads a recorded build, but {plan_path(values)} holds no plan of its sizes.")
        return {**values, **{k: plans[-1]["chosen"][k.lower()] for k in auto}}

    budget = values.get("BUDGET_MINUTES")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
        raise ConfigError(f"{', '.join(auto)} = auto needs BUDGET_MINUTES > 0 (got {budget!r}).")
    ref_file = values.get("COST_REFERENCE")
    if not ref_file or not (ROOT / ref_file).is_file():
        raise ConfigError(f"{', '.join(auto)} = auto needs COST_REFERENCE, a saved build-costs file (got {ref_file!r}).")
    if values.get("PROMPTS") is not None or values.get("PER_CATEGORY") is None:
        raise ConfigError("auto sizes count prompts per category: give PER_CATEGORY (auto or a number), not PROMPTS.")
    fixed = {k.lower(): values[k] for k in SIZED if k not in auto}
    ref_text = (ROOT / ref_file).read_text()
    context = {k: values.get(k) for k in ("TARGET", "DRAFT", "DEVICE", "DTYPE", "K", "MODES", "K_SWEEP",
                                          "SWEEP_PROMPTS", "PROMPT_FILE", "CALIBRATION_PER_CATEGORY", "BEYOND_MODES",
                                          "BEYOND_K_SWEEP")}
    key = {"budget_minutes": budget, "machine": machine(), "fixed": fixed, "reference": ref_file,
           "reference_sha256": hashlib.sha256(ref_text.encode()).hexdigest()[:16],
           "parameters": hashlib.sha256(json.dumps(context, sort_keys=True, default=str).encode()).hexdigest()[:16]}
    path = plan_path(values)
    plans = _plans(path)
    saved = next((pl for pl in reversed(plans) if pl["key"] == key), None)
    if saved and not replan:
        chosen = saved["chosen"]
    elif not measure:
        chosen = dict(SMALLEST)
    else:
        from ..bench.prompts import load_prompts

        spent = spent_s()
        prec = precision(values)
        builds = matching(json.loads(ref_text)["builds"], prec)
        own = newest_of(builds, machine(), prec)
        builds = own or builds
        costs = model(builds)
        p = Params.from_namespace({k: v for k, v in values.items() if k not in SIZED}).check()
        if own:  # this machine's newest build at its own speed
            speed = {"speed": 1.0, "step_by_prompt_s": {}, "measure_s": 0.0}
        else:
            if progress:
                print(f"sizing the sample for a {budget:g}-minute build: timing this machine's steps", file=sys.stderr)
            speed = measure_speed(p, builds[0]["step_by_prompt_s"])
        pool = load_prompts(p.prompt_file)
        cats = sorted({q.category for q in pool})
        per_cat = min(sum(q.category == c for q in pool) for c in cats) - values.get("CALIBRATION_PER_CATEGORY", 0)
        kmeans = kmeans_to_run(values, prec.split("/")[1])
        # the set-up so far, the timing and the clusterings are part of the build
        before = spent + speed["measure_s"] + sum(kmeans.values())
        chosen = choose(costs, speed["speed"], budget * 60 - before, categories=len(cats),
                        max_per_category=max(1, per_cat), sweep_prompts=values["SWEEP_PROMPTS"], fixed=fixed)
        chosen["predicted_s"] = round(chosen["predicted_s"] + before, 1)
        sizes = (len(cats) * chosen["per_category"], chosen["max_new_tokens"], chosen["iterations"])
        doc = {"key": key, "chosen": chosen, "budget_minutes": budget, "speed": round(speed["speed"], 4),
               "step_by_prompt_s": speed["step_by_prompt_s"], "measure_s": speed["measure_s"],
               "precision": prec, "timed": not own, "kmeans_s": {str(c): round(s, 1) for c, s in kmeans.items()},
               "spent_s": round(spent, 1),
               **({"costed_from": f"{own[0]['date']} at {str(own[0].get('revision'))[:7]}"} if own else {}),
               "references": [f"{b['date']} {b['machine']}" for b in builds],
               "costs": {k: asdict(c) for k, c in costs.items()},
               "predicted_by_part_s": {k: round(predict(c, speed["speed"], *sizes, sweep_prompts=values["SWEEP_PROMPTS"]),
                                                1) for k, c in costs.items()},
               "prompts": sizes[0],
               "planned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_json(path, [*plans, doc])
        if progress:
            print(said(doc), file=sys.stderr)
    return {**values, **{k: chosen[k.lower()] for k in auto}}


def precision(values: dict) -> str:
    """The target's and the draft's precision as this machine resolves the set's (``"<target>/<draft>"``), the
    precision a build's costs belong to."""
    from ..models.auto import draft_precision
    from ..models.loading import resolved_dtype

    device, d_device = values.get("DEVICE", "cpu"), values.get("DRAFT_DEVICE") or values.get("DEVICE", "cpu")
    dtype = values.get("DTYPE", "auto")
    draft = draft_precision(dtype, values.get("DRAFT_DTYPE"), d_device)
    return f"{resolved_dtype(dtype, device)}/{resolved_dtype(draft, d_device)}"


def said(plan: dict) -> str:
    """A plan in one sentence: the sizes, the budget, what it was costed from (the measured speed, or this machine's
    recorded build) and whether the sample fits."""
    c = plan["chosen"]
    basis = (f"this machine's steps take {plan['speed']:.2f}x the reference build's" if plan.get("timed", True) else
             f"costed from this machine's newest recorded build "
             f"({plan.get('costed_from') or plan['references'][0].split()[0]})")  # plans before costed_from: its date
    text = (f"{plan['prompts']} prompts x {c['max_new_tokens']} new tokens x {c['iterations']} iteration"
            f"{'s' if c['iterations'] > 1 else ''}, chosen for a {plan['budget_minutes']:g}-minute build: {basis}, "
            f"so the build is predicted to take {c['predicted_s'] / 60:.0f} minutes")
    if plan.get("kmeans_s"):
        text += (f", {sum(plan['kmeans_s'].values()) / 60:.0f} of them for k-means (C = "
                 f"{', '.join(f'{int(c):,}' for c in plan['kmeans_s'])}: neither shipped nor cached)")
    if plan.get("spent_s", 0) >= 60:
        text += f", {plan['spent_s'] / 60:.0f} of them already spent on its set-up"
    if not c["fits"]:
        text += " (over the budget: this is the smallest sample the book runs)"
    return text


def record_build(values: dict, total_s: float, started: float, notebooks: list[dict] | None = None) -> Path | None:
    """After a build of a sized set (``values``: its parameters with the sizes chosen) that measured every run it
    shows: its costs (:func:`build_costs`; ``total_s``, ``thesis-lib book``'s own seconds, started at the time stamp
    ``started``), its plan and where it ran, as ``<RUNS_DIR>/<SET_NAME>-build-costs.json``, the form a
    ``COST_REFERENCE``'s ``builds`` take. None where the build reused runs or followed no plan."""
    from ..bench.environment import git_revision

    sizes = {k.lower(): values[k] for k in SIZED}
    plan = _plan_that_chose(plan_path(values), sizes)
    if plan is None:
        return None
    made_here = datetime.datetime.fromisoformat(plan["planned_at"]).timestamp() >= started
    doc = build_costs(ROOT / values["RUNS_DIR"], values, total_s, started=started,
                      measure_s=plan["measure_s"] if made_here else 0.0,
                      steps=plan["step_by_prompt_s"] if made_here else None, notebooks=notebooks,
                      cost_prompts=_reference_prompts(values))
    if doc is None:
        return None
    doc.update({"measured": "thesis-lib book (notebooks and rendering; installs and model preparation not included)",
                "date": datetime.date.today().isoformat(), "revision": git_revision().get("commit"),
                "machine": plan["key"]["machine"], "precision": plan.get("precision"), "planned": plan})
    out = plan_path(values).with_name(f"{values['SET_NAME']}-build-costs.json")
    return write_json(out, doc)


def _reference_prompts(values: dict) -> list[str] | None:
    """The prompts the cost reference's first build timed its steps on (what a plan on another machine times), so
    that a build whose plan timed nothing records its step time on the same prompts; None without a reference."""
    ref = values.get("COST_REFERENCE")
    if not ref or not (ROOT / ref).is_file():
        return None
    return list(json.loads((ROOT / ref).read_text())["builds"][0]["step_by_prompt_s"])


def page_said(p) -> str:
    """Chapter 4's sentence on its sample (``p``: the notebook's :class:`~.params.Params`): the newest plan that
    chose these sizes, else that the parameter set fixed them."""

    sizes = {"per_category": p.per_category, "max_new_tokens": p.max_new_tokens, "iterations": p.iterations}
    plan = _plan_that_chose(plan_path({"RUNS_DIR": p.runs_dir, "SET_NAME": p.set_name}), sizes)
    if plan:
        return f"{said(plan)}; {'timed' if plan.get('timed', True) else 'planned'} on {plan['key']['machine']}"
    n = len(selected_prompts(p))
    return (f"{n} prompts x {p.max_new_tokens} new tokens x {p.iterations} iteration{'s' if p.iterations > 1 else ''}, "
            "as the parameter set fixes them")


def values_of(set_name: str, overrides: dict | None = None, *, measure: bool = False, replan: bool = False,
              progress: bool = True) -> dict:
    """A set's values with ``overrides`` and its ``SET_NAME``, its ``auto`` sizes resolved by :func:`resolve`
    (``measure``: time this machine and plan where no saved plan fits; else the saved plan or the smallest sample)."""
    values = {**load_parameters(set_name), **(overrides or {})}
    values.setdefault("SET_NAME", set_label(set_name))
    return resolve(values, measure=measure, replan=replan, progress=progress)


def of_notebook(ns: dict) -> Params:
    """The chapter notebooks' one call: their parameters (``globals()``) as :class:`Params`, checked. Sizes left
    ``auto`` (a notebook run by papermill with a parameter file, or with its defaults, which are the default set's)
    take the newest saved plan of this machine for the same parameters, as ``make book`` chose them, else the
    smallest sample (:func:`resolve` without timing); the notebook's globals get the chosen sizes."""
    values = {k: v for k, v in ns.items() if k.isupper()}
    if sized_keys(values):
        values = resolve(values, measure=False, progress=False)
        for k in SIZED:
            ns[k] = values[k]
    return Params.from_namespace(values).check()
