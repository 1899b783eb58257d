"""The book's sample sized to a time budget (thesis_lib.book.sizing): the cost model, the choice, the fit from
reference builds, the committed reference, and the plan's reuse, on constructed costs (no model is loaded)."""

import io
import json
import math

import pytest

from thesis_lib import progress
from thesis_lib.book import buildcosts, params, sizing
from thesis_lib.errors import ConfigError

REFERENCE = params.ROOT / "data" / "reference" / "book-costs-cpu-embedded.json"


@pytest.fixture(autouse=True)
def _a_machine_the_reference_does_not_know(monkeypatch):
    """Plans are made as on a CPU none of the reference's builds ran on (whatever CPU runs the tests)."""
    monkeypatch.setattr(sizing, "machine", lambda: "a test CPU, 2 cores, no native bf16")
    monkeypatch.setattr(sizing, "kmeans_to_run", lambda values, draft_precision: {})  # every clustering at hand
    monkeypatch.delenv(sizing.STARTED_ENV, raising=False)  # no build's set-up counted unless a test says so


def test_the_choice_takes_prompts_before_tokens_and_tokens_before_iterations():
    costs = sizing.Costs(fixed=100.0, per_generation=0.0, per_token=1.0)
    # 7 categories: one prompt each at 16 tokens costs 100 + 112 s; two each 100 + 224 s; one each at 32 tokens 324 s
    two = sizing.choose(costs, 1.0, 330, categories=7, max_per_category=5, sweep_prompts=3)
    assert (two["per_category"], two["max_new_tokens"], two["iterations"]) == (2, 16, 1)  # not 7 prompts x 32
    assert two["fits"] and math.isclose(two["predicted_s"], 324.0)
    # more room: 5 per category is the most there is; then tokens (5 x 7 x 48 = 1680), then iterations
    roomy = sizing.choose(costs, 1.0, 100 + 1680 + 1, categories=7, max_per_category=5, sweep_prompts=3)
    assert (roomy["per_category"], roomy["max_new_tokens"], roomy["iterations"]) == (5, 48, 1)
    roomier = sizing.choose(costs, 1.0, 100 + 35 * 64 * 2 + 1, categories=7, max_per_category=5,
                            sweep_prompts=3)
    assert (roomier["per_category"], roomier["max_new_tokens"], roomier["iterations"]) == (5, 64, 2)
    # the same budget on a machine twice as slow buys less
    slow = sizing.choose(costs, 2.0, 330, categories=7, max_per_category=5, sweep_prompts=3)
    assert (slow["per_category"], slow["max_new_tokens"], slow["iterations"], slow["fits"]) == (1, 16, 1, False)
    assert math.isclose(slow["predicted_s"], 2 * (100 + 7 * 16))


def test_each_term_grows_with_its_own_sizes():
    c = sizing.Costs(fixed=100.0, per_generation=3.0, per_token=0.5, sweep_per_prompt=5.0, sweep_per_token=2.0,
                     other_per_token=4.0, reference_prompts=7)
    base = sizing.predict(c, 1.0, 7, 16, 1, sweep_prompts=3)
    assert math.isclose(base, 100 + 3 * 7 + 0.5 * 7 * 16 + 3 * (5 + 2 * 16) + 4 * 16)
    # more sweep prompts: more of the sweep's prompts and tokens, nothing else
    assert math.isclose(sizing.predict(c, 1.0, 7, 16, 1, sweep_prompts=7) - base, 4 * (5 + 2 * 16))
    # a second iteration repeats the main prompts' generations only (the sweep and the rest run once)
    assert math.isclose(sizing.predict(c, 1.0, 7, 16, 2, sweep_prompts=3) - base, 3 * 7 + 0.5 * 7 * 16)
    # twice the prompts: twice the main generations, and the per-token work outside the runs taken as per prompt
    assert math.isclose(sizing.predict(c, 1.0, 14, 16, 1, sweep_prompts=3) - base, 3 * 7 + 0.5 * 7 * 16 + 4 * 16)
    assert math.isclose(sizing.predict(c, 1.5, 7, 16, 1, sweep_prompts=3), 1.5 * base)


def test_sizes_the_set_fixes_are_kept():
    costs = sizing.Costs(fixed=100.0, per_generation=0.0, per_token=1.0, sweep_per_token=0.5, other_per_token=2.0)
    got = sizing.choose(costs, 1.0, 10_000, categories=7, max_per_category=5, sweep_prompts=1,
                        fixed={"max_new_tokens": 20})
    assert (got["per_category"], got["max_new_tokens"], got["iterations"]) == (5, 20, 3)
    tight = sizing.choose(costs, 1.0, 900, categories=7, max_per_category=5, sweep_prompts=1,
                          fixed={"per_category": 1, "iterations": 2})
    assert (tight["per_category"], tight["iterations"]) == (1, 2)  # 100 + 7 x 2 x T + 0.5 x T + 2 x T <= 900
    assert tight["max_new_tokens"] == 48 and sizing.predict(costs, 1.0, 7, 64, 2, sweep_prompts=1) > 900


def _build(tokens, step_s, *, prompts=7, gen=1.5, tok=0.2, sweep=3.0, sweep_prefill=2.0, sweeps=3, fixed=600.0,
           other_tok=12.0):
    """A constructed build on a machine step_s / 0.2 times as slow as the first (``sweep``: seconds per sweep
    prompt and new token, ``sweep_prefill`` per sweep prompt)."""
    slow = step_s / 0.2
    return {"sizes": {"prompts": prompts, "new_tokens": tokens, "iterations": 1, "sweep_prompts": sweeps},
            "step_s": step_s, "parts_s": {
                "main_prefill": slow * gen * prompts, "main_overhead": 0.0, "main_decode": slow * tok * prompts * tokens,
                "sweep_prefill": slow * sweep_prefill * sweeps, "sweep_overhead": 0.0,
                "sweep_decode": slow * sweep * sweeps * tokens,
                "other": slow * (fixed + other_tok * tokens)}}


def test_the_fit_splits_per_generation_from_per_token_across_two_lengths():
    two = [_build(32, 0.2), _build(16, 0.3)]
    costs = buildcosts.fit(two)
    assert math.isclose(costs.per_generation, 1.5) and math.isclose(costs.per_token, 0.2)
    assert math.isclose(costs.sweep_per_token, 3.0) and math.isclose(costs.sweep_per_prompt, 2.0)
    assert math.isclose(costs.fixed, 600.0)
    # builds with other sweep sizes give the same per-prompt coefficients
    mixed = buildcosts.fit([_build(32, 0.2, sweeps=7), _build(16, 0.3, sweeps=3)])
    assert math.isclose(mixed.sweep_per_token, 3.0) and math.isclose(mixed.sweep_per_prompt, 2.0)
    assert math.isclose(costs.other_per_token, 12.0)
    for b in two:  # each build predicted at its own speed
        s = b["sizes"]
        assert math.isclose(sizing.predict(costs, b["step_s"] / 0.2, s["prompts"], s["new_tokens"], 1,
                                           sweep_prompts=s["sweep_prompts"]), sum(b["parts_s"].values()))
    # a decode with a part per generation: two lengths find it, one length takes all of it per token
    costs = buildcosts.fit([_build(32, 0.2, tok=0.2 + 0.8 / 32), _build(16, 0.2, tok=0.2 + 0.8 / 16)])  # 0.8 s each
    assert math.isclose(costs.per_generation, 1.5 + 0.8) and math.isclose(costs.per_token, 0.2)
    one = buildcosts.fit([_build(32, 0.2)])
    assert math.isclose(one.fixed, 600.0 + 12.0 * 32) and one.other_per_token == 0.0
    assert math.isclose(one.per_token, 0.2) and math.isclose(one.per_generation, 1.5)
    with pytest.raises(ConfigError):
        buildcosts.fit([])


def test_the_committed_reference_and_the_other_machines_it_simulates():
    ref = json.loads(REFERENCE.read_text())
    bf16 = buildcosts.matching(ref["builds"], "bfloat16/bfloat16")  # the two Xeon builds
    costs = buildcosts.fit(bf16)
    b = bf16[0]
    assert set(b["parts_s"]) == {"main_prefill", "main_decode", "main_overhead", "sweep_prefill", "sweep_decode",
                                 "sweep_overhead", "other"} and min(b["parts_s"].values()) >= 0
    # The other machine kinds, simulated by their speed relative to the reference's: the 7 x 32 book took 30.4 min
    # on the AVX-512 BF16 EPYC and 81 min on the AVX2 EPYC in float32 (measurement log) against 43.9 min in the
    # reference build of that sample, whose steps were this much faster than the first reference's:
    at32 = next(r for r in bf16 if r["sizes"]["new_tokens"] == 32)
    scale = at32["step_s"] / b["step_s"]
    assert math.isclose(sizing.predict(costs, scale, 7, 32, 1, sweep_prompts=at32["sizes"]["sweep_prompts"]),
                        at32["total_s"], rel_tol=0.05)
    fast = sizing.choose(costs, 30.4 / 43.9 * scale, 30 * 60, categories=7, max_per_category=5, sweep_prompts=3)
    slow = sizing.choose(costs, 81 / 43.9 * scale, 30 * 60, categories=7, max_per_category=5, sweep_prompts=3)
    assert fast["fits"] and fast["predicted_s"] <= 30 * 60
    assert not slow["fits"] and (slow["per_category"], slow["max_new_tokens"], slow["iterations"]) == (1, 16, 1)
    assert "over the budget" in sizing.said({"chosen": slow, "prompts": 7, "budget_minutes": 30, "speed": 1.8})
    # how much the slow machine would need: the smallest sample's predicted minutes, said rather than hidden
    assert slow["predicted_s"] > 30 * 60 * 1.1


def _values(tmp_path, **kw):
    return {**params.load_parameters("cpu-embedded"), "SET_NAME": "t", "RUNS_DIR": str(tmp_path), **kw}


def test_auto_sizes_need_a_budget_and_a_reference_before_any_model_is_touched(tmp_path, monkeypatch):
    def no_models(*a, **k):
        raise AssertionError("a model was touched")

    monkeypatch.setattr(sizing, "measure_speed", no_models)
    with pytest.raises(ConfigError, match="BUDGET_MINUTES"):
        sizing.resolve(_values(tmp_path, BUDGET_MINUTES=None))
    with pytest.raises(ConfigError, match="COST_REFERENCE"):
        sizing.resolve(_values(tmp_path, COST_REFERENCE="nowhere.json"))
    with pytest.raises(ConfigError, match="PER_CATEGORY"):
        sizing.resolve(_values(tmp_path, PER_CATEGORY=None, PROMPTS=5))
    fixed = _values(tmp_path, PER_CATEGORY=2, MAX_NEW_TOKENS=24, ITERATIONS=1)
    assert sizing.resolve(fixed) is fixed  # nothing left to plan: no measurement, values as given
    with pytest.raises(ConfigError, match="auto is for `thesis-lib book`"):  # the raw set read without the planner
        params.Params.from_namespace(params.load_parameters("cpu-embedded")).check()


def test_a_plan_is_measured_once_saved_and_reused_on_the_same_machine(tmp_path, monkeypatch):
    calls = []

    def fake_speed(p, reference_steps):
        calls.append(sorted(reference_steps))
        return {"speed": 2.0, "step_by_prompt_s": {q: 2 * s for q, s in reference_steps.items()}, "measure_s": 1.0}

    monkeypatch.setattr(sizing, "measure_speed", fake_speed)
    monkeypatch.setattr(sizing, "precision", lambda values: "bfloat16/bfloat16")  # the Xeon builds, whatever runs this
    values = _values(tmp_path, BUDGET_MINUTES=30)
    out = sizing.resolve(values, progress=False)
    assert [out[k] for k in sizing.SIZED] == [1, 16, 1] and len(calls) == 1  # twice as slow: the smallest sample
    plan = json.loads((tmp_path / "t-plan.json").read_text())[-1]
    assert plan["speed"] == 2.0 and plan["chosen"]["fits"] is False and plan["budget_minutes"] == 30
    costs = {k: sizing.Costs(**c) for k, c in plan["costs"].items()}  # the timing's own second is counted
    predicted = sizing.predict(costs, 2.0, 7, 16, 1, sweep_prompts=values["SWEEP_PROMPTS"])
    assert math.isclose(plan["chosen"]["predicted_s"], round(predicted, 1) + 1.0)
    # the reference's builds of this machine's precisions, per notebook where they know their notebooks
    assert plan["precision"] == "bfloat16/bfloat16" and len(plan["references"]) == 2
    assert math.isclose(sum(plan["predicted_by_part_s"].values()), plan["chosen"]["predicted_s"] - 1.0, abs_tol=0.5)
    assert sizing.resolve(values, progress=False) == out and len(calls) == 1  # reused, not measured again
    roomy = sizing.resolve({**values, "BUDGET_MINUTES": 240}, progress=False)  # another budget: planned anew
    assert len(calls) == 2 and roomy["PER_CATEGORY"] > 1
    assert sizing.resolve(values, progress=False) == out and len(calls) == 2  # the first plan is still there
    assert sizing.resolve({**values, "K": 6}, measure=False)["PER_CATEGORY"] == 1  # no plan for these parameters
    for sized in (roomy, out):  # the page finds the plan that chose its sizes
        p = params.Params.from_namespace(sized).check()
        assert sizing.page_said(p).startswith(f"{7 * sized['PER_CATEGORY']} prompts x {sized['MAX_NEW_TOKENS']} new")
        assert "timed on" in sizing.page_said(p)
    by_hand = params.Params.from_namespace({**out, "MAX_NEW_TOKENS": 40}).check()
    assert sizing.page_said(by_hand).endswith("as the parameter set fixes them")


def test_on_a_machine_the_reference_knows_its_newest_build_is_the_model(tmp_path, monkeypatch):
    """The newest reference build of this machine and these precisions is the whole cost model, at its own speed:
    nothing is timed, and that build's own sizes are predicted at its measured time; the plan says so."""
    ref = json.loads(REFERENCE.read_text())
    builds = [b for b in ref["builds"] if b["precision"] == "int8-dynamic/int4-dynamic"]
    by_machine: dict[str, list] = {}
    for b in builds:
        by_machine.setdefault(b["machine"], []).append(b)
    older, newest = next(bs for bs in by_machine.values() if len(bs) >= 2)[-2:]  # a machine with two builds
    monkeypatch.setattr(sizing, "machine", lambda: newest["machine"])
    monkeypatch.setattr(sizing, "precision", lambda values: newest["precision"])
    monkeypatch.setattr(sizing, "measure_speed", lambda *a, **k: pytest.fail("timed a machine the reference knows"))
    s = newest["sizes"]
    sizing.resolve(_values(tmp_path, BUDGET_MINUTES=60, SWEEP_PROMPTS=s["sweep_prompts"]), progress=False)
    plan = json.loads((tmp_path / "t-plan.json").read_text())[-1]
    assert plan["timed"] is False and plan["speed"] == 1.0 and plan["measure_s"] == 0.0
    assert plan["references"] == [f"{newest['date']} {newest['machine']}"]
    costs = {k: sizing.Costs(**c) for k, c in plan["costs"].items()}
    own = sizing.predict(costs, 1.0, s["prompts"], s["new_tokens"], 1, sweep_prompts=s["sweep_prompts"])
    assert math.isclose(own, newest["total_s"] - newest["measure_s"], rel_tol=1e-3)
    # fitted from the newest build alone: the older builds of the same machine are not in it
    assert costs == buildcosts.model([newest]) != buildcosts.model([older, newest])
    assert f"costed from this machine's newest recorded build ({newest['date']} at {newest['revision'][:7]})" in \
        sizing.said(plan)
    older_plan = {k: v for k, v in plan.items() if k != "costed_from"}  # as the committed build's plan was saved
    assert f"newest recorded build ({newest['date']})" in sizing.said(older_plan)
    p = params.Params.from_namespace(sizing.resolve(_values(tmp_path, BUDGET_MINUTES=60,
                                                            SWEEP_PROMPTS=s["sweep_prompts"]))).check()
    assert sizing.page_said(p).endswith(f"; planned on {newest['machine']}")  # not "timed": nothing was
    # the same machine at other precisions: its builds of those are no model of these; timed and scaled instead
    timed = []
    monkeypatch.setattr(sizing, "precision", lambda values: "float32/float32")
    monkeypatch.setattr(sizing, "measure_speed", lambda p, steps: timed.append(1) or {
        "speed": 1.0, "step_by_prompt_s": dict(steps), "measure_s": 1.0})
    sizing.resolve(_values(tmp_path, BUDGET_MINUTES=61, SWEEP_PROMPTS=s["sweep_prompts"]), progress=False)
    assert timed and json.loads((tmp_path / "t-plan.json").read_text())[-1]["timed"] is True


def test_a_notebook_run_with_the_default_set_takes_make_book_s_plan(tmp_path, monkeypatch):
    """papermill with ``-f params/cpu-embedded.yaml`` (or a notebook's own defaults, the same values) leaves the
    sizes ``auto``: the notebook takes the plan ``make book`` saved on this machine for those parameters, without
    timing anything, and the smallest sample where there is none; its globals get the sizes it ran."""
    def fake_speed(p, reference_steps):
        return {"speed": 0.5, "step_by_prompt_s": {q: s / 2 for q, s in reference_steps.items()}, "measure_s": 1.0}

    ns = _values(tmp_path, BUDGET_MINUTES=120)
    bare = dict(ns)
    smallest = sizing.of_notebook(bare)  # no plan yet
    assert (smallest.per_category, smallest.max_new_tokens, smallest.iterations) == (1, sizing.MIN_TOKENS, 1)
    assert [bare[k] for k in sizing.SIZED] == [1, sizing.MIN_TOKENS, 1]
    monkeypatch.setattr(sizing, "measure_speed", fake_speed)
    planned = sizing.resolve(ns, progress=False)  # what `make book` does first
    assert planned["PER_CATEGORY"] > 1
    monkeypatch.setattr(sizing, "measure_speed", lambda *a, **k: pytest.fail("a notebook timed the machine"))
    p = sizing.of_notebook(dict(ns))
    assert (p.per_category, p.max_new_tokens, p.iterations) == tuple(planned[k] for k in sizing.SIZED)


def test_a_read_only_set_takes_the_recorded_build_s_sizes_from_any_machine(tmp_path):
    """The committed-data book: its sizes are the plan saved beside the recorded runs, whichever machine made it;
    without a saved plan it says so; and its parameter set is the default set's with a few values changed."""
    committed = params.load_parameters("cpu-embedded-committed")
    default = params.load_parameters("cpu-embedded")
    assert {k: v for k, v in committed.items() if default.get(k) != v} == {
        "RUNS_DIR": "data/reference/book-cpu-embedded", "READ_ONLY": True, "SET_NAME": "cpu-embedded"}
    plan = {"key": {"machine": "some other CPU, 64 cores"}, "chosen": {"per_category": 3, "max_new_tokens": 24,
                                                                       "iterations": 2}}
    values = _values(tmp_path, READ_ONLY=True)
    with pytest.raises(ConfigError, match="holds no plan"):
        sizing.resolve(values)
    sizing.plan_path(values).write_text(json.dumps([plan]))
    out = sizing.resolve(values)
    assert [out[k] for k in sizing.SIZED] == [3, 24, 2]
    own = tmp_path / "mine.yaml"
    own.write_text("BASE: mine\n")
    with pytest.raises(ConfigError, match="BASE names the set itself"):
        params.load_parameters(str(own))
    own.write_text("BASE: smoke\nK: 5\n")
    assert params.load_parameters(str(own)) == {**params.load_parameters("smoke"), "K": 5}


def _with_notebooks(b, shares):
    """``b`` with its run parts split between notebooks by ``shares`` and its other time given to the last."""
    names = list(shares)
    nbs = {n: {"parts_s": {k: v * shares[n] for k, v in b["parts_s"].items() if k != "other"}} for n in names}
    for n in names:
        nbs[n]["parts_s"]["other"] = 0.0
    nbs[names[-1]]["parts_s"]["other"] = b["parts_s"]["other"] - 40.0 * b["step_s"] / 0.2  # 40 s outside notebooks
    for n in names:
        nbs[n]["seconds"] = sum(nbs[n]["parts_s"].values())
    return {**b, "total_s": sum(b["parts_s"].values()), "measure_s": 0.0, "notebooks": nbs}


def test_a_per_notebook_model_predicts_each_chapter_and_adds_up_to_the_whole():
    builds = [_with_notebooks(_build(32, 0.2), {"a": 0.25, "b": 0.75}),
              _with_notebooks(_build(16, 0.3), {"a": 0.25, "b": 0.75})]
    parts = buildcosts.model(builds)
    assert set(parts) == {"a", "b", buildcosts.OUTSIDE}
    whole = buildcosts.fit(builds)
    for prompts, tokens in ((7, 16), (14, 24), (35, 64)):
        split = {k: sizing.predict(c, 1.0, prompts, tokens, 1, sweep_prompts=3) for k, c in parts.items()}
        assert math.isclose(sum(split.values()), sizing.predict(whole, 1.0, prompts, tokens, 1, sweep_prompts=3),
                            rel_tol=1e-9)
        assert math.isclose(split[buildcosts.OUTSIDE], 40.0)
        # notebook a holds a quarter of the runs and nothing else; b the rest of the runs and the other work
        runs = sizing.predict(buildcosts.Costs(fixed=0.0, per_generation=whole.per_generation, per_token=whole.per_token,
                                               sweep_per_prompt=whole.sweep_per_prompt,
                                               sweep_per_token=whole.sweep_per_token), 1.0, prompts, tokens, 1,
                              sweep_prompts=3)
        assert math.isclose(split["a"], 0.25 * runs, rel_tol=1e-9)
    # one build without notebooks: the whole build as one part
    assert set(buildcosts.model([builds[0], _build(16, 0.3)])) == {"build"}


def test_the_reference_builds_of_this_machine_s_precision_are_the_ones_fitted():
    bf16, int8 = ({**_build(16, 0.2), "precision": "bfloat16/bfloat16"},
                  {**_build(16, 0.08, fixed=900.0), "precision": "int8-dynamic/int4-dynamic"})
    assert buildcosts.matching([bf16, int8], "int8-dynamic/int4-dynamic") == [int8]
    assert buildcosts.matching([bf16, int8], "float32/float32") == [bf16, int8]  # none of this kind: all
    ref = json.loads(REFERENCE.read_text())
    kinds = {b["precision"] for b in ref["builds"]}
    assert kinds == {"bfloat16/bfloat16", "int8-dynamic/int4-dynamic"}
    for b in ref["builds"]:  # a build's notebooks account for its time: each notebook's parts add up to its seconds
        for nb in b.get("notebooks", {}).values():
            assert math.isclose(sum(nb["parts_s"].values()), nb["seconds"], abs_tol=0.5)


def test_each_run_is_charged_to_the_notebook_running_when_it_began(tmp_path):
    values = {"SET_NAME": "t", "SWEEP_PROMPTS": 3, "TARGET": "x", "MAX_NEW_TOKENS": 16, "PER_CATEGORY": 1,
              "ITERATIONS": 1}
    for name, at, prompts, wall in (("t-bench-1", "2026-11-27T10:00:30+0000", None, 50.0),
                                    ("t-grid-2", "2026-11-27T10:01:10+0000", 3, 20.0),
                                    ("t-beyond-3", "2026-11-27T10:03:00+0000", None, 30.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"target": "x", "max_new_tokens": 16, "per_category": 1,
                                                   "iterations": 1, "prompts": prompts}))
        (d / "environment.json").write_text(json.dumps({"recorded_at": at, "machine": {"wall_s": wall}}))
        rows = [{"question_id": q, "mode": "baseline", "iteration": 0, "ttft_s": 1.0 / 3, "decode_s": 3.0,
                 "component_costs_s": {"target_step_s": step, "draft_step_s": 0.02}}
                for q, step in (("q1", 0.08), ("q2", 0.05), ("q3", 0.11))]
        (d / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t0 = 1_795_773_600.0  # 2026-11-27T10:00:00Z
    notebooks = [{"notebook": "ch4", "started": t0, "seconds": 100.0},
                 {"notebook": "ch6", "started": t0 + 100.0, "seconds": 150.0}]
    doc = buildcosts.build_costs(tmp_path, values, 300.0, notebooks=notebooks)
    ch4, ch6 = doc["notebooks"]["ch4"]["parts_s"], doc["notebooks"]["ch6"]["parts_s"]
    assert (ch4["main_prefill"], ch4["main_decode"], ch4["main_overhead"]) == (1.0, 9.0, 40.0)
    assert (ch4["sweep_prefill"], ch4["sweep_decode"], ch4["sweep_overhead"], ch4["other"]) == (1.0, 9.0, 10.0, 30.0)
    assert (ch6["main_prefill"], ch6["main_decode"], ch6["main_overhead"], ch6["other"]) == (1.0, 9.0, 20.0, 120.0)
    assert doc["parts_s"]["other"] == 300.0 - 100.0  # the whole build's split is the same as without notebooks
    # untimed by its plan: the step time of the run's first prompts, or of the reference's prompts where it ran them
    assert doc["step_by_prompt_s"] == {"q1": 0.1, "q2": 0.07, "q3": 0.13} and doc["step_s"] == 0.1
    on_refs = buildcosts.build_costs(tmp_path, values, 300.0, cost_prompts=["q3", "q2"])
    assert on_refs["step_by_prompt_s"] == {"q3": 0.13, "q2": 0.07} and on_refs["step_s"] == 0.1
    assert buildcosts.build_costs(tmp_path, values, 300.0, cost_prompts=["q9"])["step_by_prompt_s"] == doc[
        "step_by_prompt_s"]  # a reference prompt the run did not run: its own first prompts


def test_a_build_reads_each_notebooks_planned_seconds_from_the_plan_that_chose_its_sizes(tmp_path, monkeypatch):
    """The build's terminal shows a chapter's planned seconds (the Follower's lines say "of about N planned"): from
    the newest plan made on this machine for the budget that chose the sizes being built; none from another
    machine's plan, another budget's or another size's."""
    monkeypatch.setattr(sizing, "ROOT", tmp_path)
    values = {"SET_NAME": "s", "RUNS_DIR": "runs", "PER_CATEGORY": 2, "MAX_NEW_TOKENS": 24, "ITERATIONS": 1,
              "BUDGET_MINUTES": 40}
    here, sizes = sizing.machine(), {"per_category": 2, "max_new_tokens": 24, "iterations": 1}

    def plan(machine, parts, budget=40, **chosen):
        return {"key": {"machine": machine, "budget_minutes": budget}, "chosen": {**sizes, **chosen, "fits": True},
                "predicted_by_part_s": parts}

    (tmp_path / "runs").mkdir()
    sizing.plan_path(values).write_text(json.dumps([
        plan(here, {"ch4_results": 100.0}), plan("another CPU", {"ch4_results": 5.0}),
        plan(here, {"ch4_results": 7.0}, max_new_tokens=32), plan(here, {"ch4_results": 9.0}, budget=30)]))
    assert sizing.planned_s(values) == {"ch4_results": 100.0}
    assert sizing.planned_s({**values, "ITERATIONS": 2}) == {}
    out = io.StringIO()
    f = progress.Follower(tmp_path / "progress.log", out=out, pipe_every=0.01)
    f.follow(lambda: "still working" in out.getvalue(), interval=0.01, label="ch4_results", planned=100.0)
    assert "ch4_results: still working (0 s of about 100 planned)" in out.getvalue()


def test_the_plan_counts_the_k_means_the_build_would_run(tmp_path, monkeypatch):
    """Clusterings neither shipped nor cached cost k-means time inside the notebooks: the plan takes it from the
    budget before it sizes the sample, adds it to the prediction and says so before the build starts."""
    monkeypatch.setattr(sizing, "measure_speed", lambda p, steps: {"speed": 1.0, "step_by_prompt_s": dict(steps),
                                                                   "measure_s": 0.0})
    monkeypatch.setattr(sizing, "precision", lambda values: "bfloat16/bfloat16")
    free = sizing.resolve(_values(tmp_path, BUDGET_MINUTES=120, SET_NAME="free"), progress=False)
    monkeypatch.setattr(sizing, "kmeans_to_run", lambda values, draft_precision: {4748: 900.0, 9496: 1500.0})
    clustered = sizing.resolve(_values(tmp_path, BUDGET_MINUTES=120, SET_NAME="kmeans"), progress=False)
    plan, plan_free = (json.loads((tmp_path / f"{n}-plan.json").read_text())[-1] for n in ("kmeans", "free"))
    assert plan["kmeans_s"] == {"4748": 900.0, "9496": 1500.0} and plan_free["kmeans_s"] == {}
    size = [clustered[k] * (7 if k == "PER_CATEGORY" else 1) for k in sizing.SIZED]
    assert size < [free[k] * (7 if k == "PER_CATEGORY" else 1) for k in sizing.SIZED]  # 40 minutes fewer to spend
    costs = {k: sizing.Costs(**c) for k, c in plan["costs"].items()}
    runs = sizing.predict(costs, 1.0, 7 * clustered["PER_CATEGORY"], clustered["MAX_NEW_TOKENS"],
                          clustered["ITERATIONS"], sweep_prompts=clustered["SWEEP_PROMPTS"])
    assert math.isclose(plan["chosen"]["predicted_s"], round(runs, 1) + 2400.0, abs_tol=0.1)
    assert "40 of them for k-means (C = 4,748, 9,496: neither shipped nor cached)" in sizing.said(plan)
    assert "k-means" not in sizing.said(plan_free)


def test_the_plan_counts_what_the_build_spent_before_it(tmp_path, monkeypatch):
    """`make book` stamps the build's start before its set-up (the models' conversion, the kernels' compile): the
    plan takes the minutes spent since from the budget, adds them to the prediction and says so; a bad stamp is
    refused before anything is timed."""
    import time

    timed = []
    monkeypatch.setattr(sizing, "measure_speed", lambda p, steps: timed.append(1) or {
        "speed": 1.0, "step_by_prompt_s": dict(steps), "measure_s": 0.0})
    monkeypatch.setattr(sizing, "precision", lambda values: "bfloat16/bfloat16")
    fresh = sizing.resolve(_values(tmp_path, BUDGET_MINUTES=120, SET_NAME="warm"), progress=False)
    monkeypatch.setenv(sizing.STARTED_ENV, str(time.time() - 1800))
    late = sizing.resolve(_values(tmp_path, BUDGET_MINUTES=120, SET_NAME="cold"), progress=False)
    plan, plan_warm = (json.loads((tmp_path / f"{n}-plan.json").read_text())[-1] for n in ("cold", "warm"))
    assert 1800 <= plan["spent_s"] < 1800 + 60 and plan_warm["spent_s"] == 0
    size = [late[k] * (7 if k == "PER_CATEGORY" else 1) for k in sizing.SIZED]
    assert size < [fresh[k] * (7 if k == "PER_CATEGORY" else 1) for k in sizing.SIZED]  # 30 minutes fewer to spend
    costs = {k: sizing.Costs(**c) for k, c in plan["costs"].items()}
    runs = sizing.predict(costs, 1.0, 7 * late["PER_CATEGORY"], late["MAX_NEW_TOKENS"], late["ITERATIONS"],
                          sweep_prompts=late["SWEEP_PROMPTS"])
    assert math.isclose(plan["chosen"]["predicted_s"], round(runs, 1) + plan["spent_s"], abs_tol=0.1)
    assert "30 of them already spent on its set-up" in sizing.said(plan) and "set-up" not in sizing.said(plan_warm)
    for bad in ("soon", "nan"):
        monkeypatch.setenv(sizing.STARTED_ENV, bad)
        with pytest.raises(ConfigError, match=sizing.STARTED_ENV):
            sizing.resolve(_values(tmp_path, BUDGET_MINUTES=120, SET_NAME="bad"), progress=False)
    assert len(timed) == 2  # the bad stamps were refused before the steps were timed


def test_the_clusterings_to_make_are_those_neither_cached_nor_shipped(tmp_path, monkeypatch):
    """On a constructed draft head in an empty cache: the main head's and the co-design's cluster counts, less those
    cached; none where the set gives FlashHead's assets or a draft this machine has not converted."""
    import torch
    from safetensors.torch import save_file

    from thesis_lib.heads import assets
    from thesis_lib.models.embedded import EMBEDDED, converted_dir

    monkeypatch.undo()  # the real function, not the fixture's stand-in
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path))
    values = {"DRAFT": "embedded:qwen2.5-coder-0.5b-instruct", "CLUSTERS": 4, "CODESIGN_CLUSTER_SIZES": [16, 8, 16],
              "KMEANS_ITERATIONS": 3}
    assert sizing.kmeans_to_run(values, "int4-dynamic") == {}  # not converted here: nothing to read
    head = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    folder = converted_dir(EMBEDDED["qwen2.5-coder-0.5b-instruct"], "int4-dynamic")
    folder.mkdir(parents=True)
    save_file({"lm_head.weight": head, "model.embed_tokens.weight": torch.zeros(64, 8)}, str(folder / "model.safetensors"))
    todo = sizing.kmeans_to_run(values, "int4-dynamic")
    assert sorted(todo) == [4, 8] and all(s > 0 for s in todo.values())  # 64/16 = 4 is the main head's count
    sha = assets.head_sha256(head.float())
    assert sha != assets.head_sha256(torch.zeros(64, 8))  # the head's rows, not the embedding's, are the key
    assets.cache_folder(sha, 8, 0, 3, assets.fast_bf16()).mkdir(parents=True)
    assert sorted(sizing.kmeans_to_run(values, "int4-dynamic")) == [4]
    assert sorted(sizing.kmeans_to_run({**values, "KMEANS_ITERATIONS": 20}, "int4-dynamic")) == [4, 8]  # other key
    assert sizing.kmeans_to_run({**values, "ASSETS": "embedl/Qwen3-0.6B-FlashHead"}, "int4-dynamic") == {}
    assert sizing.kmeans_to_run({**values, "DRAFT": "Qwen/Qwen3-0.6B"}, "int4-dynamic") == {}


@pytest.mark.real
def test_the_default_set_s_clusterings_are_shipped_for_its_draft(monkeypatch):
    """The default draft's head, read from its converted folder as the planner reads it, has the key of the shipped
    clusterings: a fresh build of the default set runs no k-means."""
    monkeypatch.undo()
    kmeans_to_run = sizing.kmeans_to_run
    values = params.load_parameters("cpu-embedded")
    draft = sizing.precision(values).split("/")[1]
    assert kmeans_to_run(values, draft) == {}
    assert sorted(kmeans_to_run({**values, "CLUSTERS": 9000}, draft)) == [9000]
