"""The book's sample sized to a time budget (thesis_lib.book.sizing): the cost model, the choice, the fit from
reference builds, the committed reference, and the plan's reuse, on constructed costs (no model is loaded)."""

import json
import math

import pytest

from thesis_lib.book import params, sizing
from thesis_lib.errors import ConfigError

REFERENCE = params.ROOT / "data" / "reference" / "book-costs-cpu-embedded.json"


def test_the_choice_takes_prompts_before_tokens_and_tokens_before_iterations():
    costs = sizing.Costs(other=100.0, sample=1.0, sweep=0.0)
    # 7 categories: one prompt each at 16 tokens costs 100 + 112 s; two each 100 + 224 s; one each at 32 tokens 324 s
    two = sizing.choose(costs, 1.0, 330, categories=7, max_per_category=5)
    assert (two["per_category"], two["max_new_tokens"], two["iterations"]) == (2, 16, 1)  # not 7 prompts x 32
    assert two["fits"] and math.isclose(two["predicted_s"], 324.0)
    # more room: 5 per category is the most there is; then tokens (5 x 7 x 48 = 1680), then iterations
    roomy = sizing.choose(costs, 1.0, 100 + 1680 + 1, categories=7, max_per_category=5)
    assert (roomy["per_category"], roomy["max_new_tokens"], roomy["iterations"]) == (5, 48, 1)
    roomier = sizing.choose(costs, 1.0, 100 + 35 * 64 * 2 + 1, categories=7, max_per_category=5)
    assert (roomier["per_category"], roomier["max_new_tokens"], roomier["iterations"]) == (5, 64, 2)
    # the same budget on a machine twice as slow buys less
    slow = sizing.choose(costs, 2.0, 330, categories=7, max_per_category=5)
    assert (slow["per_category"], slow["max_new_tokens"], slow["iterations"], slow["fits"]) == (1, 16, 1, False)
    assert math.isclose(slow["predicted_s"], 2 * (100 + 7 * 16))


def test_sizes_the_set_fixes_are_kept():
    costs = sizing.Costs(other=100.0, sample=1.0, sweep=0.5, tokens=2.0)
    got = sizing.choose(costs, 1.0, 10_000, categories=7, max_per_category=5, fixed={"max_new_tokens": 20})
    assert got["max_new_tokens"] == 20 and got["per_category"] == 5
    assert math.isclose(got["predicted_s"], sizing.predict(costs, 1.0, 35, 20, got["iterations"]))
    assert got["iterations"] == sizing.MAX_ITERATIONS == 3
    tight = sizing.choose(costs, 1.0, 900, categories=7, max_per_category=5, fixed={"per_category": 1, "iterations": 2})
    assert (tight["per_category"], tight["iterations"]) == (1, 2)  # 100 + 7 x 2 x T + 0.5 x 2 x T + 2 x T <= 900
    assert tight["max_new_tokens"] == 32 and sizing.predict(costs, 1.0, 7, 48, 2) > 900


def test_the_fit_recovers_a_per_token_term_from_two_builds_at_different_speeds():
    def build(tokens, step_s):  # a machine step_s / 0.2 times the first one's speed
        slow = step_s / 0.2
        return {"sizes": {"prompts": 7, "new_tokens": tokens, "iterations": 1, "sweep_prompts": 3}, "step_s": step_s,
                "parts_s": {"sample": slow * 5.0 * 7 * tokens, "sweep": slow * 10.0 * tokens,
                            "other": slow * (600.0 + 12.0 * tokens)}}

    costs = sizing.fit([build(32, 0.2), build(16, 0.3)])
    assert math.isclose(costs.sample, 5.0) and math.isclose(costs.sweep, 10.0)
    assert math.isclose(costs.other, 600.0) and math.isclose(costs.tokens, 12.0)
    one = sizing.fit([build(32, 0.2)])  # one new-token count: the rest is all "other"
    assert math.isclose(one.other, 600.0 + 12.0 * 32) and one.tokens == 0.0
    with pytest.raises(ConfigError):
        sizing.fit([])


def test_the_committed_reference_splits_its_build_and_simulates_the_other_machines():
    ref = json.loads(REFERENCE.read_text())
    b = ref["builds"][0]
    run_dir = params.ROOT / "data" / "reference" / "book-cpu-embedded"
    sweep_runs = [d for d in run_dir.iterdir() if (d / "config.json").is_file()
                  and json.loads((d / "config.json").read_text())["prompts"] == 3]
    assert sorted(d.name.split("-")[2] for d in sweep_runs) == ["grid", "pipelined"]
    gen = sum(json.loads(line)["ttft_s"] + json.loads(line)["decode_s"] for d in sweep_runs
              for line in (d / "samples.jsonl").read_text().splitlines())
    assert math.isclose(b["parts_s"]["sweep"], gen, abs_tol=0.1)
    assert math.isclose(sum(b["parts_s"].values()), b["total_s"], abs_tol=0.2)
    again = sizing.build_costs(run_dir, "cpu-embedded", b["total_s"], sweep_prompts=3)
    assert again["parts_s"] == b["parts_s"] and again["step_by_prompt_s"] == b["step_by_prompt_s"]
    costs = sizing.fit(ref["builds"])
    at = b["sizes"]  # the model predicts its own reference build at the reference's speed
    assert math.isclose(sizing.predict(costs, 1.0, at["prompts"], at["new_tokens"], at["iterations"]), b["total_s"],
                        rel_tol=0.02)
    # The other machine kinds, simulated by their step times relative to the reference: the AVX-512 BF16 EPYC
    # built the same book in 30 min against the reference's 44 (0.69x), the AVX2 EPYC in float32 in 81 (1.84x)
    fast = sizing.choose(costs, 30.4 / 43.9, 30 * 60, categories=7, max_per_category=5)
    slow = sizing.choose(costs, 81 / 43.9, 30 * 60, categories=7, max_per_category=5)
    assert fast["fits"] and fast["predicted_s"] <= 30 * 60
    assert 7 * fast["per_category"] * fast["max_new_tokens"] >= 7 * 16
    assert not slow["fits"] and (slow["per_category"], slow["max_new_tokens"], slow["iterations"]) == (1, 16, 1)
    assert "over the budget" in sizing.said({"chosen": slow, "prompts": 7, "budget_minutes": 30, "speed": 81 / 43.9})


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
    fixed = _values(tmp_path, PER_CATEGORY=2, MAX_NEW_TOKENS=24, ITERATIONS=1)
    assert sizing.resolve(fixed) is fixed  # nothing left to plan: no measurement, values as given


def test_a_plan_is_measured_once_saved_and_reused_on_the_same_machine(tmp_path, monkeypatch):
    calls = []

    def fake_speed(p, reference_steps, progress=True):
        calls.append(sorted(reference_steps))
        return {"speed": 2.0, "step_by_prompt_s": {q: 2 * s for q, s in reference_steps.items()}, "measure_s": 1.0}

    monkeypatch.setattr(sizing, "measure_speed", fake_speed)
    values = _values(tmp_path)
    out = sizing.resolve(values, progress=False)
    assert [out[k] for k in sizing.SIZED] == [1, 16, 1] and len(calls) == 1  # twice as slow: the smallest sample
    plan = json.loads((tmp_path / "t-plan.json").read_text())
    assert plan["speed"] == 2.0 and plan["chosen"]["fits"] is False and plan["budget_minutes"] == 30
    assert sizing.resolve(values, progress=False) == out and len(calls) == 1  # reused, not measured again
    roomy = sizing.resolve({**values, "BUDGET_MINUTES": 240}, progress=False)  # another budget: planned anew
    assert len(calls) == 2 and roomy["PER_CATEGORY"] > 1
    assert sizing.resolve(values, measure=False)["PER_CATEGORY"] == 1  # no matching plan, no measuring: smallest
    p = params.Params.from_namespace(roomy).check()
    assert sizing.page_said(p).startswith(f"{7 * roomy['PER_CATEGORY']} prompts x {roomy['MAX_NEW_TOKENS']} new tokens")
    assert "as the parameter set fixes them" in sizing.page_said(params.Params.from_namespace(out).check())
