"""The command line: bad parameters fail fast with a clear message; compare runs end to end on tiny models."""

from __future__ import annotations

import json

import pytest

from thesis_lib import cli, tiny


@pytest.mark.parametrize("argv, message", [
    (["compare", "--k", "0"], "--k must be >= 1"),
    (["compare", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["compare", "--modes", "baseline,warp"], "Unknown mode"),
    (["compare", "--categories", "poetry"], "Unknown category"),
    (["compare", "--target", "embedded:nope"], "Unknown model"),
])
def test_bad_parameters_fail_fast(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_existing_output_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    out.write_text("precious\n")
    assert cli.main(["compare", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == "precious\n"


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = capsys.readouterr().out
    for opt in ("--target", "--draft", "--k", "--max-new-tokens", "--modes", "--prompts", "--warmup", "--out"):
        assert opt in text


def test_compare_end_to_end_on_tiny_local_models(tmp_path, tok, capsys):
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "t")
    draft = tiny.save_tiny(tiny.noisy_copy(tiny.tiny_model(seed=0), 0.02), tok, tmp_path / "d")
    out = tmp_path / "records.jsonl"
    rc = cli.main(["compare", "--target", str(target), "--draft", str(draft), "--prompts", "2", "--max-new-tokens",
                   "12", "--k", "3", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)  # the last line of output is one JSON document
    summary = doc["summary"]
    assert set(summary) == {"baseline", "dense_ordinary", "dense_deferred", "hf_greedy", "hf_assisted"}
    for mode, s in summary.items():
        assert s["samples"] == 2
        assert s["matches_baseline"] == 2, mode  # every mode, ours and transformers', gives the same tokens
    assert summary["baseline"]["speedup_vs_baseline"] == 1.0
    assert 0 <= summary["dense_deferred"]["acceptance"] <= 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10
    base = {r["question_id"]: r["decode_tokens_per_s"] for r in records if r["mode"] == "baseline"}
    ratios = sorted(r["decode_tokens_per_s"] / base[r["question_id"]] for r in records if r["mode"] == "dense_ordinary")
    assert summary["dense_ordinary"]["speedup_vs_baseline"] == pytest.approx(sum(ratios) / 2)
