"""The documents against the tree: every dotted name of the library a page, notebook or README names exists, every
chapter page and notebook is in its folder's index, and the parameter files' comments name the precision
``DTYPE: auto`` runs."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _texts() -> dict[str, str]:
    out = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
           for p in [*ROOT.glob("book/*.md"), ROOT / "README.md", *ROOT.glob("docs/usage.md"), *ROOT.glob("*/README.md")]}
    for nb in ROOT.glob("notebooks/*.ipynb"):
        out[str(nb.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    return out


def _exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_library_name_the_documents_give_exists():
    missing = sorted({(doc, name) for doc, text in _texts().items()
                      for name in re.findall(r"\bthesis_lib(?:\.[A-Za-z_]\w*)+", text) if not _exists(name)})
    assert not missing


def test_every_chapter_page_and_notebook_is_in_its_index():
    pages = re.findall(r"file: (\w+)$", (ROOT / "_toc.yml").read_text(), re.M)
    book_index = (ROOT / "book" / "README.md").read_text()
    assert pages and all(f"`{p}`" in book_index for p in pages)
    notebooks = [p.stem for p in ROOT.glob("notebooks/*.ipynb")]
    index = (ROOT / "notebooks" / "README.md").read_text()
    assert len(notebooks) >= 9 and [n for n in notebooks if f"`{n}`" not in index] == []
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("##", 1)[0]
    chapters = sorted(n for n in notebooks if n.startswith("ch"))
    assert chapters[0] in layout and chapters[-1] in layout and "live_explorer" in layout


def test_every_committed_reference_file_is_described():
    described = (ROOT / "data" / "README.md").read_text()
    names = [p.name for p in (ROOT / "data" / "reference").iterdir()]
    names += [p.name for p in (ROOT / "data" / "reference" / "runs").iterdir()]
    assert [n for n in names if n not in described] == []


@pytest.mark.parametrize("name", ["cpu-embedded", "smoke", "rehearsal"])
def test_the_dtype_comment_names_what_auto_runs(name):
    """The comment beside ``DTYPE: auto`` names this CPU's resolution (whichever the CPU draws), and first the one
    the project's kernel picks on a CPU with VNNI or with AVX2 only."""
    from thesis_lib.models.auto import auto_precision

    line = next(l for l in (ROOT / "params" / f"{name}.yaml").read_text().splitlines() if l.startswith("DTYPE:"))
    comment = line.split("#", 1)[1]
    named = re.findall(r"int8-dynamic|int8-weights|bfloat16|float32", comment)
    assert named[0] == "int8-dynamic" and auto_precision()[0] in named


def test_every_work_in_the_bibliography_is_cited_where_its_idea_appears():
    bib = (ROOT / "book" / "references.bib").read_text()
    keys = re.findall(r"^@\w+\{([^,]+),", bib, re.M)
    pages = "\n".join(p.read_text() for p in ROOT.glob("book/*.md") if p.name != "README.md")
    cited = {k.strip() for group in re.findall(r"\{cite\}`([^`\n]+)`", pages) for k in group.split(",")}
    assert set(keys) == cited  # nothing listed that no page cites, nothing cited that is not listed
    for work in ("2211.17192", "2302.01318", "2305.09781", "2401.10774", "2401.15077", "2503.01840",
                 "2024.findings-acl.456", "2603.14591", "2502.14856", "2506.22694", "2510.13847"):
        assert work in bib
    assert "bibtex_bibfiles" in (ROOT / "_config.yml").read_text() and "{bibliography}" in (ROOT / "book" / "references.md").read_text()


def test_every_notebook_s_defaults_are_the_default_set_s_values():
    """A notebook run bare, or by papermill with ``-f params/cpu-embedded.yaml``, runs the default set."""
    import ast

    import yaml

    default = yaml.safe_load((ROOT / "params" / "cpu-embedded.yaml").read_text())
    for nb in sorted(ROOT.glob("notebooks/*.ipynb")):
        cell = next(c for c in json.loads(nb.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
        given = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse("".join(cell["source"])).body}
        assert {k: v for k, v in given.items() if k in default and v != default[k]} == {}, nb.name
        assert given["SET_NAME"] == "cpu-embedded"
        if any(given.get(k) == "auto" for k in ("PER_CATEGORY", "MAX_NEW_TOKENS", "ITERATIONS")):
            assert {"BUDGET_MINUTES", "COST_REFERENCE", "PER_CATEGORY", "MAX_NEW_TOKENS", "ITERATIONS"} <= set(given)


def test_every_book_notebook_takes_the_read_only_switch():
    """``thesis-lib book`` passes a notebook only the parameters its cell declares: a notebook without READ_ONLY
    would measure in a read-only build."""
    from thesis_lib.book import execute

    assert all("READ_ONLY" in execute.notebook_parameters(n) for n in execute.NOTEBOOKS)
