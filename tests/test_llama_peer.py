"""llama.cpp as a peer, below its server: the decode speed as this project counts it, the tuning's choice per kind
of speculative decoding, and where two texts part; on constructed results, no server started."""

from __future__ import annotations

import contextlib

import pytest

from thesis_studies.peers import llama


def test_decode_speed_counts_the_tokens_after_the_first_over_the_seconds_after_it():
    """llama.cpp's first token comes with the prefill: 9 and 4 tokens after it in 1.0 and 0.5 s."""
    results = [{"tokens": list(range(10)), "decode_s": 1.0}, {"tokens": list(range(5)), "decode_s": 0.5}]
    assert llama.decode_speed(results) == pytest.approx(13 / 1.5)


def test_the_tuning_keeps_the_fastest_draft_setting_and_the_fastest_n_gram_method(monkeypatch):
    """Each setting's server decodes at a speed constructed from its settings; the fastest of each kind wins, and
    every setting of the grid and every n-gram method was tried on every calibration prompt."""
    served = []

    @contextlib.contextmanager
    def fake_server(model, *, threads, draft=None, spec=None):
        served.append(spec)
        yield spec

    def fake_complete(spec, ids, n):
        if "type" in spec:
            seconds = {"ngram-mod": 0.5}.get(spec["type"], 1.0)
        else:  # fastest at draft-max 8, p-min 0.5
            seconds = 1.0 + abs(spec["draft_max"] - 8) / 8 + abs(spec["draft_p_min"] - 0.5)
        return {"tokens": list(range(n + 1)), "decode_s": seconds}

    monkeypatch.setattr(llama, "server", fake_server)
    monkeypatch.setattr(llama, "complete", fake_complete)
    got = llama.tune({"target": "t", "draft": "d"}, [[1, 2, 3]] * 3, threads=2, max_new_tokens=10, progress=False)
    best = got["best"]
    assert (best["speculative"]["draft_max"], best["speculative"]["draft_min"], best["speculative"]["draft_p_min"]) == (8, 0, 0.5)
    assert best["speculative"]["decode_tokens_per_s"] == pytest.approx(10.0)
    assert best["n-gram"]["type"] == "ngram-mod" and best["n-gram"]["decode_tokens_per_s"] == pytest.approx(20.0)
    assert len(served) == len(llama.DRAFT_GRID) + len(llama.NGRAM_TYPES) == len(got["tried"])


@pytest.mark.parametrize("a, b, at", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2),
                                      ([7], [1], 0)])
def test_where_two_texts_part(a, b, at):
    assert llama._parting(a, b) == at


def test_the_comparison_is_paired_per_prompt_and_per_category():
    """Two categories; setting a decodes each prompt's 10 tokens after the first in half b's time on code prompts
    and in b's time on chat prompts: 2x and 1x per category; pooled over all prompts, 4.5 s against 6 s: 1.33x."""
    def row(a_s, b_s):
        return {"a": {"tokens": list(range(11)), "decode_s": a_s}, "b": {"tokens": list(range(11)), "decode_s": b_s}}

    doc = {"rows": [row(0.5, 1.0), row(1.0, 2.0), row(1.0, 1.0), row(2.0, 2.0)],
           "categories": ["code", "code", "chat", "chat"],
           "summary": {"ours x": {"decode_tokens_per_s": 3.0}, "ours y": {"decode_tokens_per_s": 4.0},
                       "llama.cpp z": {"decode_tokens_per_s": 1.0}}}
    got = llama.versus(doc, "a", "b")
    assert got["code"]["value"] == pytest.approx(2.0) and got["code"]["lo"] == pytest.approx(2.0)
    assert got["chat"]["value"] == pytest.approx(1.0) and got["chat"]["hi"] == pytest.approx(1.0)
    assert got["all"]["value"] == pytest.approx(6.0 / 4.5) and got["all"]["lo"] < got["all"]["value"] < got["all"]["hi"]
    assert llama.fastest(doc, "ours") == "ours y" and llama.fastest(doc, "llama.cpp") == "llama.cpp z"
