"""Where a decode step's time goes (``bench.stepprofile``): the parts' clock, the operation count, the byte floors
and the whole profile on the tiny int8-dynamic pair."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from thesis_studies.precision import stepprofile as sp
from thesis_lib.decoding.state import ModelState
from thesis_lib.models.loading import LoadedModel

from conftest import int8_pair
from thesis_studies.precision import verdicts as precision_verdicts


def test_the_operation_count_counts_dispatched_aten_operations():
    x = torch.ones(4)
    assert sp.count_ops(lambda: x + 1) == 1
    assert sp.count_ops(lambda: (x * 2).sum()) == 2
    assert sp.count_ops(lambda: None) == 0


def test_a_step_s_parts_hold_each_module_once_and_add_up_to_its_body(monkeypatch):
    """A hooked step of the tiny int8 target on a fake clock that moves only when a module runs: a tick for each
    decoder linear layer, norm, attention module, activation, the final norm, the rotary table and the embedding,
    100 for each decoder layer around them, 1,000 for the head. Each part holds its modules' ticks once (an
    attention module its own tick, its linear layers theirs), ``other`` the layers' 100s that no part holds, the
    parts add up to the body exactly, and the head is timed apart; no hook is left on any module after."""
    target, _, _ = int8_pair()
    now = [0]
    monkeypatch.setattr(sp, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def costs(ticks):
        def work(*_):
            now[0] += ticks
        return work

    probe = sp.PartClock(target)
    timed = [m for m in target.modules() if m._forward_hooks]
    probe.remove()
    state = ModelState(target)
    case = sp.StepCase(state, list(range(5, 15)), 2)
    # registered before the step's own hooks, so each module's work runs inside its timed interval
    work = [m.register_forward_hook(costs(1)) for m in timed]
    work += [layer.register_forward_hook(costs(100)) for layer in target.get_decoder().layers]
    work.append(state.head.register_forward_hook(costs(1000)))
    case.once(hooked=True)
    for h in work:
        h.remove()
    layers = target.config.num_hidden_layers
    got = {part: times[0] for part, times in case.times.items()}
    assert got == {"attn_linear": 4 * layers, "mlp_linear": 3 * layers, "linear": 7 * layers, "attention": layers,
                   "norms": 2 * layers + 1, "activation": layers, "rotary_table": 1, "embedding": 1,
                   "other": 100 * layers, "body": 111 * layers + 3, "head": 1000}
    parts = ("linear", "attention", "norms", "activation", "rotary_table", "embedding", "other")
    assert sum(got[p] for p in parts) == got["body"]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in target.modules())


def test_the_floors_follow_the_bytes_each_part_reads():
    """At 1 GB/s a part's floor in seconds is its gigabytes: the linear floor does not grow with the block, the
    KV cache's does with the context, FlashHead reads fewer bytes than the dense head for one position, and its
    bytes count once per position scored."""
    target, draft, flash = int8_pair()
    dense = ModelState(draft).head
    one = sp.floors(draft, dense, 1, 100, 1.0)
    five = sp.floors(draft, dense, 5, 100, 1.0)
    longer = sp.floors(draft, dense, 1, 1000, 1.0)
    assert one["linear"] == five["linear"] > 0 and one["linear"] == pytest.approx(one["attn_linear"] + one["mlp_linear"])
    assert longer["attention"] > one["attention"] > 0
    cfg = draft.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert one["attention"] == pytest.approx(cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 101 * 4
                                             / 1e9)
    f1, f5 = sp.floors(draft, flash, 1, 100, 1.0), sp.floors(draft, flash, 5, 100, 1.0)
    assert f1["head"] < one["head"] and f5["head"] == pytest.approx(5 * f1["head"])


def test_the_whole_profile_on_the_tiny_pair(tok):
    """Every step profiled, hooked and bare, with its parts, floors and operations; the loop's overhead measured
    beside its one-token step; the printout has a row per step."""
    target, draft, flash = int8_pair()
    pair = [LoadedModel(spec=f"tiny:{n}", model=m, tokenizer=tok, path=None, device="cpu", dtype="int8-dynamic")
            for n, m in (("target", target), ("draft", draft))]
    doc = sp.run(*pair, flash, list(range(5, 25)), blocks=(1, 3), reps=3, new_tokens=4, progress=False,
                 compare=("fused", "compact"))
    plain = ["draft, dense head", "draft, FlashHead", "target, block of 1", "target, block of 3"]
    assert list(doc["steps"]) == plain + [f"{n}, fused off" for n in plain] + [f"{n}, compact off" for n in plain]
    for name in plain:  # the fused operations dispatch fewer aten operations, the compact step fewer still
        steps = doc["steps"]
        assert steps[name]["aten_ops"] < steps[f"{name}, compact off"]["aten_ops"] < steps[f"{name}, fused off"]["aten_ops"]
        assert len(steps[name]["bare_ms"]) == 3
    with pytest.raises(ValueError, match="cannot compare"):
        sp.run(*pair, flash, list(range(5, 25)), blocks=(1,), reps=3, compare=("bogus",), progress=False)
    for name, step in doc["steps"].items():
        assert set(sp.PARTS) <= set(step["ms"]) and step["ms"]["bare_body"] > 0 and step["aten_ops"] > 0, name
        assert step["floor_ms"]["linear"] > 0 and step["context"] == 20 - step["n"]
    assert doc["steps"]["target, block of 3"]["aten_ops"] > doc["steps"]["target, block of 1"]["aten_ops"]
    assert doc["loop"]["tpot_ms"] > 0 and doc["loop"]["step_ms"] > 0 and doc["loop"]["new_tokens"] == 4
    printed = sp.text(doc)
    assert all(name in printed for name in doc["steps"]) and "target-only loop" in printed


def _doc(draft_parts: dict, one_parts: dict, five_parts: dict) -> dict:
    def step(parts, bare, ops, n):
        ms = {p: parts.get(p, 0.0) for p in sp.PARTS}
        ms.update(body=sum(v for k, v in parts.items() if k != "head"), bare_body=bare - parts["head"],
                  bare_head=parts["head"])
        return {"n": n, "ms": ms, "aten_ops": ops, "floor_ms": {"linear": 5.0, "attention": 0.1, "head": 1.0}}
    steps = {"draft, dense head": step(draft_parts, 30.0, 1000, 1), "draft, FlashHead": step(draft_parts, 20.0, 1000, 1),
             "target, block of 1": step(one_parts, 80.0, 2000, 1), "target, block of 5": step(five_parts, 120.0, 2400, 5)}
    return {"steps": steps, "loop": {"beyond_share": 0.05}, "stream_gbps": 40.0}


def test_the_appendix_reads_the_profile_as_constructed():
    """On a constructed profile: the draft's step over the target's, its linear layers over their floor, what is
    neither weights nor head (its share of the body, per operation), a block of five over one step and the shares
    of its growth; no document: nan and a table saying none is named."""
    from thesis_studies.precision import floor

    draft = {"linear": 10.0, "attention": 3.0, "norms": 1.0, "activation": 0.5, "other": 0.5, "head": 2.0}
    one = {"linear": 50.0, "attention": 6.0, "norms": 2.0, "other": 2.0, "head": 10.0}
    five = {"linear": 66.0, "attention": 14.0, "norms": 2.0, "other": 2.0, "head": 26.0}
    g = floor.step_glued(_doc(draft, one, five))
    assert g["sp_ratio"] == pytest.approx(20 / 80) and g["sp_linear_over_floor"] == pytest.approx(2.0)
    assert g["sp_overhead_ms"] == pytest.approx(5.0) and g["sp_overhead_share"] == pytest.approx(5 / 15)
    assert g["sp_us_per_op"] == pytest.approx(5.0) and g["sp_block5"] == pytest.approx(1.5)
    assert (g["sp_growth_linear"], g["sp_growth_attention"], g["sp_growth_head"]) == pytest.approx((0.4, 0.2, 0.4))
    assert g["sp_other_label"] == "no other draft" and g["sp_other_ratio"] != g["sp_other_ratio"]
    doc = _doc(draft, one, five)
    doc["steps"]["draft (int8-dynamic), FlashHead"] = dict(doc["steps"]["draft, FlashHead"],
                                                           ms=dict(doc["steps"]["draft, FlashHead"]["ms"], bare_body=26.0))
    other = floor.step_glued(doc)
    assert other["sp_other_label"] == "int8-dynamic" and other["sp_other_ratio"] == pytest.approx(28 / 80)
    assert other["sp_other_said"] == "the same draft with int8-dynamic weights took 28.0 ms, 0.35 of a target step"
    assert other["sp_ratio"] == g["sp_ratio"]
    rows = floor.step_rows(_doc(draft, one, five))
    assert list(rows["step"]) == ["draft, dense head", "draft, FlashHead", "target, block of 1", "target, block of 5"]
    assert list(rows["ms"]) == [30.0, 20.0, 80.0, 120.0] and rows["linear floor"].iloc[0] == 5.0
    empty = floor.step_glued(None)
    assert all(v != v for k, v in empty.items() if not isinstance(v, str)) and set(empty) == set(g)
    assert list(floor.step_rows(None).columns) == ["step profile"]


def test_the_loop_s_overhead_reads_both_ways():

    assert precision_verdicts.loop_beyond(-0.01).startswith("spends nothing measurable") and "-1.0%" in precision_verdicts.loop_beyond(-0.01)
    assert precision_verdicts.loop_beyond(-0.06).startswith("spends nothing measurable")  # faster than its step: noise
    assert precision_verdicts.loop_beyond(0.3) == "spends 30% of each token's time beyond its one-token step and head"
    assert precision_verdicts.loop_beyond(float("nan")) == "was not timed"


def test_the_fused_comparison_reads_each_step_against_its_twin():
    from thesis_studies.precision import floor

    steps = {"a": {"bare_ms": [10.0, 11.0, 9.0]}, "a, fused off": {"bare_ms": [12.0, 13.2, 10.8]},
             "b": {"bare_ms": [10.0, 14.0, 6.0]}, "b, fused off": {"bare_ms": [12.0, 8.0, 10.0]}, "c": {"bare_ms": [1.0]}}
    rows = floor.switch_rows({"steps": steps}, "fused")
    assert list(rows["step"]) == ["a", "b"]
    a, b = rows.iloc[0], rows.iloc[1]
    assert a["speedup"] == pytest.approx(1.2) and a["lo"] == pytest.approx(1.2) and a["hi"] == pytest.approx(1.2)
    assert b["speedup"] == pytest.approx(1.0) and b["lo"] < 1.0 < b["hi"]
    assert list(floor.switch_rows(None, "fused").columns) == ["fused operations"]
    assert list(floor.switch_rows({"steps": steps}, "compact").columns) == ["compact step"]  # only fused twins


def test_the_fused_verdict_follows_its_interval():
    from thesis_studies.precision import floor

    assert precision_verdicts.switch_effect(1.1, 1.05, 1.2) == "faster with them (1.100x, 1.050-1.200)"
    assert precision_verdicts.switch_effect(0.9, 0.8, 0.95).startswith("slower with them")
    assert precision_verdicts.switch_effect(1.0, 0.95, 1.05).startswith("neither")
    assert precision_verdicts.switch_effect(1.1, 1.05, 1.2, them="it") == "faster with it (1.100x, 1.050-1.200)"
    assert precision_verdicts.switch_effect(float("nan"), float("nan"), float("nan")) == "not compared in this profile"
    steps = {"draft, FlashHead": {"bare_ms": [10.0, 10.0]}, "draft, FlashHead, fused off": {"bare_ms": [13.0, 13.0]},
             "target, block of 1": {"bare_ms": [20.0, 20.0]}, "target, block of 1, compact off": {"bare_ms": [25.0, 25.0]}}
    g = floor.switch_glued({"steps": steps}, "fused")
    assert g["spf_draft_speedup"] == pytest.approx(1.3) and g["spf_target1_speedup"] != g["spf_target1_speedup"]
    c = floor.switch_glued({"steps": steps}, "compact")
    assert c["spc_target1_speedup"] == pytest.approx(1.25) and c["spc_draft_speedup"] != c["spc_draft_speedup"]
    steps["draft, FlashHead, compact off"] = {"bare_ms": [12.0, 12.0]}  # the fused operations' other half: the modules
    assert floor.switch_glued({"steps": steps}, "fused")["spf_draft_speedup"] == pytest.approx(13 / 12)
    assert all(v != v for v in floor.switch_glued(None, "compact").values())
