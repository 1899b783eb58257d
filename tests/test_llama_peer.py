"""llama.cpp as a peer, below its server: the decode speed as this project counts it, the tuning's choice per kind
of speculative decoding, and where two texts part; on constructed results, no server started."""

from __future__ import annotations

import contextlib

import pytest

from thesis_studies.peers import llama, llama_tables


def test_decode_speed_counts_the_tokens_after_the_first_over_the_seconds_after_it():
    """llama.cpp's first token comes with the prefill: 9 and 4 tokens after it in 1.0 and 0.5 s."""
    results = [{"tokens": list(range(10)), "decode_s": 1.0}, {"tokens": list(range(5)), "decode_s": 0.5}]
    assert llama.decode_speed(results) == pytest.approx(13 / 1.5)


def test_the_server_is_built_without_amx_where_the_cpu_has_it_and_as_before_elsewhere(monkeypatch):
    """On a CPU with AMX the server is compiled with ggml's AMX products switched off (they crash at the first product
    on this project's AMX Xeon) and built in a folder of its own; on one without, nothing is added and the folder is
    the one its earlier builds used (keyed by the CPU's flags alone)."""
    import hashlib

    from thesis_lib.models import cpu

    plain = {"avx2", "avx512f", "avx512_vnni"}
    monkeypatch.setattr(cpu, "cpu_flags", lambda: plain)
    assert llama.compile_flags() == []
    before = hashlib.sha256(" ".join(sorted(plain)).encode()).hexdigest()[:8]
    assert llama.server_path().parts[-4].endswith(before)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: plain | {"amx_tile", "amx_int8", "amx_bf16"})
    flags = llama.compile_flags()
    assert flags == ["-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                     "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]
    with_amx = hashlib.sha256(" ".join(sorted(plain | {"amx_tile", "amx_int8", "amx_bf16"})).encode()).hexdigest()[:8]
    assert not llama.server_path().parts[-4].endswith(with_amx)  # not the folder of a build with AMX


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
    got = llama_tables.versus(doc, "a", "b")
    assert got["code"]["value"] == pytest.approx(2.0) and got["code"]["lo"] == pytest.approx(2.0)
    assert got["chat"]["value"] == pytest.approx(1.0) and got["chat"]["hi"] == pytest.approx(1.0)
    assert got["all"]["value"] == pytest.approx(6.0 / 4.5) and got["all"]["lo"] < got["all"]["value"] < got["all"]["hi"]
    assert llama_tables.fastest(doc, "ours") == "ours y" and llama_tables.fastest(doc, "llama.cpp") == "llama.cpp z"


def _doc(ours_s: list[float], cats: list[str], capability: str = "AVX2") -> dict:
    """Prompts of 10 tokens after the first: llama.cpp decodes each in 1 s plain, 2 s drafting and 0.8 s by n-grams;
    ours in 1.5 s target-only and in ``ours_s`` with FlashHead deferred."""
    settings = {"llama.cpp target-only": [1.0] * len(cats), "llama.cpp speculative": [2.0] * len(cats),
                "llama.cpp n-gram": [0.8] * len(cats), "ours target-only": [1.5] * len(cats),
                "ours FlashHead deferred": ours_s}
    rows = [{name: {"tokens": list(range(11)), "decode_s": secs[i]} for name, secs in settings.items()}
            for i in range(len(cats))]
    summary = {name: {"decode_tokens_per_s": llama.decode_speed([r[name] for r in rows])} for name in settings}
    summary["llama.cpp speculative"]["equal_to_llama_target_only"] = len(cats) - 1
    return {"rows": rows, "categories": cats, "summary": summary, "prompts": len(cats), "processor": "CPU",
            "cpu_capability": capability, "ours_precision": "int8-dynamic",
            "tuning": {"best": {"speculative": {"draft_max": 8, "draft_min": 0, "draft_p_min": 0.5},
                                "n-gram": {"type": "ngram-mod"}}},
            "bytes_per_step": {"llama.cpp target": 1e9, "ours target": 1.5e9}}


def test_the_book_reads_each_engine_at_its_best_and_says_which_is_faster():
    """FlashHead deferred at 0.4 s a prompt on code and 0.7 s on chat against llama.cpp's n-grams at 0.8 s: faster
    over all prompts (6.6 s against 9.6 s), 2x on code and 1.14x on chat; where every prompt is slower,
    llama.cpp is faster; where they split evenly, the interval holds 1."""
    cats = ["code"] * 6 + ["chat"] * 6
    faster = _doc([0.4] * 6 + [0.7] * 6, cats)
    g = llama_tables.book_glued([(faster, "label")])
    assert (g["llama_ours"], g["llama_theirs"]) == ("ours FlashHead deferred", "llama.cpp n-gram")
    assert g["llama_ratio"] == pytest.approx(9.6 / 6.6) and g["llama_lo"] < g["llama_ratio"] < g["llama_hi"]
    assert g["llama_spec_over_plain"] == pytest.approx(0.5) and g["llama_ngram_over_plain"] == pytest.approx(1.25)
    assert (g["llama_step_ms_ours"], g["llama_step_ms_theirs"]) == (pytest.approx(150.0), pytest.approx(100.0))
    assert g["llama_byte_ratio"] == pytest.approx(1.5) and g["llama_spec_equal"] == "11 of 12"
    assert g["llama_spec_setting"] == "up to 8 draft tokens, each above probability 0.5"
    slower = _doc([0.9] * 12, cats, capability="AVX-512")
    assert llama_tables.verdict(g["llama_lo"], g["llama_hi"]) == "this project at its best is faster"
    lo, hi = (llama_tables.book_glued([(slower, "")])[k] for k in ("llama_lo", "llama_hi"))
    assert llama_tables.verdict(lo, hi) == "llama.cpp at its best is faster"
    even = _doc([0.4, 1.2] * 6, cats)  # 0.8 s on average, as llama.cpp's n-grams
    assert "cannot be told apart" in llama_tables.verdict(*(llama_tables.book_glued([(even, "")])[k] for k in ("llama_lo", "llama_hi")))
    table = llama_tables.book_rows([(faster, ""), (slower, "")])
    assert list(table["machine, ours in"]) == ["CPU (AVX2), int8-dynamic", "CPU (AVX-512), int8-dynamic"]
    assert g["llama_kinds"] == "CPU (AVX2) with ours in int8-dynamic"
    assert list(table["verdict"]) == ["this project at its best is faster", "llama.cpp at its best is faster"]
    assert table.loc[1, "ours FlashHead deferred"] == pytest.approx(10 / 0.9)
    both = llama_tables.category_rows([(faster, ""), (slower, "")])
    assert list(both.columns) == ["machine, ours in", "category", "ours / llama.cpp", "its drafting / its plain"]
    cat = both.set_index(["machine, ours in", "category"])
    assert cat.loc[("CPU (AVX2), int8-dynamic", "code"), "ours / llama.cpp"] == "2.00x [2.00, 2.00]"
    assert cat.loc[("CPU (AVX2), int8-dynamic", "chat"), "ours / llama.cpp"] == "1.14x [1.14, 1.14]"
    assert cat.loc[("CPU (AVX2), int8-dynamic", "chat"), "its drafting / its plain"] == "0.50x [0.50, 0.50]"
    assert {c for k, c in cat.index if k == "CPU (AVX-512), int8-dynamic"} == {"all", "code", "chat"} and len(cat) == 6


def test_the_book_without_a_llama_document_says_so():
    g = llama_tables.book_glued([])
    assert g["llama_ours"] == "not measured" and llama_tables.verdict(g["llama_lo"], g["llama_hi"]) == "not measured"
    assert "none named" in llama_tables.book_rows([]).iloc[0, 0] and "none named" in llama_tables.category_rows([]).iloc[0, 0]


def test_the_readme_s_llama_rows_are_what_their_documents_say():
    """Each README row that links a llama-bench document is that document's row, recomputed from its samples."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = re.findall(r"^\| \[[^]]+\]\((data/reference/llama-bench-[^)]+)\) .*$",
                      (root / "README.md").read_text(encoding="utf-8"), re.M)
    assert rows, "the README links no llama-bench document"
    for path in rows:
        doc = json.loads((root / path).read_text(encoding="utf-8"))
        assert llama_tables.readme_row(doc, path) in (root / "README.md").read_text(encoding="utf-8")
