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


def test_the_python_example_runs_on_the_embedded_pair(real_pair, monkeypatch, capsys):
    from thesis_lib.models import loading

    code = _between("```python\n", "```")
    assert "load_pair()" in code and "max_new_tokens=32" in code
    monkeypatch.setattr(loading, "load_pair", lambda: real_pair)  # the session's pair, not a second load
    exec(compile(code.replace("max_new_tokens=32", "max_new_tokens=8"), "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["baseline", "flash_deferred"]
    assert lines[0].endswith("acceptance None")  # target-only decoding drafts nothing
    acceptance = float(lines[1].rsplit(" ", 1)[1])
    assert 0 <= acceptance <= 1 and float(lines[1].split()[1]) > 0


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
