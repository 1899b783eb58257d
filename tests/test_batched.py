"""Heads at batch B (bench.batched): the union of FlashHead's candidate clusters over a group of rows, and the
timing document's shape, on a tiny model's head."""

from __future__ import annotations

import pytest
import torch

from thesis_studies.serving import heads as batched
from thesis_lib.errors import ConfigError
from thesis_lib.heads import clustering as cl
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.flashhead import FlashHead

from conftest import TINY_VOCAB


@pytest.fixture(scope="module")
def heads(tiny_models):
    model = tiny_models[("f32", "qwen2", "target")]
    w = model.get_output_embeddings().weight.detach()
    flash = FlashHead(w, cl.spherical_kmeans(w, 17, iterations=10, seed=0, progress=False), n_probes=1,
                      vocab_limit=TINY_VOCAB, path="eager", centroid_dtype="float32")
    return {"dense": DenseGreedyHead.from_model(model, TINY_VOCAB), "flashhead": flash}


def test_the_union_counts_the_distinct_clusters_a_group_probes(heads):
    """One probe per row: states along 8 distinct centroids probe 8 clusters per group of 8 (nothing shared);
    eight copies of one state probe one; a mix of two states probes two."""
    flash = heads["flashhead"]
    cen = flash.unit_centroids.float()
    distinct = cen[:8] * 5
    assert torch.equal(flash.top_clusters(distinct, reference=False)[:, 0], torch.arange(8))
    apart = batched.candidate_union(flash, distinct.repeat(2, 1), 8)
    assert apart["groups"] == 2 and apart["clusters"] == 8 and apart["over_one_row"] == 8
    assert apart["rows"] == 8 * flash.cluster_size + flash.special_ids.numel()
    same = batched.candidate_union(flash, distinct[:1].repeat(16, 1), 8)
    assert same["clusters"] == 1 and same["over_one_row"] == 1
    two = batched.candidate_union(flash, distinct[:2].repeat(8, 1), 4)
    assert two["clusters"] == 2 and two["groups"] == 4
    mixed = batched.serving_order(distinct.repeat_interleave(2, 0), seed=1)  # each state twice, shuffled
    assert sorted(mixed.sum(1).tolist()) == sorted(distinct.repeat_interleave(2, 0).sum(1).tolist())
    assert batched.candidate_union(flash, distinct.repeat_interleave(2, 0), 2)["clusters"] == 1  # pairs of one state
    assert batched.candidate_union(flash, mixed, 2)["clusters"] > 1  # the shuffle splits most pairs
    with pytest.raises(ConfigError, match="no group of 32"):
        batched.candidate_union(flash, distinct, 32)


def test_shared_rows_pick_each_rows_own_greedy_token(tiny_models):
    """Scoring the union of the rows' clusters once and masking each row to its own: the fast path's tokens, on a
    float64 head (no rounding to break near ties), for groups of 1 to 16 rows and 1 to 17 probes; a row whose own
    clusters miss the union's best token still gets its own best."""
    model = tiny_models[("f64", "qwen2", "target")]
    w = model.get_output_embeddings().weight.detach()
    clus = cl.spherical_kmeans(w, 17, iterations=10, seed=0, progress=False)
    for p in (1, 3, 17):
        head = FlashHead(w, clus, n_probes=p, special_ids=[0, 5], vocab_limit=TINY_VOCAB, path="eager",
                         centroid_dtype="float64")
        assert head.special_ids.numel() == 2
        for b in (1, 5, 16):
            h = torch.randn(b, 64, generator=torch.Generator().manual_seed(b + p), dtype=torch.float64) * 3
            assert torch.equal(head.greedy_shared(h), head(h)), (p, b)
            assert torch.equal(head.greedy_shared(h.float()), head(h.float())), (p, b)  # states widened to the rows'
    one = FlashHead(w, clus, n_probes=1, vocab_limit=TINY_VOCAB, path="eager", centroid_dtype="float64")
    masked = 0
    for seed in range(40):  # pairs of rows where row 0's best token over the whole union lies in row 1's cluster
        h = torch.randn(2, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
        own = one.top_clusters(h, reference=False)[:, 0]
        union_best = int((h[0] @ w[:TINY_VOCAB].T).masked_fill(
            ~torch.isin(one.assignments[:TINY_VOCAB], own), float("-inf")).argmax())
        got = one.greedy_shared(h)
        assert torch.equal(got, one(h))
        assert int(one.assignments[got[0]]) == int(own[0])
        masked += int(one.assignments[union_best]) != int(own[0])
    assert masked >= 3  # cases where scoring the union without each row's mask would pick another row's token


def test_heads_by_batch_times_every_batch_on_the_groups_it_counts(heads):
    states = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)) * 3
    doc = batched.heads_by_batch(heads, states, batch_sizes=(1, 4, 8), reps=2, warmup=1, progress=False)
    assert doc["order_seed"] == 0
    assert doc["batch_sizes"] == [1, 4, 8] and list(doc["by_batch"]) == ["1", "4", "8"]
    for b, part in doc["by_batch"].items():
        n = 16 // int(b)
        assert part["groups"] == n and len(part["times_ms"]["dense"]) == 2 * n
        # the union is counted on the very groups timed: the states in serving order, not as given
        assert part["union"] == batched.candidate_union(heads["flashhead"], batched.serving_order(states, 0), int(b))
        assert part["dense_rows"] == TINY_VOCAB
    # and the two orders group these states differently, so the check above tells them apart
    assert doc["by_batch"]["4"]["union"] != batched.candidate_union(heads["flashhead"], states, 4)
    with pytest.raises(ConfigError, match="two groups"):
        batched.heads_by_batch(heads, states, batch_sizes=(16,), reps=1, warmup=0, progress=False)
    with pytest.raises(ConfigError, match="needs the 'dense'"):
        batched.heads_by_batch({"flashhead": heads["flashhead"]}, states, progress=False)


def _doc(speeds: dict[int, list[float]]) -> dict:
    """A constructed batch document: per batch size, the dense head's time over FlashHead's for each of 4 groups
    (FlashHead 1 ms per call, two repetitions alike)."""
    by = {}
    for b, ratios in speeds.items():
        dense = [float(r) for r in ratios] * 2
        by[str(b)] = {"groups": len(ratios), "times_ms": {"dense": dense, "flashhead": [1.0] * len(dense)},
                      "stats": {"dense": {"p50_ms": 2.0}, "flashhead": {"p50_ms": 1.0}},
                      "per_row_ms": {"dense": 2.0 / b, "flashhead": 1.0 / b},
                      "union": {"over_one_row": float(b), "rows": 100.0 * b}, "dense_rows": 1000}
    return {"base": "dense", "flash": "flashhead", "by_batch": by}


def test_the_batch_table_and_where_the_advantage_goes_follow_the_numbers():
    from thesis_studies.serving.batch_tables import advantage_gone, batch_rows, shown

    rows = batch_rows(_doc({1: [3, 3.2, 2.9, 3.1], 8: [1.5, 1.6, 1.4, 1.5], 32: [0.5, 0.6, 0.4, 0.5]}))
    assert rows["FlashHead value"].tolist() == pytest.approx([3.05, 1.5, 0.5])
    assert (rows["FlashHead lo"] <= rows["FlashHead value"]).all() and (rows["FlashHead value"] <= rows["FlashHead hi"]).all()
    assert advantage_gone(rows).startswith("FlashHead is first slower than the dense head at 32 states")
    assert advantage_gone(rows.iloc[::-1]) == advantage_gone(rows)  # the batches' order in the document
    assert advantage_gone(rows, "FlashHead, shared rows") == "not measured"
    assert "FlashHead lo" not in shown(rows) and "FlashHead speedup" in shown(rows)
    mixed = batch_rows(_doc({1: [3, 3.2, 2.9, 3.1], 8: [0.5, 2.0, 0.6, 1.9]}))
    assert advantage_gone(mixed).startswith("at 8 states per call the data first cannot tell")
    assert advantage_gone(batch_rows(_doc({1: [3, 3.2, 2.9, 3.1], 2: [2, 2.1, 1.9, 2]}))).startswith("FlashHead stays faster")
    assert advantage_gone(batch_rows(None)) == "not measured"


def _decode_doc(times: dict[str, list[float]], groups: int, costs: dict | None = None) -> dict:
    """A batched-decoding document at B = 4 with the given decode seconds per mode (rep-major over ``groups``)."""
    n = len(times["baseline"])
    return {"modes": list(times), "k": 4, "by_batch": {"4": {
        "groups": groups, "decode_s": times, "tokens": {m: [40] * n for m in times},
        "latency_s": {m: [1.0] * n for m in times}, "acceptance": {m: [0.5] * n if m != "baseline" else [] for m in times},
        "rows_equal": {m: 4 * n for m in times}, "rows": 4 * n, "costs_ms": costs}}}


def test_the_gpu_batch_sentence_reads_the_gpu_check_part_of_the_saved_document():
    """The saved document nests gpu-check's output under ``gpu_check``; the sentence reads its batch part there, and
    says so where there is none."""
    from thesis_studies.serving import batch_tables as ab

    doc = {"gpu_check": {"versions": {"gpu": "Some GPU"}, "batch_heads": _doc({1: [2, 2, 2, 2], 8: [0.5] * 4})}}
    said = ab.gpu_batch_sentence(doc)
    assert said.startswith("on the lent Some GPU") and "2.00x at one state and 0.50x at 8" in said, said
    assert "captured" not in said  # no captured part: the launch-bound figures alone
    doc["gpu_check"]["batch_heads"]["captured"] = {"by_batch": {
        str(b): {"ms": {"dense": 0.12, "batched": ms}} for b, ms in ((1, 0.03), (8, 0.08), (16, 0.15), (32, 0.2))}}
    said = ab.gpu_batch_sentence(doc)
    assert "4.00x at 1, 1.50x at 8, 0.80x at 16, 0.60x at 32 (first slower than the dense head at 16 states)" in said
    doc["gpu_check"]["batch_heads"]["captured"]["by_batch"]["16"]["ms"]["batched"] = 0.1
    doc["gpu_check"]["batch_heads"]["captured"]["by_batch"].pop("32")
    assert "(faster than the dense head at every batch up to 16)" in ab.gpu_batch_sentence(doc)
    assert ab.gpu_batch_sentence(doc["gpu_check"]).startswith("not measured yet")  # not the document's shape
    assert ab.gpu_batch_sentence({"gpu_check": {"versions": {}}}).startswith("not measured yet")
    assert ab.gpu_batch_sentence(None).startswith("not measured yet")


def test_batched_decoding_verdicts_follow_the_intervals():
    from thesis_studies.serving import batch_tables as ab

    base = [2.0, 2.2, 1.9, 2.1, 2.0, 2.3]
    twice = ab.decode_rows(_decode_doc({"baseline": base, "flash_deferred": [x / 2 for x in base]}, 3))
    best = ab.fastest_at(twice, 4)
    assert best["mode"] == "FlashHead, deferred" and best["verdict"] == "faster"
    assert best["value"] == pytest.approx(2.0) and twice["tokens/s"].iloc[1] == pytest.approx(2 * twice["tokens/s"].iloc[0])
    assert "stays faster at every batch" in ab.speculation_gone(twice)
    noisy = [1.2, 3.0, 1.4, 2.9, 1.1, 3.1]  # as often faster as slower: the interval holds 1
    unclear = ab.decode_rows(_decode_doc({"baseline": base, "dense_deferred": noisy}, 3))
    assert ab.fastest_at(unclear, 4)["verdict"] == "cannot tell"
    assert "from 4 prompts at once on" in ab.speculation_gone(unclear) and "cannot be told apart" in ab.speculation_gone(unclear)
    slow = ab.decode_rows(_decode_doc({"baseline": base, "dense_deferred": [3 * x for x in base]}, 3))
    assert ab.fastest_at(slow, 4)["verdict"] == "slower" and ab.fastest_at(slow, 8) is None
    assert "is slower than" in ab.speculation_gone(slow)
    assert list(ab.decode_rows(None).columns) == ["batched decoding"]


def test_the_modelled_speed_reads_the_costs_of_its_schedule_and_draft():
    """Every draft token accepted, a free draft and a verify that costs one step: a round emits K + 1 tokens for
    one step's cost (K + 1 = 5 here); the ordinary schedule pays its append too (2.5); nothing accepted and a dear
    verify: below 1; no costs recorded: no model."""
    from thesis_studies.serving import batch_tables as ab

    costs = {"target_1": 100.0, "target_4": 100.0, "target_5": 100.0, "flash_1": 0.0, "dense_1": 50.0}
    assert ab._modelled("flash_deferred", costs, 1.0, 4) == pytest.approx(5.0)
    assert ab._modelled("flash_ordinary", costs, 1.0, 4) == pytest.approx(2.5)
    assert ab._modelled("dense_deferred", costs, 0.0, 4) == pytest.approx(100 / 300)
    assert ab._modelled("dense_deferred", None, 0.5, 4) is None and ab._modelled("baseline", costs, None, 4) == 1.0


def test_the_draft_step_table_reads_medians_and_ranges_of_the_step_costs():
    from thesis_studies.serving import batch_tables as ab

    costs = {"target_1": 80.0, "dense_1": 40.0, "flash_1": 25.0,
             "times_ms": {"dense_1": [39.0, 40.0, 47.5], "flash_1": [24.0, 25.0, 30.0]}}
    doc = {"by_batch": {"1": {"costs_ms": costs}, "8": {"costs_ms": {"target_1": 1.0}}}}  # B = 8: no draft timed
    rows = ab.draft_step_rows(doc)
    assert list(rows["B"]) == [1] and rows["dense range"].iloc[0] == "39.0-47.5"
    assert rows["dense / FlashHead"].iloc[0] == pytest.approx(1.6)
    assert list(ab.draft_step_rows(None).columns) == ["draft step"]
