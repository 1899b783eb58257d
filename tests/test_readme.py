"""The README's claims, checked: its results table is what ``thesis-lib results`` prints from the committed data,
its Python example runs on the embedded pair, CI runs its test command, and it stays a front door (short, its
two commands on the first screen, no commit hashes outside the results table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from thesis_lib import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _between(start: str, end: str, text: str = README) -> str:
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def test_the_results_table_is_what_the_command_prints(capsys):
    assert cli.main(["results"]) == 0
    assert capsys.readouterr().out.strip() == _between("<!-- results:begin -->", "<!-- results:end -->").strip()


@pytest.mark.real
def test_the_python_example_runs_on_the_embedded_pair(real_pair, monkeypatch, capsys):
    """The example, run as written (8 new tokens instead of 32), prints each mode with the acceptance the library's
    own runner gives for the same prompt, and nothing for target-only decoding, which drafts nothing."""
    from thesis_lib.bench.prompts import encode
    from thesis_lib.bench.runner import Runner
    from thesis_lib.heads.for_model import flashhead_for
    from thesis_lib.models import loading

    code = _between("```python\n", "```")
    assert "load_pair()" in code and "max_new_tokens=32" in code
    monkeypatch.setattr(loading, "load_pair", lambda: real_pair)  # the session's pair, not a second load
    exec(compile(code.replace("max_new_tokens=32", "max_new_tokens=8"), "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["baseline", "flash_deferred"]
    assert lines[0].endswith("acceptance None")  # target-only decoding drafts nothing
    target, draft = real_pair
    prompt = re.search(r'encode\(target.tokenizer, "([^"]+)"\)', code).group(1)
    runner = Runner(target, draft, k=4, max_new_tokens=8, flash_head=flashhead_for(draft))
    want = runner.run("flash_deferred", encode(target.tokenizer, prompt)).stats.acceptance
    assert lines[1].endswith(f"acceptance {want}") and float(lines[1].split()[1]) > 0


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in _between("```bash\n", "```") and re.search(r"^make test\b", ci, re.M)


def test_the_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 200
    first_screens = "\n".join(lines[:60])
    assert "make book" in first_screens and "make test" in first_screens and "| Finding |" in first_screens
    outside = README.replace(_between("<!-- results:begin -->", "<!-- results:end -->"), "")
    assert not re.findall(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", outside)
    assert not re.search(r"\bissue \d+", outside, re.I)  # the tracker's numbers mean nothing to a reader


def _pooled(rows: list[dict], mode: str) -> tuple[float, dict]:
    """A mode's decode tokens per second over all its samples, and per prompt (tokens, seconds), from raw records."""
    mine = [r for r in rows if r["mode"] == mode]
    per = {}
    for r in mine:
        t, s = per.get(r["question_id"], (0, 0.0))
        per[r["question_id"]] = (t + r["decode_tokens"], s + r["decode_s"])
    return sum(r["decode_tokens"] for r in mine) / sum(r["decode_s"] for r in mine), per


def _settings() -> list[tuple[list[tuple], str, Path]]:
    """The README's results block: per setting (the default, then the thesis' regime) its columns of the one
    table, the block's text from that setting's paragraph on, and the committed run data it shows."""
    from thesis_lib.analysis import headline

    block = _between("<!-- results:begin -->", "<!-- results:end -->")
    cell = r" ([0-9.]+)x \| ([0-9.]+)-([0-9.]+)x \| (\w+) \|"
    rows = re.findall(r"^\| ([^|]+\(Table [^|]+\)) \| ([0-9.]+)x \|" + cell + cell + "$", block, re.M)
    default, regime = (block.index(f"**In {headline.SETTINGS[k]}**") for k in ("default", "regime"))
    return [([(r[0], r[1], *r[2:6]) for r in rows], block[default:regime], headline.COMMITTED),
            ([(r[0], r[1], *r[6:10]) for r in rows], block[regime:], headline.REGIME)]


@pytest.mark.parametrize("setting", [0, 1], ids=["default", "regime"])
def test_every_verdict_of_the_results_table_follows_from_the_raw_samples(setting):
    """Each row of the README's table, in each setting's columns (the default, the thesis' regime), recomputed
    from that setting's committed raw files, not from the library's tables: the ratio (pooled decode tokens /
    decode seconds of the samples; the model bench's mean latencies), a bootstrap over prompts written here (its
    bounds within 0.03 of the table's, whose verdicts are then judged from the table's bounds), the words
    reproduced / larger / smaller against the thesis' value in its data file, and the setting's count sentence."""
    import json

    import numpy as np

    from thesis_lib.analysis import headline

    rows, text, folder = _settings()[setting]
    raw = {kind: [json.loads(line) for line in next(folder.glob(f"*-{kind}-*/samples.jsonl")).read_text().splitlines()]
           for kind in ("bench", "profile")}
    doc = json.loads(next(folder.glob("*-model-bench-*.json")).read_text())
    thesis = json.loads((ROOT / "data" / "thesis_reference.json").read_text())["tables"]
    speedup = {t: {r[0]: r[-1] for r in thesis[t]["rows"]} for t in ("4.2", "4.4", "4.6", "4.10")}
    tok_s = {r[0]: r[1] for r in thesis["4.7"]["rows"]}
    expected = [  # (thesis value, kind of data, mode a, mode b): the README's rows, in order
        (speedup["4.2"]["Dense LM head vs. FlashHead"], "head", "dense", "flashhead"),
        (speedup["4.4"]["Dense model vs. Flash model"], "step", "dense", "flashhead"),
        (speedup["4.6"]["Baseline vs. dense draft"], "bench", "baseline", "dense_ordinary"),
        (speedup["4.6"]["Baseline vs. FlashHead draft"], "bench", "baseline", "flash_ordinary"),
        (speedup["4.6"]["Dense draft vs. FlashHead draft"], "bench", "dense_ordinary", "flash_ordinary"),
        (speedup["4.10"]["Base only vs. dense deferred"], "bench", "baseline", "dense_deferred"),
        (speedup["4.10"]["Base only vs. FlashHead deferred"], "bench", "baseline", "flash_deferred"),
        (speedup["4.10"]["Dense deferred vs. FlashHead deferred"], "bench", "dense_deferred", "flash_deferred"),
        (tok_s["Dense shared"] / tok_s["Dense draft"], "profile", "dense_ordinary", "shared_ordinary"),
    ]
    assert len(rows) == len(expected) == len(headline.FINDINGS)
    df = headline.findings(*headline.committed(folder))
    rng = np.random.default_rng(1)
    for (finding, th, ours, lo_s, hi_s, against), (value, kind, a, b), (_, r) in zip(rows, expected, df.iterrows()):
        assert float(th) == round(value, 3), finding
        if kind in ("head", "step"):
            point = doc[kind]["stats"][a]["mean_ms"] / doc[kind]["stats"][b]["mean_ms"]
        else:
            (pa, per_a), (pb, per_b) = _pooled(raw[kind], a), _pooled(raw[kind], b)
            point = pb / pa
            prompts = sorted(per_a)
            ta, sa = np.array([per_a[q] for q in prompts]).T
            tb, sb = np.array([per_b[q] for q in prompts]).T
            draws = rng.integers(0, len(prompts), (4000, len(prompts)))
            boot = (tb[draws].sum(1) / sb[draws].sum(1)) / (ta[draws].sum(1) / sa[draws].sum(1))
            mine = np.percentile(boot, [2.5, 97.5])
            assert abs(mine[0] - r["95 % low"]) < 0.03 and abs(mine[1] - r["95 % high"]) < 0.03, finding
        assert float(ours) == round(point, 2), finding
        lo, hi = r["95 % low"], r["95 % high"]
        assert float(lo_s) == pytest.approx(lo, abs=0.006) and float(hi_s) == pytest.approx(hi, abs=0.006)
        assert against == ("reproduced" if lo <= value <= hi else "larger" if lo > value else "smaller"), finding
        reversed_ = not lo <= 1 <= hi and (lo > 1) != (value > 1)
        assert (finding[0].lower() + finding[1:] in text.split("reversed here:")[-1]) == reversed_, finding
    n = sum(rw[5] == "reproduced" for rw in rows)
    assert f"{n} of {len(rows)} of the thesis' values reproduced here" in text
