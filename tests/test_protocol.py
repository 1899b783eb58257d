"""The benchmark protocol on tiny local models: run folders (never overwritten, resumable after an
interruption without losing a sample), the pipelined schedule, the profiled drafter, and the thesis' tables
recomputed from the samples."""

from __future__ import annotations

import json

import pytest

from thesis_lib import cli
from thesis_lib.analysis import diagnostics, tables
from thesis_lib.bench import metrics, modes, protocol, runs
from thesis_lib.decoding.clocks import PhaseClock
from thesis_lib.decoding.drafters import DRAFT_PHASES, ModelDrafter, ProfiledDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError, ThesisLibError
from thesis_lib.models import loading, tiny

THESIS_4_5 = ["Mode", "Decode Tok/s", "TTFT (ms)", "Acceptance", "Decode total (ms)", "Draft propose (ms)",
              "Base verify (ms)", "Finalize (ms)"]
THESIS_4_7 = ["Mode", "Decode Tok/s", "Decode total (ms)", "Draft propose share", "Base verify share",
              "Finalize share", "Acceptance", "Mean emitted"]
THESIS_4_9 = ["Mode", "Samples", "Decode Tok/s", "TTFT (ms)", "Decode total (ms)", "Acceptance", "Mean emitted",
              "Base verify calls", "Base append calls"]
THESIS_4_11 = ["Mode", "Draft path (ms)", "Draft path share", "Draft ms/decode tok", "Draft path Tok/s"]
SPEEDUPS = ["Comparison", "Metric", "A", "B", "Speedup"]

FLASH = dict(clusters=17, probes=3, kmeans_iterations=4, flash_path="eager")


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("pair")
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, root / "t")
    draft = tiny.save_tiny(tiny.noisy_copy(tiny.tiny_model(seed=0), 0.02), tok, root / "d")
    return str(target), str(draft)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))


def _config(pair_dir, out, **kw):
    target, draft = pair_dir
    base = dict(out=str(out), target=target, draft=draft, k=3, max_new_tokens=12, per_category=1, prompts=3,
                costs=False, modes=("baseline", "dense_ordinary", "dense_deferred"))
    base.update(kw)
    return protocol.BenchConfig(**base)


# --- the loops -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("draft_role", ["close", "loose"])
def test_pipelined_schedule_gives_the_ordinary_schedules_tokens_and_counts(tiny_models, draft_role):
    target = ModelState(tiny_models[("f64", "qwen3", "target")])
    drafter = ModelDrafter(tiny_models[("f64", "qwen3", draft_role)])
    ids = [5, 17, 99, 3, 42, 7]
    base = greedy_generate(target, ids, max_new_tokens=30)
    assert base.stats.append_calls == base.stats.new_tokens - 1  # every decode step is an append
    ordinary = speculative_generate(target, drafter, ids, k=4, max_new_tokens=30)
    piped = speculative_generate(target, drafter, ids, k=4, max_new_tokens=30, schedule="pipelined")
    assert piped.tokens == ordinary.tokens == base.tokens
    assert piped.stats.mode == "dense_pipelined"
    for field in ("drafted", "accepted", "emitted", "verify_calls", "append_calls", "skipped"):
        assert getattr(piped.stats, field) == getattr(ordinary.stats, field), field


def test_the_pipelined_wait_for_the_append_synchronises_the_target_only(tiny_models):
    """On a GPU, waiting for the worker's append must not also wait for the draft's device (that would undo the
    overlap): every finalization phase that waits on the append names the target's device, and there is one such
    wait per append."""
    target = ModelState(tiny_models[("f64", "qwen3", "target")])
    seen = []

    class Recording(PhaseClock):
        def phase(self, name, *devices):
            seen.append((name, devices))
            return super().phase(name, *devices)

    clock = Recording()
    gen = speculative_generate(target, ModelDrafter(tiny_models[("f64", "qwen3", "loose")]), [5, 17, 99, 3],
                               k=3, max_new_tokens=20, schedule="pipelined", clock=clock)
    waits = [devices for name, devices in seen if name == "finalize_align" and devices]
    assert waits and all(d == (target.device,) for d in waits)
    assert len(waits) == gen.stats.append_calls
    # each schedule's verification waits for the target's device alone
    for schedule in ("ordinary", "deferred", "pipelined"):
        seen.clear()
        speculative_generate(target, ModelDrafter(tiny_models[("f64", "qwen3", "loose")]), [5, 17, 99, 3], k=3,
                             max_new_tokens=20, schedule=schedule, clock=clock)
        verifies = [devices for name, devices in seen if name == "target_verify"]
        assert verifies and all(d == (target.device,) for d in verifies), schedule


def test_unknown_schedule_is_refused(tiny_models):
    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    drafter = ModelDrafter(tiny_models[("f32", "qwen3", "close")])
    with pytest.raises(ConfigError, match="Unknown schedule"):
        speculative_generate(target, drafter, [1, 2], k=2, max_new_tokens=5, schedule="eager")


def test_profiled_drafter_proposes_the_same_tokens_and_splits_its_time(tiny_models):
    model = tiny_models[("f32", "qwen3", "close")]
    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    plain = speculative_generate(target, ModelDrafter(model), [4, 8, 15, 16], k=3, max_new_tokens=20)
    prof = ProfiledDrafter(model)
    clock = PhaseClock()
    prof.clock = clock
    gen = speculative_generate(target, prof, [4, 8, 15, 16], k=3, max_new_tokens=20, clock=clock)
    assert gen.tokens == plain.tokens and gen.stats.accepted == plain.stats.accepted
    ph = gen.stats.phase_s
    assert set(DRAFT_PHASES) <= set(ph)
    assert clock.calls["draft_prefill"] == 1  # the prompt, once
    # the draft aligns after every round but one that ended the output
    assert clock.calls["draft_align"] in (gen.stats.rounds - 1, gen.stats.rounds) and gen.stats.rounds > 1
    assert clock.calls["draft_head"] == sum(gen.stats.drafted)  # one head call per drafted token
    assert clock.calls["draft_body"] == sum(gen.stats.drafted)  # the first proposal too is a one-token step
    inner = sum(ph[p] for p in ("draft_body", "draft_head", "draft_materialize"))
    assert 0 < inner <= ph["draft_propose"]  # nested inside the loop's proposal phase
    # the draft's prompt prefill is prompt processing: inside the prefill phase, in TTFT, not in the decode time
    assert 0 < ph["draft_prefill"] <= ph["prefill"] <= gen.stats.ttft_s


@pytest.mark.parametrize("stop_below", [0.3, 0.6])
def test_profiled_drafter_stops_where_the_plain_one_stops(tiny_models, stop_below):
    """One proposal path: timed or not, a confidence-stopped draft proposes the same blocks (a profiled drafter
    that ignored the stop would propose full blocks)."""
    model = tiny_models[("f32", "qwen3", "close")]
    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    plain_drafter = ModelDrafter(model, stop_below=stop_below)
    plain = speculative_generate(target, plain_drafter, [4, 8, 15, 16], k=6, max_new_tokens=24)
    prof = ProfiledDrafter(model, stop_below=stop_below)
    prof.clock = clock = PhaseClock()
    gen = speculative_generate(target, prof, [4, 8, 15, 16], k=6, max_new_tokens=24, clock=clock)
    assert gen.tokens == plain.tokens and gen.stats.drafted == plain.stats.drafted
    assert prof.stopped_early == plain_drafter.stopped_early > 0
    assert clock.calls["draft_head"] == sum(gen.stats.drafted)  # the stopping head call is timed as the head


def test_the_largest_block_covers_every_mode_s_k_and_the_carried_token(pair_dir, tmp_path):
    """The exactness probe's bound: the run's K, a variant's own K, and k_max for the modes whose block length
    a policy or a confidence stop chooses, each plus the deferred schedule's carried token."""
    cfg = lambda **kw: _config(pair_dir, tmp_path, **kw)  # noqa: E731
    assert cfg(k=3).largest_block() == 4
    assert cfg(k=3, modes=("baseline", "flash_deferred@k6")).largest_block() == 7
    assert cfg(k=5, modes=("baseline", "flash_deferred@k2")).largest_block() == 3  # the variant's K, not the run's
    assert cfg(k=3, k_max=9, modes=("baseline", "dense_deferred", "flash_deferred_ck")).largest_block() == 10
    assert cfg(k=3, k_max=9, modes=("baseline", "dense_deferred")).largest_block() == 4  # k_max bounds no mode here
    assert cfg(k=4, modes=("sample_baseline", "sample_flash")).largest_block() == 5  # speculative sampling: K + 1
    assert cfg(k=4, modes=("baseline", "sample_baseline", "hf_greedy")).largest_block() == 1  # one token a step
    # a tree verifies its root and every node: K x width nodes at most, a variant's own, or the shape's
    assert cfg(k=4, tree_width=3, modes=("baseline", "flash_tree")).largest_block() == 13
    assert cfg(k=4, modes=("baseline", "flash_tree@k5w2", "dense_tree@n20")).largest_block() == 21
    assert cfg(k=2, tree_shape="0 1 0.0 0.1 1.0", modes=("baseline", "dense_tree")).largest_block() == 6
    for bad in (dict(tree_width=0), dict(tree_shape="0.0")):
        with pytest.raises(ConfigError):
            cfg(modes=("baseline", "flash_tree"), **bad).check()
    with pytest.raises(ConfigError, match="width"):
        cfg(modes=("baseline", "flash_deferred@k4w2")).check()


def test_the_predicted_rate_charges_each_round_s_forwards_at_their_measured_costs():
    """A sample's predicted decode tok/s, worked by hand: 9 drafted tokens at 4 ms (FlashHead: 3 ms), 3 verify
    forwards of K (ordinary) or K+1 (deferred) rows, each ordinary round's append at 25 ms; 13 tokens after the
    first (the prefills are TTFT's). Records the model cannot price give None."""
    costs = {"draft_step_s": 0.004, "flash_draft_step_s": 0.003,
             "target_verify_3_s": 0.030, "target_verify_4_s": 0.032, "target_step_s": 0.025}
    rec = dict(mode="dense_ordinary", k=3, new_tokens=14, first_emit=1, rounds=3, drafted=9, verify_calls=3,
               append_calls=3)
    assert metrics.predicted_tokens_per_s(rec, costs) == pytest.approx(13 / (9 * 0.004 + 3 * 0.030 + 3 * 0.025))
    deferred = dict(rec, mode="flash_deferred", append_calls=0)
    assert metrics.predicted_tokens_per_s(deferred, costs) == pytest.approx(13 / (9 * 0.003 + 3 * 0.032))
    assert metrics.predicted_tokens_per_s(dict(rec, new_tokens=2), costs) == pytest.approx(1 / 0.201)  # 2 is enough
    assert metrics.predicted_tokens_per_s(dict(rec, mode="shared_ordinary"), costs) == pytest.approx(13 / 0.201)
    for unpriced in (dict(rec, new_tokens=1), {k: v for k, v in rec.items() if k != "rounds"},
                     dict(rec, mode="dense_pipelined"), dict(rec, mode="flash_deferred_ck"),
                     dict(rec, mode="sample_dense"), dict(rec, mode="ngram_deferred"), dict(rec, k=5)):
        assert metrics.predicted_tokens_per_s(unpriced, costs) is None, unpriced


def test_a_sample_is_keyed_by_its_iteration_prompt_and_mode():
    """What a resumed run matches records by (a record from before iterations were kept is iteration 0)."""
    assert metrics.sample_key(dict(iteration=2, question_id=7, mode="flash_deferred")) == (2, "7", "flash_deferred")
    assert metrics.sample_key(dict(question_id="a", mode="baseline")) == (0, "a", "baseline")


def test_a_sample_record_holds_what_the_generation_did(tiny_models):
    """One record per prompt x mode: counts and rates as the generation's own lists give them, computed here from
    the lists, and whether its tokens equal the reference."""
    from thesis_lib.bench.prompts import Prompt

    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    gen = speculative_generate(target, ModelDrafter(tiny_models[("f32", "qwen3", "loose")]), [3, 1, 4, 1, 5],
                               k=3, max_new_tokens=16, schedule="deferred")
    st = gen.stats
    rec = metrics.sample_record(Prompt("q7", "coding", "x"), "dense_deferred", gen, list(gen.tokens), iteration=2)
    assert (rec["question_id"], rec["category"], rec["mode"], rec["iteration"], rec["k"]) == (
        "q7", "coding", "dense_deferred", 2, 3)
    assert rec["tokens"] == gen.tokens and rec["matches_baseline"] is True
    assert rec["new_tokens"] == 16 and rec["decode_tokens"] == 16 - rec["first_emit"] == 15
    assert rec["drafted"] == sum(rec["drafted_per_round"]) and rec["accepted"] == sum(rec["accepted_per_round"])
    assert rec["rounds"] == len(rec["drafted_per_round"]) and rec["emitted"] == sum(st.emitted)
    assert rec["acceptance"] == pytest.approx(rec["accepted"] / rec["drafted"])
    assert rec["mean_emitted"] == pytest.approx(rec["emitted"] / rec["rounds"])
    assert rec["decode_tokens_per_s"] == pytest.approx(15 / rec["decode_s"])
    assert rec["verify_calls"] == rec["rounds"] and rec["append_calls"] <= 1  # deferred: no append but the last
    assert rec["stopped_by"] == "max_new_tokens" and set(rec["phase_s"]) >= {"draft_propose", "target_verify"}
    other = metrics.sample_record(Prompt("q7", "coding", "x"), "dense_deferred", gen, gen.tokens[:-1] + [0])
    assert other["matches_baseline"] is False and other["iteration"] == 0
    assert metrics.sample_record(Prompt("q7", "coding", "x"), "baseline", gen, None)["matches_baseline"] is None
    # ordinary rounds whose first proposal missed the known next token skip their verify: rounds = verifies + skips
    plain = speculative_generate(target, ModelDrafter(tiny_models[("f32", "qwen3", "independent")]), [3, 1, 4, 1, 5],
                                 k=3, max_new_tokens=16)
    rec = metrics.sample_record(Prompt("q7", "coding", "x"), "dense_ordinary", plain, None)
    assert rec["skipped"] == rec["rounds"] - rec["verify_calls"] > 0


def test_a_summary_pools_tokens_and_times_and_takes_the_median_ratio_per_prompt():
    """Constructed records, worked by hand; prompt b's baseline record predates ``decode_tokens`` and
    ``first_emit`` (its 21 new tokens count as 20 decode tokens)."""
    common = dict(ttft_s=0.1, tpot_s=0.1, e2e_tokens_per_s=1.0)
    records = [
        dict(mode="baseline", question_id="a", new_tokens=11, first_emit=1, decode_tokens=10, decode_s=2.0,
             decode_tokens_per_s=5.0, matches_baseline=True, **common),
        dict(mode="baseline", question_id="b", new_tokens=21, decode_s=2.0, decode_tokens_per_s=10.0,
             matches_baseline=True, **common),
        dict(mode="dense_deferred", question_id="a", new_tokens=11, first_emit=1, decode_tokens=10, decode_s=1.0,
             decode_tokens_per_s=10.0, drafted=8, accepted=6, emitted=10, rounds=4, matches_baseline=True,
             predicted_tokens_per_s=12.0, **common),
        dict(mode="dense_deferred", question_id="b", new_tokens=21, first_emit=1, decode_tokens=20, decode_s=2.5,
             decode_tokens_per_s=8.0, drafted=16, accepted=8, emitted=20, rounds=8, matches_baseline=False,
             **common),
    ]
    s = metrics.summarize(records)
    assert s["baseline"]["decode_tokens_per_s_pooled"] == pytest.approx(30 / 4.0)
    assert s["baseline"]["acceptance"] is None and s["baseline"]["mean_emitted"] is None
    d = s["dense_deferred"]
    assert d["samples"] == 2 and d["decode_tokens_per_s_pooled"] == pytest.approx(30 / 3.5)
    assert d["decode_tokens_per_s"] == pytest.approx(9.0)  # the median sample
    assert d["speedup_vs_baseline"] == pytest.approx((10 / 5 + 8 / 10) / 2)  # per prompt: 2.0 and 0.8
    assert d["speedup_vs_baseline_spread"]["min"] == pytest.approx(0.8)
    assert d["acceptance"] == pytest.approx(14 / 24) and d["mean_emitted"] == pytest.approx(30 / 12)
    assert d["matches_baseline"] == 1 and d["predicted_over_measured"] == pytest.approx(1.2)
    old = dict(records[1], first_emit=3)  # an old record that kept first_emit: 21 new tokens, 18 after the first 3
    assert metrics.summarize([old])["baseline"]["decode_tokens_per_s_pooled"] == pytest.approx(18 / 2.0)
    # two iterations: each sample is held against its own iteration's baseline, and TPOT is the median sample's
    twice = [dict(r, iteration=i, tpot_s=t, decode_tokens_per_s=r["decode_tokens_per_s"] * (1 + i))
             for i in (0, 1) for r, t in zip(records, (0.1, 0.2, 0.3, 0.7))]
    d2 = metrics.summarize(twice)["dense_deferred"]
    assert d2["speedup_vs_baseline"] == pytest.approx((2.0 + 0.8) / 2)  # the same per-prompt ratios in each iteration
    assert d2["tpot_s"] == pytest.approx(0.5) and metrics.summarize(twice)["baseline"]["tpot_s"] == pytest.approx(0.15)


def test_a_profiled_hybrid_charges_its_model_rounds_to_the_generation_s_clock(tiny_models):
    """The clock set on a hybrid drafter is the one its profiled model drafter charges (before, only the hybrid
    object held it, and the model's phases went to the clock it was built with)."""
    from thesis_studies.beyond.lookup import HybridDrafter

    model = tiny_models[("f32", "qwen3", "close")]
    target = ModelState(tiny_models[("f32", "qwen3", "target")])
    hybrid = HybridDrafter(ProfiledDrafter(model))
    hybrid.clock = clock = PhaseClock()
    ids = [4, 8, 15, 16, 4, 8, 15, 16, 23, 42]  # a repeat, so that some rounds are lookups
    gen = speculative_generate(target, hybrid, ids, k=3, max_new_tokens=24, clock=clock)
    assert hybrid.model_rounds > 0
    assert clock.calls["draft_prefill"] == 1 and clock.calls["draft_head"] >= hybrid.model_rounds
    assert gen.stats.phase_s["draft_head"] > 0


# --- run folders -------------------------------------------------------------------------------------------

def test_bad_parameters_fail_before_any_model_loads(pair_dir, tmp_path, monkeypatch, cache):
    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the checks")

    monkeypatch.setattr(loading, "load_pair", no_loading)
    cases = [
        (dict(k=0), "K must be"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(modes=("baseline", "warp_drive")), "Unknown mode"),
        (dict(categories="poetry"), "Unknown category"),
        (dict(per_category=0), "per category"),
        (dict(iterations=0), "iterations"),
        (dict(turns="last"), "turns"),
        (dict(modes=("baseline", "flash_deferred"), clusters=17, probes=18), "out of range"),
        (dict(profile=True, modes=("baseline", "hf_greedy")), "profiled run"),
        (dict(target="embedded:nope"), "Unknown model"),
        (dict(name="../x"), "plain folder name"),
    ]
    for kw, message in cases:
        with pytest.raises(ThesisLibError, match=message):
            protocol.run(_config(pair_dir, tmp_path / "runs", **kw), progress=False)
    assert not (tmp_path / "runs").exists()  # nothing was created either


def test_run_folder_is_never_overwritten_and_resumes_after_an_interruption(pair_dir, tmp_path, monkeypatch, cache):
    cfg = _config(pair_dir, tmp_path / "runs", name="r1")
    folder = cfg.path
    real_append = runs.Run.append
    calls = {"n": 0}

    def flaky_append(self, record):
        if calls["n"] == 4:
            raise KeyboardInterrupt  # the user stops the run after four samples
        calls["n"] += 1
        real_append(self, record)

    monkeypatch.setattr(runs.Run, "append", flaky_append)
    with pytest.raises(KeyboardInterrupt):
        protocol.run(cfg, progress=False)
    monkeypatch.setattr(runs.Run, "append", real_append)
    lines = (folder / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 4 and not (folder / "summary.json").exists()
    with open(folder / "samples.jsonl", "a") as f:
        f.write('{"iteration": 0, "question_id": "torn')  # a write cut short by the interruption

    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ConfigError, match="exists"):
        protocol.run(cfg, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == before  # refused, nothing touched
    with pytest.raises(ConfigError, match="differs in k"):
        protocol.run(_config(pair_dir, tmp_path / "runs", name="r1", k=2), resume=True, progress=False)

    run = protocol.run(cfg, resume=True, progress=False)
    new_lines = (folder / "samples.jsonl").read_text().splitlines()
    assert new_lines[:4] == lines  # the finished samples are kept byte for byte
    assert len(new_lines) == 3 * 3  # 3 prompts x 3 modes, each once; the torn line is gone
    keys = [metrics.sample_key(json.loads(line)) for line in new_lines]
    assert len(set(keys)) == len(keys)
    assert all(r["matches_baseline"] for r in run.samples)
    assert run.summary["baseline"]["samples"] == 3
    env = json.loads((folder / "environment.json").read_text())
    assert len(env["resumed"]) == 1 and env["models"]["target"]["spec"] == cfg.target

    # an uninterrupted run of the same configuration produces the same tokens
    fresh = protocol.run(_config(pair_dir, tmp_path / "runs", name="r2"), progress=False)
    repro = diagnostics.reproducibility(run, fresh)
    assert (repro["Identical tokens"] == repro["Samples"]).all()
    assert (repro["Identical acceptance"] == repro["Samples"]).all()

    # replace moves the old folder aside instead of deleting it
    protocol.run(cfg, replace=True, progress=False)
    aside = folder.with_name("r1.old-1")
    assert (aside / "samples.jsonl").read_text().splitlines() == new_lines
    assert len((folder / "samples.jsonl").read_text().splitlines()) == 9


def test_a_second_writer_of_a_run_folder_is_refused_while_the_first_lives(pair_dir, tmp_path, cache):
    """Another process writes the folder (it holds the folder's writer lock, as a running bench does): a resumed
    run is refused at once, naming it, and touches nothing; once that process is killed (SIGKILL), the resume
    completes with every sample once."""
    import os
    import signal
    import subprocess
    import sys

    cfg = _config(pair_dir, tmp_path / "runs", name="busy")
    protocol.run(cfg, progress=False)
    before = (cfg.path / "samples.jsonl").read_text()
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom thesis_lib.bench import runs\n"
                               f"with runs.one_writer({str(cfg.path)!r}):\n    print('writing', flush=True)\n"
                               "    time.sleep(60)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "writing"
        with pytest.raises(ConfigError, match=f"run folder busy: process {holder.pid} on .* holds it"):
            protocol.run(cfg, resume=True, progress=False)
        assert (cfg.path / "samples.jsonl").read_text() == before
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    (cfg.path / "summary.json").unlink()
    run = protocol.run(cfg, resume=True, progress=False)
    assert (cfg.path / "samples.jsonl").read_text() == before and len(run.samples) == 9


def test_iterations_multiply_the_measured_set_and_modes_alternate(pair_dir, tmp_path, cache):
    run = protocol.run(_config(pair_dir, tmp_path / "runs", iterations=2, prompts=2), progress=False)
    assert len(run.samples) == 2 * 2 * 3
    assert sorted({r["iteration"] for r in run.samples}) == [0, 1]
    # the order in which the modes ran alternates from sample to sample (records are kept in mode order)
    orders = [[r["run_order"] for r in run.samples[i:i + 3]] for i in range(0, 12, 3)]
    assert orders == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    assert run.summary["dense_deferred"]["samples"] == 4


def test_warm_ups_stop_at_warmup_tokens_and_measured_generations_do_not(pair_dir, tmp_path, cache, monkeypatch):
    from thesis_lib.bench.runner import Runner

    lengths = []
    real = Runner.run

    def spy(self, mode, ids):
        gen = real(self, mode, ids)
        lengths.append((self.max_new_tokens, len(gen.tokens)))
        return gen

    monkeypatch.setattr(Runner, "run", spy)
    run = protocol.run(_config(pair_dir, tmp_path / "runs", prompts=2, warmup=1, warmup_tokens=3), progress=False)
    n_modes = len(run.config["modes"])
    warm, measured = lengths[:n_modes], lengths[n_modes:]
    assert all(limit == 3 and got <= 3 for limit, got in warm)
    assert measured and all(limit == run.config["max_new_tokens"] > 3 for limit, _ in measured)
    assert any(got > 3 for _, got in measured)
    with pytest.raises(ConfigError, match="warmup_tokens"):
        protocol.run(_config(pair_dir, tmp_path / "bad", warmup_tokens=0), progress=False)


# --- tables ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def thesis_run(pair_dir, tmp_path_factory):
    import os

    root = tmp_path_factory.mktemp("thesis_run")
    old = os.environ.get("THESIS_LIB_CACHE")
    os.environ["THESIS_LIB_CACHE"] = str(root / "cache")
    try:
        cfg = _config(pair_dir, root / "runs", name="thesis", modes=modes.THESIS_MODES, costs=True, **FLASH)
        run = protocol.run(cfg, progress=False)
        target, draft = pair_dir
        prof_cfg = protocol.BenchConfig.profiled(name="prof", out=str(root / "runs"), target=target, draft=draft,
                                                 k=3, max_new_tokens=12, prompts=3, costs=False, **FLASH)
        assert prof_cfg.modes == ("baseline", "dense_ordinary", "shared_ordinary", "flash_ordinary")
        prof = protocol.run(prof_cfg, progress=False)
    finally:
        if old is None:
            os.environ.pop("THESIS_LIB_CACHE")
        else:
            os.environ["THESIS_LIB_CACHE"] = old
    return run, prof


def test_every_mode_is_lossless_in_the_protocol(thesis_run):
    run, prof = thesis_run
    assert run.environment["flashhead"]["path"] == "eager" and run.environment["flashhead"]["n_probes"] == 3
    for r in run.samples + prof.samples:
        assert r["matches_baseline"], (r["mode"], r["question_id"])


def test_tables_have_the_thesis_layout_and_recompute_from_the_samples(thesis_run):
    run, _ = thesis_run
    t45 = tables.table_4_5(run)
    assert list(t45.columns) == THESIS_4_5
    assert list(t45["Mode"]) == ["Baseline", "Dense draft", "FlashHead draft"]
    base = run.of("baseline")
    tokens = sum(r["new_tokens"] - 1 for r in base)
    assert t45.loc[0, "Decode Tok/s"] == pytest.approx(tokens / sum(r["decode_s"] for r in base))
    dense = run.of("dense_ordinary")
    assert t45.loc[1, "Draft propose (ms)"] == pytest.approx(1000 * sum(r["phase_s"]["draft_propose"] for r in dense))
    assert t45.loc[1, "Acceptance"] == pytest.approx(sum(r["accepted"] for r in dense) / sum(r["drafted"] for r in dense))
    t46 = tables.table_4_6(run)
    assert list(t46.columns) == SPEEDUPS + ["95 % low", "95 % high"]  # the thesis' columns, then the interval's
    assert ((t46["95 % low"] <= t46.Speedup) & (t46.Speedup <= t46["95 % high"])).all()
    assert t46.loc[2, "Speedup"] == pytest.approx(t45.loc[2, "Decode Tok/s"] / t45.loc[1, "Decode Tok/s"])

    t49 = tables.table_4_9(run)
    assert list(t49.columns) == THESIS_4_9 and list(t49["Samples"]) == [3, 3, 3]
    assert t49.loc[0, "Base append calls"] == tokens and t49.loc[0, "Base verify calls"] == 0
    assert t49.loc[1, "Base append calls"] <= 3  # deferred: at most one tail append per sample
    t410 = tables.table_4_10(run)
    assert t410.loc[1, "Speedup"] == pytest.approx(t49.loc[2, "Decode Tok/s"] / t49.loc[0, "Decode Tok/s"])
    t411 = tables.table_4_11(run)
    assert list(t411.columns) == THESIS_4_11 + ["Draft path share 95 % low", "Draft path share 95 % high"]
    for (_, row), mode in zip(t411.iterrows(), ("dense_deferred", "flash_deferred")):
        rs = run.of(mode)  # recomputed from the samples: proposal time over decode-phase tokens and time
        propose = sum(r["phase_s"]["draft_propose"] for r in rs)
        tokens = sum(r["new_tokens"] - r["first_emit"] for r in rs)
        assert row["Draft ms/decode tok"] == pytest.approx(1000 * propose / tokens)
        assert row["Draft path share"] == pytest.approx(propose / sum(r["decode_s"] for r in rs))

    peers = diagnostics.peers_table(run)
    assert list(peers["Identical to baseline"]) == [3, 3, 3, 3]
    pipe = diagnostics.pipelined_table(run)
    assert len(pipe) == 2 and (pipe["A Tok/s"] > 0).all()
    ratios = diagnostics.ratio_table(run)
    assert ratios.loc[ratios["Mode"] == "Baseline", "Median ratio vs baseline"].item() == 1.0
    hist = diagnostics.accepted_lengths(run)
    assert list(hist.columns) == ["Mode"] + [f"accepted {i}" for i in range(4)]
    ver = diagnostics.verification_table(run)
    assert (ver["Zero-accept rounds"] + ver["Full-accept rounds"] <= ver["Rounds"]).all()
    with pytest.raises(ConfigError, match="not a profiled run"):
        tables.table_4_7(run)
    assert "4.7" not in tables.available(run) and "4.5" in tables.available(run)


def test_profile_tables(thesis_run):
    _, prof = thesis_run
    t47 = tables.table_4_7(prof)
    c = "Draft propose share"  # the interval's columns are the draft share's (the caption says so)
    assert list(t47.columns) == THESIS_4_7 + ["95 % low", "95 % high"]
    assert ((t47["95 % low"] <= t47[c]) & (t47[c] <= t47["95 % high"])).all()  # inside its interval
    edges = tables.phase_shares(prof, ["flash_ordinary"])["FlashHead draft"]
    ends = {"draft_propose": edges["draft_propose"], "target_verify": edges["draft_propose"] + edges["target_verify"]}
    ends["finalize_align"] = ends["target_verify"] + edges["finalize_align"]
    for ph, end in ends.items():  # Figure 4.2's error bars: where each part ends, cumulative
        assert edges["edges"][ph][0] <= end <= edges["edges"][ph][1]
    assert list(t47["Mode"]) == ["Dense draft", "Dense shared", "FlashHead draft"]
    shares = t47[["Draft propose share", "Base verify share", "Finalize share"]]
    assert ((shares > 0) & (shares < 1)).all().all() and (shares.sum(axis=1) <= 1.0 + 1e-9).all()
    # dense and dense-shared share body and head: same tokens, same acceptance
    assert t47.loc[0, "Acceptance"] == t47.loc[1, "Acceptance"]
    split = tables.draft_split(prof, "flash_ordinary")
    assert split["head_only_ceiling"] > 1 and 0 < split["head_share_of_propose"] < 1
    assert split["target_forward_ms"] > 0
    t48 = tables.table_4_8(prof)
    assert list(t48.columns) == ["Diagnosis", "Evidence"] and len(t48) == 4
    assert f"{100 * split['outside_propose_share']:.1f}%" in t48.loc[0, "Evidence"]
    split_table = tables.draft_split_table(prof)
    assert split_table.loc[2, "Head-only ceiling"] == pytest.approx(split["head_only_ceiling"])
    assert set(tables.available(prof)) >= {"4.7", "4.8", "draft-split", "verification", "accepted"}
    assert "4.5" not in tables.available(prof)  # profiled speeds are not headline numbers


def test_table_cli(thesis_run, capsys):
    run, _ = thesis_run
    assert cli.main(["table", str(run.path), "--table", "4.9,4.10", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| Mode | Samples | Decode Tok/s |" in out and "Base only vs. dense deferred" in out
    assert cli.main(["table", str(run.path), "--table", "4.12"]) == 2
    assert "Unknown table" in capsys.readouterr().err
    assert cli.main(["table", str(run.path), "--table", "4.7"]) == 2
    assert "not a profiled run" in capsys.readouterr().err


def test_bench_cli_help_and_fail_fast(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = capsys.readouterr().out
    for opt in ("--modes", "--k", "--max-new-tokens", "--prompt-file", "--categories", "--per-category", "--turns",
                "--warmup", "--iterations", "--seed", "--out", "--name", "--resume", "--replace", "--probes",
                "--device", "--draft-device", "--dtype"):
        assert opt in text, opt
    (tmp_path / "taken").mkdir()
    for argv, message in ((["bench", "--k", "0"], "K must be"), (["bench", "--modes", "baseline,warp"], "Unknown mode"),
                          (["bench", "--categories", "poetry"], "Unknown category"),
                          (["bench", "--out", str(tmp_path), "--name", "taken"], "exists"),
                          (["profile", "--probes", "0"], "probes must be")):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


# --- beyond the thesis (issue 6) -----------------------------------------------------------------------------

BEYOND_MODES = ("baseline", "flash_deferred", "adaflash_deferred", "freq_deferred", "hybrid_deferred",
                "ngram_deferred", "flash_deferred_hk", "flash_deferred_ck", "dense_ordinary_ck",
                "flash_deferred_sk", "hybrid_deferred_sk", "dense_ordinary_sk", "sample_dense", "sample_flash")


def test_beyond_modes_run_through_the_protocol(pair_dir, tmp_path, cache):
    cfg = _config(pair_dir, tmp_path / "runs", name="beyond", modes=BEYOND_MODES, adaptive_margin=0.05,
                  freq_calibration=1, freq_tokens_generated=6, freq_tokens=40, k_max=6, stop_below=0.5, **FLASH)
    run = protocol.run(cfg, progress=False)
    by = {m: [r for r in run.samples if r["mode"] == m] for m in BEYOND_MODES + ("sample_baseline",)}
    assert all(len(rs) == 3 for rs in by.values())  # sample_baseline joins because sampling modes need it
    for m in BEYOND_MODES:
        for r in by[m]:
            if m.startswith("sample_"):
                assert r["matches_baseline"] is None  # random text is not compared with greedy output
            else:
                assert r["matches_baseline"], (m, r["question_id"])
    assert all(1 <= r["mean_probes"] <= 3 for r in by["adaflash_deferred"])
    assert all(r["lookup_rounds"] + r["model_rounds"] == r["rounds"] for r in by["hybrid_deferred"])
    assert all(r["lookup_tried"] == r["rounds"] for r in by["ngram_deferred"])
    assert any(len(set(r["drafted_per_round"])) > 1 for r in by["flash_deferred_hk"])
    for m in ("flash_deferred_sk", "hybrid_deferred_sk", "dense_ordinary_sk"):  # K is only a cap: k_max = 6
        assert all(max(r["drafted_per_round"]) <= 6 for r in by[m]), m
        assert sum(r["stopped_early"] for r in by[m]) > 0, m  # some blocks ended at an unsure token
    assert any(len(set(r["drafted_per_round"])) > 1 for r in by["flash_deferred_sk"])
    env = run.environment
    assert {str(n) for n in env["k_costs"]["verify_s"]} == {str(n) for n in range(1, 8)}  # 1 .. k_max + 1 tokens
    assert env["beyond"]["freq"]["tokens"] == 40 and env["beyond"]["adaflash"]["margin"] == 0.05
    assert run.summary["sample_dense"]["matches_baseline"] is None
    # sampling ratios are taken against target-only sampling, on the same prompt
    base = {r["question_id"]: r for r in by["sample_baseline"]}
    ratios = sorted(r["decode_tokens_per_s"] / base[r["question_id"]]["decode_tokens_per_s"] for r in by["sample_flash"])
    assert run.summary["sample_flash"]["speedup_vs_baseline"] == pytest.approx(ratios[1])
    # a seeded run is reproducible: the same sampled tokens again
    again = protocol.run(_config(pair_dir, tmp_path / "runs", name="again", modes=("baseline", "sample_flash"),
                                 **FLASH), progress=False)
    assert [r["tokens"] for r in again.samples if r["mode"] == "sample_flash"] == [r["tokens"] for r in by["sample_flash"]]


def test_beyond_parameters_fail_before_any_model_loads(pair_dir, tmp_path, monkeypatch, cache):
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("weights loaded"))
    bad = [dict(modes=("baseline", "adaflash_deferred")),  # no margin
           dict(modes=("baseline", "adaflash_deferred"), adaptive_margin=-1.0),
           dict(modes=("baseline", "freq_deferred"), freq_tokens=0),
           dict(modes=("baseline", "flash_deferred_ck"), k_max=2),  # k_max < K
           dict(modes=("baseline", "sample_dense"), temperature=0.0),
           dict(modes=("baseline", "sample_dense"), top_p=1.5),
           dict(modes=("baseline", "flash_deferred_sk")),  # no stop_below
           dict(modes=("baseline", "flash_deferred_sk"), stop_below=1.0),
           dict(modes=("baseline", "ngram_deferred_sk"), stop_below=0.5),  # a lookup has no confidence: no such mode
           dict(modes=("baseline", "ngram_ordinary"))]  # the drafts beyond the thesis run deferred only
    for kw in bad:
        with pytest.raises(ConfigError):
            protocol.run(_config(pair_dir, tmp_path / "runs", **{**FLASH, **kw}), progress=False)
    assert not (tmp_path / "runs").exists()


def test_mode_variants_run_at_their_own_k_and_probes_beside_one_baseline(pair_dir, tmp_path, cache):
    """A K sweep and a probe grid as one run: each variant decodes as a run at its setting would (the same tokens
    and rounds as a plain run at that K and probe count), lossless, against the one baseline; a view of the run
    reads as that plain run; the shared head's probe count is the configured one afterwards."""
    grid = ("baseline", "dense_deferred@k1", "flash_deferred@k2p1", "flash_deferred@k5", "flash_deferred@p17")
    run = protocol.run(_config(pair_dir, tmp_path / "runs", name="grid", modes=grid, **FLASH), progress=False)
    plain = {(2, 1): protocol.run(_config(pair_dir, tmp_path / "runs", name="k2p1", modes=("baseline", "flash_deferred"),
                                          **{**FLASH, "k": 2, "probes": 1}), progress=False),
             (5, 3): protocol.run(_config(pair_dir, tmp_path / "runs", name="k5", modes=("baseline", "flash_deferred"),
                                          k=5, **FLASH), progress=False)}
    assert run.environment["flashhead"]["n_probes"] == 3  # restored after every variant
    for m, k in (("dense_deferred@k1", 1), ("flash_deferred@k2p1", 2), ("flash_deferred@k5", 5), ("flash_deferred@p17", 3)):
        rs = run.of(m)
        assert len(rs) == 3 and all(r["matches_baseline"] and r["k"] == k for r in rs), m
        assert all(max(r["drafted_per_round"]) <= k for r in rs) and any(max(r["drafted_per_round"]) == k for r in rs), m
    assert [r.get("probes") for r in run.of("flash_deferred@k2p1")] == [1, 1, 1]
    # all 17 probes: the FlashHead draft is the dense draft (same tokens drafted, same rounds)
    assert [r["accepted_per_round"] for r in run.of("flash_deferred@p17")] == [
        r["accepted_per_round"] for r in protocol.run(_config(pair_dir, tmp_path / "runs", name="dense3",
                                                              modes=("baseline", "dense_deferred")), progress=False).of("dense_deferred")]
    for (k, n), ref in plain.items():
        name = "flash_deferred@k2p1" if n == 1 else "flash_deferred@k5"
        view = run.view({"baseline": "baseline", "flash_deferred": name}, k=k, probes=n if n == 1 else None)
        assert view.config["k"] == k and sorted(view.modes()) == ["baseline", "flash_deferred"]
        assert view.environment["flashhead"]["n_probes"] == n
        assert view.summary["flash_deferred"] == run.summary[name]
        for a, b in zip(view.of("flash_deferred"), ref.of("flash_deferred")):
            assert (a["tokens"], a["accepted_per_round"], a["drafted_per_round"]) == (
                b["tokens"], b["accepted_per_round"], b["drafted_per_round"])
    # the speedup of a variant is taken against the one baseline of its run, prompt by prompt
    base = {r["question_id"]: r["decode_tokens_per_s"] for r in run.of("baseline")}
    ratios = sorted(r["decode_tokens_per_s"] / base[r["question_id"]] for r in run.of("flash_deferred@k5"))
    assert run.summary["flash_deferred@k5"]["speedup_vs_baseline"] == pytest.approx(ratios[1])


def test_bad_mode_variants_fail_before_any_model_loads(pair_dir, tmp_path, monkeypatch, cache):
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("weights loaded"))
    bad = {"flash_deferred@k0": "K must be", "flash_deferred@": "Malformed", "flash_deferred@q3": "Malformed",
           "flash_deferred@p3k2": "Malformed", "dense_deferred@p4": "probe count", "flash_deferred_hk@k3": "fixed K",
           "sample_flash@k2": "fixed K", "baseline@k2": "fixed K", "warp@k2": "fixed K",
           "flash_deferred@p18": "out of range"}
    for mode, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            protocol.run(_config(pair_dir, tmp_path / "runs", modes=("baseline", mode), **FLASH), progress=False)
    assert not (tmp_path / "runs").exists()
    assert modes.variant("flash_deferred", 6, 148) == "flash_deferred@k6p148" and modes.variant("dense_deferred") == "dense_deferred"
    hybrid = modes.parse("hybrid_deferred@k2p5")
    assert (hybrid.name, hybrid.base, hybrid.draft, hybrid.schedule, hybrid.k, hybrid.probes) == (
        "hybrid_deferred@k2p5", "hybrid_deferred", "hybrid", "deferred", 2, 5) and modes.parse("flash_deferred@k2").flash
    tree = modes.parse("flash_tree@n12")
    assert (tree.draft, tree.schedule, tree.k, tree.width, tree.nodes, tree.shaped) == ("flash", "tree", None, None, 12, True)
    sampled = modes.parse("sample_flash")
    assert (sampled.draft, sampled.schedule, sampled.sampled, sampled.speculative, sampled.flash, sampled.baseline) == (
        "sample", "flash", True, False, True, "sample_baseline")
    assert modes.parse("dense_deferred").baseline == "baseline" and not modes.parse("dense_deferred").flash
    assert modes.parse(hybrid) is hybrid and str(hybrid) == "hybrid_deferred@k2p5"


def test_cheap_checks_come_before_any_model_file_with_an_empty_model_cache(tmp_path, monkeypatch):
    """With the embedded default pair and an empty model cache: an existing run folder and a probe count out of
    range are reported at once, and the cache stays empty (nothing assembled, converted or downloaded)."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    monkeypatch.setenv("THESIS_LIB_CACHE", str(cache))
    runs = tmp_path / "runs"
    (runs / "taken").mkdir(parents=True)
    with pytest.raises(ConfigError, match="exists"):
        protocol.run(protocol.BenchConfig(name="taken", out=str(runs)), progress=False)
    with pytest.raises(ConfigError, match="out of range"):
        protocol.run(protocol.BenchConfig(name="new", out=str(runs), modes=("baseline", "flash_deferred"),
                                          probes=10_000), progress=False)
    assert cli.main(["bench", "--name", "taken", "--out", str(runs)]) == 2
    assert list(cache.rglob("*")) == [] and sorted(p.name for p in runs.iterdir()) == ["taken"]


def test_accepted_lengths_are_sized_by_the_longest_block(tmp_path):
    """Blocks past K (confidence stop, adaptive K) keep all their rounds; fixed-K modes keep their full rounds."""
    run = runs.Run(tmp_path, {"k": 4, "name": "t"}, {}, samples=[
        {"mode": "flash_deferred", "question_id": "q", "drafted_per_round": [4, 4, 2], "accepted_per_round": [4, 0, 2]},
        {"mode": "flash_deferred_sk", "question_id": "q", "drafted_per_round": [2, 9, 6], "accepted_per_round": [1, 3, 6]},
    ])
    t = diagnostics.accepted_lengths(run).set_index("Mode")
    assert list(t.columns) == [f"accepted {i}" for i in range(10)]
    assert t.loc["FlashHead deferred"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert t.loc["flash_deferred_sk"].tolist() == [0, 1, 0, 1, 0, 0, 1, 0, 0, 0]


def test_committed_run_folders_still_load_and_keep_their_names():
    """Run folders written before parameters left the library (``outliers``, ``split_threads``) load at the value
    every run had; the default book's folders, written since, read back as written (so they keep the names their
    parameters hash to: a parameter added since is absent from them and reads back at its default, outside their
    identity); and a value the library can no longer run is refused."""
    import glob
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    configs = sorted(glob.glob(str(root / "data/reference/book-cpu-embedded/*/config.json"))
                     + glob.glob(str(root / "data/reference/runs/*/config.json")))
    docs = [json.loads(Path(path).read_text()) for path in configs]
    assert sum("outliers" in doc for doc in docs) >= 3  # the committed runs written before both left
    assert sum("outliers" not in doc for doc in docs) >= 5  # the default book's, written after
    for doc in docs:
        if "outliers" not in doc:  # written after both left: it reads back as written
            cfg = protocol.BenchConfig.from_dict(doc)
            added = {k: v for k, v in cfg.to_dict().items() if k not in doc}
            assert {k: v for k, v in cfg.to_dict().items() if k in doc} == doc
            assert set(added) <= set(protocol.LATER_FIELDS) and all(
                v == getattr(protocol.BenchConfig(), k) for k, v in added.items())
            assert not set(added) & set(cfg.identity())
            continue
        assert doc["outliers"] == 0.0 and doc.get("split_threads", False) is False
        cfg = protocol.BenchConfig.from_dict(doc)
        assert {k: v for k, v in cfg.to_dict().items() if k in doc} == {
            k: v for k, v in doc.items() if k not in ("outliers", "split_threads")}
    with pytest.raises(ConfigError, match="outliers has left the library"):
        protocol.BenchConfig.from_dict({**docs[0], "outliers": 0.005})


def test_the_draft_s_default_precision_names_a_run_as_before():
    """DRAFT_DTYPE auto and an absent draft precision are one configuration: the same name-giving identity as a
    run written before the field existed; a named draft precision is part of it."""
    auto, absent = protocol.BenchConfig(draft_dtype="auto"), protocol.BenchConfig()
    assert auto.identity() == absent.identity() and "draft_dtype" not in auto.identity()
    assert protocol.BenchConfig(draft_dtype="same").identity()["draft_dtype"] == "same"


def test_the_core_lists_the_thesis_modes_and_the_studies_declare_theirs(monkeypatch):
    """The core's mode list is the thesis' (target-only, three drafts in three schedules) and transformers' peers;
    the studies' modes (more drafts, block-length policies, sampling, trees) exist only as the studies declare
    them, with the same grammar."""
    from thesis_lib import extensions

    assert len(modes.CORE_MODES) <= 15 and "flash_deferred" in modes.CORE_MODES and "shared_pipelined" in modes.CORE_MODES
    studies = set(modes.all_modes()) - set(modes.CORE_MODES)
    assert {"flash_tree", "sample_flash", "flash_deferred_ck", "hybrid_deferred_sk", "ngram_deferred"} <= studies
    assert modes.parse("flash_deferred_ck").policy == "cost" and modes.parse("freq_deferred").flash
    monkeypatch.setattr(extensions, "MODES", [])  # no study declares anything
    assert modes.all_modes() == modes.CORE_MODES
    for name in ("flash_tree", "sample_flash", "flash_deferred_ck"):
        with pytest.raises(ConfigError, match="Unknown mode"):
            modes.parse_all([name])
        with pytest.raises(ConfigError, match="Unknown mode"):
            modes.parse(name)
    with pytest.raises(ConfigError, match="tree modes"):
        modes.parse("flash_deferred@w2")
