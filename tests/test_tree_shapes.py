"""Choosing a tree's shape (decoding.tree_shapes) and reading a tree-bench document (analysis.trees), on constructed
data: the rank table's counting, a round's cost, the search's choices, the GPU model and the verdicts both ways."""

from __future__ import annotations

import math

import pytest

from thesis_studies.trees import tables as at
from thesis_studies.trees.shapes import MISS, accepted, evaluate, gate_study, gated, independent_nodes, rank_table, round_seconds, search
from thesis_studies.trees.loop import TreeShape
from thesis_lib.errors import ConfigError


def test_the_rank_table_counts_each_depth_among_the_starts_whose_earlier_depths_were_covered():
    """One sequence of ranks [0, 1, MISS, 0]: depth 1 counts 4 starts (0, 1, miss, 0); depth 2 only the starts whose
    first token was covered (positions 0, 1; position 3 has no second token): ranks 1 and miss."""
    table, trials = rank_table([[0, 1, MISS, 0]], depth=3, kept=2)
    assert trials == [4, 2, 1]
    assert table[0] == [0.5, 0.25] and table[1] == [0.0, 0.5] and table[2] == [0.0, 0.0]
    table, trials = rank_table([[5, 0]], depth=2, kept=3)  # a rank past the kept ones is a miss
    assert trials == [2, 0] and table[0] == [0.5, 0.0, 0.0]


def test_a_round_pays_one_draft_forward_per_depth_over_the_nodes_with_children_and_one_verify():
    shape = TreeShape(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    # root (1 token); depth 1: two nodes with children; depth 2: one; verify over 1 + 6 tokens
    cost = round_seconds(shape, lambda e: {1: 1.0, 2: 1.5}[e], lambda n: 10.0 * n)
    assert cost == 1.0 + 1.5 + 1.0 + 70.0
    assert round_seconds(TreeShape.chain(4), lambda e: 1.0, lambda n: float(n)) == 4.0 + 5.0


def test_a_round_accepts_the_target_s_path_as_far_as_the_shape_holds_it():
    shape = TreeShape(((0,), (1,), (0, 0)))
    assert [accepted(shape, r) for r in ([0, 0, 0], [1, 0], [2, 0], [0, 1], [MISS])] == [2, 1, 0, 1, 0]
    assert accepted(TreeShape.chain(3), [0, 0, 0, 0]) == 3 and accepted(TreeShape.chain(3), [0, MISS, 0]) == 1
    assert accepted(TreeShape.chain(3), [0, 0]) == 2  # the text ends


def test_the_replay_runs_rounds_one_after_another_and_switches_shape_by_the_draft_s_confidence():
    """Ranks 0 at all 12 positions but position 4 (rank 1), where alone the draft is unsure (0.3); draft forwards cost
    1, a verify over n tokens 1 + (n - 1) / 2. The chain K = 3 every round (5.5 s): rounds at 0 (3 accepted, 4
    tokens), 4 (none: 1), 5 (3: 4), 9 (3, of which the text holds 3 tokens): 12 tokens in 4 rounds, 22 s. Switching
    to 3 candidates at depth 1 (3.5 s) below 0.5: rounds at 0 (4 tokens), 4 (the rank-1 candidate: 2), 6 (4), 10 (the
    text's last 2): 12 tokens in 20 s; the fan in every round: 6 rounds of 2 tokens, 21 s. A one-token stop in every
    round beats them all: 12 tokens in 7 rounds of 2.5 s."""
    ranks, conf = [[0] * 4 + [1] + [0] * 7], [[0.9] * 4 + [0.3] + [0.9] * 7]
    draft, verify = {e: 1.0 for e in range(1, 4)}, {n: 1.0 + (n - 1) / 2 for n in range(1, 5)}
    chain, fan = TreeShape.chain(3), TreeShape.beam(1, 3)
    always = gated(ranks, conf, chain, fan, 0.0, draft, verify, 1.0)
    assert always["tokens_per_forward"] == 3.0 and math.isclose(always["speedup"], 12 / 22)
    switched = gated(ranks, conf, chain, fan, 0.5, draft, verify, 1.0)
    assert switched["tokens_per_forward"] == 3.0 and math.isclose(switched["speedup"], 12 / 20)
    assert math.isclose(gated(ranks, conf, chain, fan, 1.0, draft, verify, 1.0)["speedup"], 12 / 21)
    study = gate_study(ranks, conf, 3, draft, verify, 1.0)
    assert math.isclose(study["chain"]["speedup"], 12 / 22)
    assert study["fan"]["threshold"] == 0.35 and math.isclose(study["fan"]["speedup"], 12 / 20)  # the first that switches
    assert study["stop"]["threshold"] == 0.95 and math.isclose(study["stop"]["speedup"], 12 / 17.5)  # every round stops
    empty = gated([[]], [[]], chain, fan, 0.5, draft, verify, 1.0)  # nothing to replay: no number, no crash
    assert math.isnan(empty["tokens_per_forward"]) and math.isnan(empty["speedup"])


def test_a_document_without_confidences_glues_the_same_keys_with_no_numbers():
    """A tree-bench document written before confidences were recorded: every key chapter 8 glues is there, the
    numbers NaN, the fan's size the chain's K, and the verdict says it cannot be replayed."""
    ranks = [[0, 0, 1, 0, 0, MISS, 0, 0]]
    d = {"ranks": ranks, "confidence": [[0.9, 0.9, 0.4, 0.9, 0.9, 0.2, 0.9, 0.9]],
         "search": {"best": {"chain": {"depth": 2}}}, "draft_s": {e: 0.01 for e in range(1, 9)}}
    doc = {"calibration": {"verify_s": {str(n): 0.1 + 0.01 * n for n in range(1, 10)}, "drafts": {"flash": d}}}
    full = at.gate_values(doc)
    old = at.gate_values({"calibration": {**doc["calibration"], "drafts": {"flash": {k: v for k, v in d.items()
                                                                                    if k != "confidence"}}}})
    assert set(full) == set(old) and old["gate_fan_nodes"] == full["gate_fan_nodes"] == 2
    assert all(math.isnan(v) for k, v in old.items() if k != "gate_fan_nodes")
    assert not any(math.isnan(v) for v in full.values())
    assert at.gate_verdict(old["gate_fan_speed"], old["gate_stop_speed"]).startswith("cannot be replayed")


def test_the_search_picks_a_tree_where_verifying_is_flat_and_a_chain_where_every_token_costs():
    """A draft whose second candidate is often right: with a verify that costs the same for any size (a GPU's
    regime) the best grown tree beats the best chain; when each verified token costs as much as a step, the chain."""
    table = [[0.5, 0.3, 0.1]] * 12
    draft = {e: 0.05 for e in range(1, 9)}
    flat = search(table, draft, {n: 1.0 for n in range(1, 34)}, 1.0, max_nodes=32)
    assert flat["best"]["grown"]["tokens_per_s"] > 1.2 * flat["best"]["chain"]["tokens_per_s"]
    assert flat["best"]["grown"]["nodes"] > flat["best"]["grown"]["depth"]  # it branches
    steep = search(table, draft, {n: float(n) for n in range(1, 34)}, 1.0, max_nodes=32)
    assert steep["best"]["grown"]["nodes"] == steep["best"]["grown"]["depth"]  # no branch pays: it is a chain
    chain = evaluate(TreeShape.chain(2), table, draft, {n: 1.0 for n in range(1, 4)}, 1.0)
    assert math.isclose(chain["expected_emitted"], 1 + 0.5 + 0.25)



def test_the_search_builds_and_scores_its_beams_by_the_table():
    """Where the draft's second candidate is the target's token four times in five, a beam of width 2 keeps both
    candidates at depth 1 and, at depth 2, the second candidate's second candidate and one of the two paths
    through a first: it accepts 0.9 + 0.8 x 0.8 + 0.1 x 0.8 = 1.62 tokens a round (a beam built from the prior,
    which trusts first candidates, would keep (0, 0) and accept 0.99). The speedup is tokens per target step."""
    table = [[0.1, 0.8, 0.05]] * 12
    found = search(table, {e: 0.05 for e in range(1, 9)}, {n: 1.0 for n in range(1, 6)}, 0.5, max_nodes=4,
                   widths=(2,))
    beam = next(r for r in found["beams"] if r["label"] == "k2w2")
    assert beam["expected_accepted"] == pytest.approx(1.62)
    assert beam["speedup"] == pytest.approx(beam["tokens_per_s"] * 0.5)  # a target step takes 0.5 s

def test_the_independent_node_closed_form_overshoots_the_depth():
    assert math.isclose(independent_nodes(0.7, 3, 3), 0.7 * (1 + 2.1 + 4.41))
    assert independent_nodes(0.7, 3, 3) > 3  # more than a depth-3 round can accept
    assert independent_nodes(0.5, 1, 4) == pytest.approx(0.5 + 0.25 + 0.125 + 0.0625)


def _doc(speeds: dict[str, list[float]], emitted: dict[str, list[int]]) -> dict:
    """A tree-bench document of constructed samples: per mode, one decode speed and emitted count per prompt (10
    tokens each, 5 rounds for the speculative modes)."""
    records = []
    for mode, xs in speeds.items():
        for i, x in enumerate(xs):
            r = {"mode": mode, "question_id": f"q{i}", "iteration": 0, "new_tokens": 11, "decode_tokens": 10,
                 "first_emit": 1, "decode_s": 10 / x, "matches_baseline": True}
            if mode in emitted:
                r.update(emitted=emitted[mode][i], rounds=5)
            records.append(r)
    table = [[0.6, 0.2, 0.1] + [0.0] * 5] * 12
    best = {"chain": {"depth": 4}, "grown": {"nodes": 8}}
    drafts = {name: {"table": table, "trials": [100] * 12, "search": {"best": best}} for name in ("flash", "dense")}
    return {"records": records, "modes": list(speeds), "calibration": {"drafts": drafts, "prompts": 3}}


def test_the_tree_verdicts_follow_the_intervals_both_ways():
    modes = ["baseline", "flash_deferred@k3", "flash_deferred@k4", "flash_tree@k4n8", "dense_deferred@k4",
             "dense_tree@k4n8", "hf_assisted", "hf_assisted_defaults"]
    fast = _doc({m: [10.0, 10.5, 9.5, 10.2] if m == "baseline" else
                 [20.0, 21.0, 19.5, 20.5] if m.startswith("flash_tree") else [12.0, 12.5, 11.5, 12.2] for m in modes},
                {m: [25, 26, 24, 25] if "tree" in m else [15, 15, 16, 14] for m in modes if "_" in m and "hf" not in m})
    v = at.tree_values(fast)
    assert v["flash"]["forward_verdict"].startswith("reaches") and v["flash"]["speed_verdict"] == "the tree is faster"
    assert v["modes"]["flash_tree"] == v["modes"]["flash_fastest_tree"] == "flash_tree@k4n8"
    assert at.tree_vs_peer(v["hf_assisted"]["lo"], v["hf_assisted"]["hi"]) == "the tree is faster"
    assert at.peer_target(v["hf_assisted"]["value"], v["hf_assisted"]["lo"], v["hf_assisted"]["hi"],
                          v["hf_assisted_defaults"]["value"], v["hf_assisted_defaults"]["lo"],
                          v["hf_assisted_defaults"]["hi"]).startswith("reaches")
    slow = _doc({m: [10.0, 10.5, 9.5, 10.2] if m == "baseline" else
                 [8.0, 8.2, 7.9, 8.1] if "tree" in m else [12.0, 12.5, 11.5, 12.2] for m in modes},
                {m: [15, 16, 15, 15] if "tree" in m else [15, 15, 16, 14] for m in modes if "_" in m and "hf" not in m})
    v = at.tree_values(slow)
    assert v["flash"]["forward_verdict"].startswith("falls short") and v["flash"]["speed_verdict"] == "the chain is faster"
    assert at.peer_target(0.7, 0.65, 0.75, 0.8, 0.7, 0.9).startswith("falls short")
    assert at.peer_target(1.3, 1.1, 1.5, 1.4, 1.3, 1.5).startswith("cannot be told")  # judged on the faster peer
    assert at.tree_vs_chain(0.9, 1.1).endswith("cannot be told apart at this sample size")
    assert at.forward_verdict(1.1, 1.4).startswith("cannot be told")
    assert at.gpu_trees(1.3, 1.0).startswith("gives the tree 30 %") and at.gpu_trees(1.0, 1.25).startswith("gives the chain 25 %")
    assert at.gpu_trees(1.0, 1.01).startswith("gives trees and chains the same")
    assert at.gate_verdict(1.01, 1.005).startswith("gains under 2 %")
    assert at.gate_verdict(1.05, 1.04).startswith("gains by drafting less")
    assert at.gate_verdict(1.10, 1.02).startswith("gains 7.8 % more with the fan")
    assert at.gate_verdict(float("nan"), 1.0).startswith("cannot be replayed")


def test_the_gpu_model_reads_the_documents_costs_in_target_steps():
    """The verify curve over one step and the captured draft step over the 64-layer target's step (8 layers timed)."""
    gpu = {"gpu_check": {"verify": {"layers": 8, "ms": {"1": 4.0}, "over_step": {str(n): 1.0 for n in range(1, 14)}},
                         "draft_step_graphs": {"captured": {"flashhead_ms": 3.2}}}}
    doc = {"calibration": {"drafts": {"flash": {"table": [[0.6, 0.3, 0.05]] * 12}}}}
    out = at.gpu_prediction(doc, gpu)
    assert math.isclose(out["c"], 3.2 / 32.0) and out["target_step_ms"] == 32.0
    assert out["grown"]["speedup"] > out["chain"]["speedup"] and out["grown"]["nodes"] <= 12
    assert at.gpu_prediction(doc, None) is None


def test_grown_trees_follow_the_measured_table_not_the_prior():
    """A draft whose second candidate is right far more often than its first (a table unlike the prior, whose first
    rank is the likeliest): the one-node tree is that second candidate, and the search's one-node tree expects its
    0.7 accepted tokens (seed-6 survivors: trees grown from the prior)."""
    table = [[0.2, 0.7, 0.1]] * 4
    assert TreeShape.grown(1, table, max_rank=3).paths == ((1,),)
    # 0.7, 0.49 and 0.343 down the second candidates, each above the first candidate's 0.2
    assert TreeShape.grown(3, table, max_rank=3).paths == ((1,), (1, 1), (1, 1, 1))
    assert TreeShape.grown(3, table, max_rank=3).label == "n3"  # the name the search's rows and tables show
    found = search(table, {e: 0.05 for e in range(1, 9)}, {n: 1.0 for n in range(1, 6)}, 1.0, max_nodes=1)
    assert math.isclose(found["grown"][0]["expected_accepted"], 0.7)


def test_a_node_whose_parent_is_missing_is_refused_at_any_depth():
    """A rank path needs every prefix before it: (0, 0, 0) without (0, 0) is refused, though its grandparent (0,)
    is there (seed-6 survivor: a check of the first rank only)."""
    with pytest.raises(ConfigError, match="parent"):
        TreeShape(((0,), (0, 0, 0)))
    assert TreeShape(((0,), (0, 0), (0, 0, 0))).size == 3


def test_each_constructor_takes_its_smallest_size_and_refuses_the_one_below():
    """One node, a chain of one, a beam one deep and one wide, a table one deep with one rank: accepted, with the
    shapes they name; one less (or a width of 0) is refused with a message naming the size."""
    table = [[0.6, 0.3]] * 3
    assert TreeShape.chain(1).paths == ((0,),) and TreeShape.beam(1, 1).paths == ((0,),)
    assert TreeShape.grown(1, table, max_rank=2).paths == ((0,),)
    assert rank_table([[0, 0]], depth=1, kept=1) == ([[1.0]], [2])
    for make, message in ((lambda: TreeShape.chain(0), r"^a chain needs K >= 1, got 0\.$"),
                          (lambda: TreeShape.beam(0, 2), r"^a tree needs depth >= 1 and width >= 1, got 0, 2\.$"),
                          (lambda: TreeShape.beam(2, 0), r"^a tree needs depth >= 1 and width >= 1, got 2, 0\.$"),
                          (lambda: TreeShape.grown(0, table), r"^a tree needs at least one node, got 0\.$"),
                          (lambda: TreeShape(()), r"^A token tree needs at least one node\.$"),
                          (lambda: rank_table([[0]], depth=0, kept=1), r"^need depth >= 1 and kept >= 1, got 0, 1\.$"),
                          (lambda: rank_table([[0]], depth=1, kept=0), r"^need depth >= 1 and kept >= 1, got 1, 0\.$")):
        with pytest.raises(ConfigError, match=message):
            make()


def test_a_cost_curve_is_read_only_where_it_was_measured():
    """A shape whose verify needs a size the curve lacks is refused with the sizes measured, not extrapolated."""
    with pytest.raises(ConfigError, match=r"^no cost measured for 5 tokens \(measured: 1\.\.4\)\.$"):
        evaluate(TreeShape.chain(4), [[0.5]] * 4, {1: 0.1}, {n: 1.0 for n in range(1, 5)}, 1.0)
    assert evaluate(TreeShape.chain(3), [[0.5]] * 4, {1: 0.1}, {n: 1.0 for n in range(1, 5)}, 1.0)["round_s"] == 1.3


def test_a_tree_that_is_not_breadth_first_or_names_a_bad_rank_is_refused_by_name():
    for bad, message in ((((0,), (0, 0), (1,)), r"^a tree's nodes are listed breadth first"),
                         (((0,), (0,)), r"^tree node \(0,\) is listed twice\.$"),
                         (((0,), (0, -1)), r"^tree node \(0, -1\): a rank path is a non-empty tuple of ranks >= 0\.$"),
                         (((0,), ()), r"^tree node \(\): a rank path"),
                         (((1, 0),), r"^tree node \(1, 0\) comes before \(or without\) its parent \(1,\)\.$")):
        with pytest.raises(ConfigError, match=message):
            TreeShape(bad)
    with pytest.raises(ConfigError, match=r"^A tree shape is rank paths like '0 1 0\.0 0\.1' \(got '0 x'\)\.$"):
        TreeShape.parse("0 x")
