"""The thesis' cost regime beside the fastest setting: the curve's points, the residual's attribution and the
per-category rounds, on constructed runs whose answers are known; where the book finds the regime's runs."""

from __future__ import annotations

import json

import pytest

from thesis_lib.analysis import diagnostics, headline, theory
from thesis_lib.bench.runs import Run
from thesis_lib.errors import ConfigError


def _sample(q, category, mode, decode_s, *, rounds=0, emitted=0, accepted=0, drafted=0, step=0.2):
    """One sample; its prompt's component costs: a target step of ``step`` s (blocks of 4 and 5 at 1.1 and 1.2
    steps), the dense draft's step 0.03 s and FlashHead's 0.02 s."""
    costs = {"target_step_s": step, "draft_step_s": 0.03, "flash_draft_step_s": 0.02,
             "target_verify_4_s": 1.1 * step, "target_verify_5_s": 1.2 * step}
    return dict(question_id=q, iteration=0, category=category, mode=mode, decode_tokens=20, new_tokens=21,
                decode_s=decode_s, ttft_s=0.5, rounds=rounds, emitted=emitted, accepted=accepted, drafted=drafted,
                component_costs_s=costs)


def _run(dtype: str, flash_s: float, emitted_code: int, step: float = 0.2) -> Run:
    """Two categories of two prompts; target-only decodes 20 tokens in 4 s; FlashHead deferred in ``flash_s``
    seconds, in 5 rounds of 4 drafted tokens, emitting ``emitted_code`` tokens per code prompt and 20 per chat
    prompt."""
    samples = []
    for q, category in ((0, "code"), (1, "code"), (2, "chat"), (3, "chat")):
        emitted = emitted_code if category == "code" else 20
        samples += [_sample(q, category, "baseline", 4.0, step=step),
                    _sample(q, category, "flash_deferred", flash_s, rounds=5, emitted=emitted, accepted=emitted - 5,
                            drafted=20, step=step)]
    env = {"models": {"target": {"dtype_requested": dtype}}, "cpu": "a CPU"}
    return Run(path=None, config={"k": 4, "name": dtype, "max_new_tokens": 21}, environment=env, samples=samples)


def test_the_curve_s_points_are_each_run_s_costs_speedup_and_model():
    """One point per run, sorted by the draft's cost in target steps: c = 0.02 / 0.2 s for the float32 run, the
    block 0.24 / 0.2, the speedup 4 s over flash_s, and the model's E / (K c + v) at the run's own round."""
    points = headline.regime_points([_run("int8-dynamic", 2.0, 20, step=0.08), _run("float32", 1.6, 15)])
    assert points["precision"].tolist() == ["float32", "int8-dynamic"]  # c = 0.1, then 0.25
    assert points.set_index("precision").loc["int8-dynamic", "c"] == pytest.approx(0.25)
    f32 = points.set_index("precision").loc["float32"]
    assert f32["c"] == pytest.approx(0.1) and f32["verify"] == pytest.approx(1.2)
    assert f32["speedup"] == pytest.approx(4.0 / 1.6) and f32["base_tok_s"] == pytest.approx(5.0)
    e = (15 * 2 + 20 * 2) / 20  # tokens per round over all four prompts
    assert theory.expected_emitted(f32["alpha"], 4) == pytest.approx(e, rel=1e-6)
    assert f32["model"] == pytest.approx(e / (4 * 0.1 + 1.2), rel=1e-6)
    assert f32["c_lo"] == pytest.approx(0.1) and f32["c_hi"] == pytest.approx(0.1)  # every prompt alike


def test_attribution_changes_one_cause_at_a_time():
    run = _run("float32", 1.6, 15)
    steps = theory.attribution(run, "flash_deferred", thesis_emitted=3.6, thesis_c=0.09)
    e = 70 / 20
    assert steps["Tokens per round"].tolist() == pytest.approx([e, 3.6, 3.6, 3.6])
    assert steps["Draft step (target steps)"].tolist() == pytest.approx([0.1, 0.1, 0.09, 0.09])
    assert steps["Block of 5 (target steps)"].tolist() == pytest.approx([1.2, 1.2, 1.2, 1.0])
    assert steps["Predicted speedup"].tolist() == pytest.approx(
        [e / 1.6, 3.6 / 1.6, 3.6 / (0.36 + 1.2), 3.6 / 1.36])


def test_the_ordinary_schedule_pays_a_standalone_append():
    run = _run("float32", 1.6, 15)
    run.samples += [{**r, "mode": "flash_ordinary"} for r in run.of("flash_deferred")]
    ordinary = theory.attribution(run, "flash_ordinary", 3.6, 0.09)["Predicted speedup"]
    assert ordinary.tolist() == pytest.approx([e / (b + 1) for e, b in zip(
        [3.5, 3.6, 3.6, 3.6], [1.6, 1.6, 1.56, 1.36])])


def test_rounds_by_category_pool_each_category_s_prompts():
    table = diagnostics.category_ratios(_run("float32", 1.6, 15), {"Speedup": ("flash_deferred", "baseline")},
                                        rounds="flash_deferred").set_index("Category")
    assert table.index.tolist() == ["chat", "code", "all"]
    assert table.loc["code", "Tokens per round"] == pytest.approx(3.0)
    assert table.loc["chat", "Tokens per round"] == pytest.approx(4.0)
    assert table.loc["code", "Acceptance"] == pytest.approx(10 / 20) and table.loc["all", "Prompts"] == 4
    assert table.loc["all", "Speedup"] == pytest.approx(4.0 / 1.6)


def test_side_by_side_keeps_each_setting_s_verdicts():
    fast = headline.judge({"4.10|Base only vs. FlashHead deferred": (1.5, 1.4, 1.6)})
    regime = headline.judge({"4.10|Base only vs. FlashHead deferred": (2.1, 1.9, 2.3)})
    row = headline.side_by_side(fast, regime).set_index("Finding").loc[
        "FlashHead deferred over target-only decoding (Table 4.10)"]
    assert (row["Default setting: against the thesis"], row["Thesis' regime: against the thesis"]) == ("smaller", "reproduced")
    assert row["Thesis' regime: 95 % interval"] == "1.90-2.30x" and row["Default setting"] == 1.5
    mine = headline.side_by_side(fast, regime, {"default": "This build", "regime": "Regime"})
    assert list(mine.columns[2:5]) == ["This build", "This build: 95 % interval", "This build: against the thesis"]


def _folder(tmp_path, set_name, kinds=("bench", "profile")):
    for kind in kinds:
        (tmp_path / f"{set_name}-{kind}-0123456789").mkdir(parents=True)
        (tmp_path / f"{set_name}-{kind}-0123456789" / "summary.json").write_text("{}")
    (tmp_path / f"{set_name}-model-bench-0123456789.json").write_text(json.dumps({}))


def test_the_regime_is_read_from_a_build_of_its_set_else_from_the_committed_data(tmp_path, monkeypatch):
    """A folder holding only the default set's runs (or a regime build missing its profiled run) leaves the committed
    regime; one holding the regime's three results is that build's; another set's runs are never taken for it."""
    _folder(tmp_path, "cpu-embedded")
    assert headline.regime_folder(tmp_path)[0] == headline.REGIME
    assert "committed" in headline.regime_folder(None)[1]
    _folder(tmp_path, headline.REGIME_SET, kinds=("bench",))
    assert headline.regime_folder(tmp_path)[0] == headline.REGIME
    _folder(tmp_path, headline.REGIME_SET, kinds=("profile",))
    folder, said = headline.regime_folder(tmp_path)
    assert folder == tmp_path and "this machine's build" in said
    with pytest.raises(ConfigError, match="no main run"):
        headline.committed(tmp_path, "cpu-embedded-int4")


def test_a_run_s_machine_names_the_vector_extensions_it_ran_with():
    """Two 2-core AMD EPYCs are different machines when one ran AVX-512 kernels and the other AVX2: torch's recorded
    capability says so, or for older runs the kernel path their models recorded; unknown stays unnamed."""
    new = {"cpu": "AMD EPYC", "torch_threads": 2, "cpu_capability": "AVX512"}
    old = {"cpu": "AMD EPYC", "torch_threads": 2, "models": {"draft": {"cpu_kernels": "int8-dynamic (..., AVX2 kernel)"},
                                                             "target": {"cpu_kernels": "oneDNN-packed (197 layers)"}}}
    assert headline.machine_said(new) == "AMD EPYC (AVX-512, 2 threads)"
    assert headline.machine_said(old) == "AMD EPYC (AVX2, 2 threads)"
    assert headline.cpu_kind({"cpu": "AMD EPYC", "models": {}}) is None
    assert headline.machine_said({"cpu": "AMD EPYC", "torch_threads": 2}) == "AMD EPYC (2 threads)"


def test_the_regime_s_speed_is_set_beside_its_curve_s_fastest_precision():
    """Rates from one machine's curve: the regime's precision beside the one whose FlashHead deferred decodes
    fastest (target-only 20 tokens in 4 s; FlashHead deferred in 1.6 s at float32, 0.8 s at int8-dynamic)."""
    points = headline.regime_points([_run("float32", 1.6, 15), _run("int8-dynamic", 0.8, 15, step=0.08)])
    assert headline.regime_speed(points, "float32") == (
        "on its machine the regime decodes at 5.0 tokens/s target-only and 12.5 with FlashHead deferred; the fastest "
        "of the 2 target precisions measured there, int8-dynamic, at 5.0 and 25.0")
    assert "the 1 target precisions measured there, float32, at 5.0 and 12.5" in headline.regime_speed(
        points.iloc[[0]].reset_index(drop=True), "float32")


def test_a_build_of_the_regime_s_own_set_is_its_own_regime(tmp_path):
    """The regime's set shows its own runs, never another build's in the same folder; any other set reads the
    regime from the folder, or from the committed data."""
    own, curve = ("main", "profile", {}), ["curve-run"]
    assert headline.regime_beside(headline.REGIME_SET, tmp_path, own, curve) == (own, ["main", "curve-run"], "this build")
    data, runs, said = headline.regime_beside("smoke", tmp_path, own, curve)
    assert "committed" in said and data[0].name.startswith(headline.REGIME_SET) and runs[0].name == data[0].name
    assert len(runs) == 4  # the committed main run and its three curve runs


def test_the_round_in_target_steps_splits_into_draft_path_and_the_rest():
    """Target-only decoding takes 0.2 s a token; FlashHead deferred 1.6 s over 5 rounds a prompt, 0.4 s of it
    proposing: a round of 1.6 steps, 0.4 of them the draft path. The thesis' row reads Tables 4.9 and 4.11: 3.642
    tokens a round at 11.374 tok/s against 5.326 (1.705 steps), 41.6 % of it the draft path."""
    run = _run("float32", 1.6, 15)
    for r in run.of("flash_deferred"):
        r["phase_s"] = {"draft_propose": 0.4, "target_verify": 1.2}
    shape = theory.round_shape({"constructed": run}).set_index("Source")
    thesis, ours = shape.iloc[0], shape.loc["constructed"]
    assert (thesis["Round"], thesis["Draft path"]) == pytest.approx((1.705, 0.709), abs=5e-4)
    assert thesis["Tokens per round"] == pytest.approx(3.642)
    assert (ours["Round"], ours["Draft path"], ours["The rest"]) == pytest.approx((1.6, 0.4, 1.2))
    assert ours["Tokens per round"] == pytest.approx(3.5)
    assert (ours["95 % low"], ours["95 % high"]) == pytest.approx((1.6, 1.6))  # every prompt alike
    said = headline.round_said(shape.reset_index(), 4, 0.088)
    assert "cost 1.71 steps" in said and "2.0 times its 4 isolated draft steps (0.35 steps)" in said
    assert "costs 1.60 steps (1.60 to 1.60), less than the thesis'" in said


def test_the_round_is_as_much_as_the_thesis_where_its_interval_holds_the_thesis_round():
    run = _run("float32", 1.6, 15)
    run.samples = [{**r, "decode_s": r["decode_s"] * (1.2 if r["question_id"] % 2 else 0.95) * 1.705 / 1.6}
                   if r["mode"] == "flash_deferred" else r for r in run.samples]
    shape = theory.round_shape({"constructed": run})
    low, high = shape.iloc[-1][["95 % low", "95 % high"]]
    assert low < 1.705 < high
    assert ", as much as the thesis'" in headline.round_said(shape, 4, 0.088)
