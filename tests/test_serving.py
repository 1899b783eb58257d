"""The serving questions' parts (bench.lengths, bench.memory, analysis.serving): acceptance by output position,
bytes counted from tensors, peak memory, and the tables and verdicts read from constructed documents."""

from __future__ import annotations

import pytest
import torch

from thesis_studies.serving import tables as served
from thesis_studies.serving import lengths, memory
from thesis_lib.decoding.stats import DecodeStats


def test_draft_tokens_fall_in_the_bins_of_their_output_positions():
    """Rounds of 4 drafted tokens after the prefill's token: the first round's tokens sit at positions 1-4 (3 of
    them accepted), the second's start after the 4 tokens that round emitted; bins [0, 4), [4, 8), [8, 12)."""
    st = DecodeStats(mode="flash_deferred", k=4, drafted=[4, 4, 4], accepted=[3, 0, 4], emitted=[4, 1, 5])
    into = {"drafted": [0, 0, 0], "accepted": [0, 0, 0]}
    lengths._count_positions(st, [0, 4, 8, 12], into)
    # round 1: positions 1-4 (1,2,3 accepted); round 2: positions 5-8 (none); round 3: positions 6-9 (all)
    assert into["drafted"] == [3, 4 + 2, 3] and into["accepted"] == [3, 0 + 2, 2]
    with pytest.raises(Exception, match="at least 2"):
        lengths.check_lengths([1, 32])


def test_tensor_bytes_count_each_storage_once_and_plain_tensor_attributes_too():
    lin = torch.nn.Linear(8, 4, bias=True)  # 32 + 4 float32
    tied = torch.nn.Module()
    tied.a, tied.b = lin, torch.nn.Linear(8, 4, bias=False)
    tied.b.weight = lin.weight  # shared: counted once
    assert memory.tensor_bytes(lin) == (32 + 4) * 4
    assert memory.tensor_bytes(tied) == (32 + 4) * 4
    lin.extra = torch.zeros(10, dtype=torch.bfloat16)  # a plain attribute (a weight-only layer's dense rows)
    assert memory.tensor_bytes(lin) == (32 + 4) * 4 + 20


def test_kv_bytes_grow_by_one_token_s_keys_and_values_per_layer():
    from thesis_lib.decoding.state import ModelState
    from thesis_lib.models import tiny

    model = tiny.tiny_model("qwen2", layers=2, hidden=64, heads=4, kv_heads=2)
    state = ModelState(model, vocab_limit=259)
    got = memory.kv_bytes(state, list(range(10)))
    per_token = 2 * 2 * 2 * 16 * 4  # layers x (keys, values) x kv heads x head dim x float32
    assert got["tokens"] == 10 and got["per_token"] == per_token and got["bytes"] >= 10 * per_token
    assert state.length == 0  # the cache is left empty


def test_peak_memory_sees_a_transient_allocation():
    """64 MiB of fresh pages (an anonymous mapping, each page written; a tensor may reuse memory the allocator
    already holds resident, so its bytes need not raise the resident size), held, then released."""
    import mmap

    size = 64 * 2 ** 20

    def transient():
        pages = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            pages[offset] = 1
        pages.close()

    got = memory.peak_rss(transient)
    if got["peak"] is None:
        pytest.skip("this kernel does not let a process reset its peak resident memory")
    assert got["peak"] - got["before"] > 48 * 2 ** 20


def _lengths_doc(short: list[float], long: list[float]) -> dict:
    base = [2.0, 2.0, 2.0, 2.0]
    return {"modes": ["baseline", "flash_deferred"], "position_edges": [0, 32, 64],
            "by_position": {"flash_deferred": {"drafted": [40, 0], "accepted": [30, 0]}},
            "by_length": {str(n): {"decode_s": {"baseline": base, "flash_deferred": x},
                                   "tokens": {"baseline": [n, n, n, n - 5], "flash_deferred": [n, n, n, n - 5]},
                                   "equal": {"baseline": 4, "flash_deferred": 4}}
                          for n, x in ((32, short), (256, long))},
            "head_share": {"64": {"body_ms": 30.0, "dense": {"head_ms": 10.0, "share": 0.25},
                                  "flashhead": {"head_ms": 3.0, "share": 3 / 33}},
                           "320": {"body_ms": 40.0, "dense": {"head_ms": 10.0, "share": 0.2},
                                   "flashhead": {"head_ms": 3.0, "share": 3 / 43}}}}


def test_length_tables_and_their_verdicts_follow_the_constructed_numbers():
    doc = _lengths_doc([1.0, 1.1, 0.9, 1.0], [1.6, 1.7, 1.5, 1.6])
    rows = served.length_rows(doc)
    assert list(rows["new tokens"]) == [32, 256] and list(rows["ran to N"]) == ["3/4", "3/4"]
    short, long = rows.iloc[0], rows.iloc[1]
    assert short["value"] == pytest.approx(2.0) and long["value"] == pytest.approx(2.0 / 1.6)
    assert served.length_trend(short["lo"], short["hi"], long["lo"], long["hi"]).startswith("lower")
    assert served.length_trend(long["lo"], long["hi"], short["lo"], short["hi"]).startswith("higher")
    assert served.length_trend(1.0, 1.3, 1.2, 1.5).startswith("not distinguishable")
    pos = served.position_rows(doc)
    assert pos["FlashHead, deferred acceptance"].iloc[0] == 0.75 and pos["FlashHead, deferred acceptance"].isna().iloc[1]
    hs = served.head_share_rows(doc)
    change = served.share_change(hs)
    assert (change["short"], change["long"], change["from"], change["to"]) == (64, 320, 0.25, 0.2)
    assert served.share_trend(0.25, 0.2) == "falls" and served.share_trend(0.2, 0.25) == "rises"
    assert served.share_trend(0.25, 0.24).startswith("stays")


def test_the_batched_verdict_reads_both_ways():
    assert served.batched_verdict(1.1, 1.3).startswith("faster")
    assert served.batched_verdict(0.4, 0.6).startswith("slower")
    assert served.batched_verdict(0.9, 1.2).startswith("not distinguishable")


def test_the_memory_table_reads_a_constructed_document():
    mib = served.MIB
    doc = {"models": {"target": 1000 * mib, "draft": 500 * mib},
           "flashhead": {"tensors": {"weight_perm": 260 * mib, "tokens": 2 * mib, "slot_bias": 1024},
                         "total": 262 * mib + 1024, "dense_head": 260 * mib},
           "kv": {"target": {"per_token": 28 * 1024}, "draft": {"per_token": 12 * 1024}},
           "peak": {"baseline": {"rows": 1, "before": 2000 * mib, "peak": 2100 * mib},
                    "batched_flash_deferred": {"rows": 8, "before": 2000 * mib, "peak": None}}}
    rows = served.memory_rows(doc, contexts=(512, 4096), batch=8).set_index("part")
    assert rows.loc["target weights", "MiB"] == 1000 and rows.loc["  of which weight_perm", "MiB"] == 260
    assert "  of which slot_bias" not in rows.index  # below a MiB: in the total only
    assert rows.loc["target KV cache, 1 sequence x 4096 tokens", "MiB"] == pytest.approx(112)
    assert rows.loc["draft KV cache, 8 sequences x 4096 tokens", "MiB"] == pytest.approx(384)
    assert rows.loc["peak resident, target-only", "rise MiB"] == pytest.approx(100)
    assert rows.loc["peak resident, FlashHead, deferred, 8 prompts at once"].isna().all()


def test_the_model_gap_reads_both_ways():
    assert served.model_gap(0.5, 0.7) == "lies below the model's"
    assert served.model_gap(0.9, 0.7) == "lies above the model's"
    assert served.model_gap(0.68, 0.7).startswith("lies within")
    assert served.model_gap(0.68, float("nan")).startswith("has no model")


def test_a_served_batch_takes_the_categories_in_turn():
    from types import SimpleNamespace

    from thesis_studies.serving.modes import mixed

    prompts = [SimpleNamespace(category=c, question_id=f"{c}{i}") for c in "abc" for i in range(4)]
    got = [p.question_id for p in mixed(prompts, 2, 5)]
    assert got == ["a0", "b0", "c0", "a1", "b1"]


def test_the_exactness_sentence_follows_the_attention_and_precision_recorded():
    assert "bit for bit" in served.exactness({"attention": "row-exact (...)", "precision": "int8-dynamic"})
    probed = served.exactness({"attention": "row-exact (...)", "precision": "float32", "rows_exact": True})
    assert "up to 13 rows" in probed and "held" in probed
    assert served.exactness({"attention": "sdpa", "precision": "bfloat16"}).startswith("attention here is the model's")


def test_the_memory_rise_verdict_reads_both_ways():
    assert served.rise_verdict(0.1).startswith("the runs' caches and activations fit")
    assert served.rise_verdict(250.0).startswith("the runs needed")
    assert served.rise_verdict(float("nan")).startswith("the peak was not read")
