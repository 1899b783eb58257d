"""tools/glued.py: every glued value of an executed book, and the comparison of two builds (the check that a change
of structure left the book's values as they were), on constructed notebooks."""

import importlib.util
import json

from thesis_lib.book.params import ROOT

_spec = importlib.util.spec_from_file_location("glued", ROOT / "tools" / "glued.py")
glued = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glued)


def _record(name, mime, value):
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": glued.PREFIX}},
            "data": {glued.PREFIX + mime: value}}


def _book(tmp_path, folder, cells):
    nbs = tmp_path / folder / "notebooks"
    nbs.mkdir(parents=True)
    for stem, outputs in cells.items():
        (nbs / f"{stem}.ipynb").write_text(json.dumps({"cells": [
            {"cell_type": "code", "outputs": outputs},
            {"cell_type": "code", "outputs": [{"output_type": "stream", "text": "not glued"}]}]}))
    return tmp_path / folder


def test_a_snapshot_holds_each_glued_value_by_notebook_and_name(tmp_path):
    book = _book(tmp_path, "a", {"ch4": [_record("speedup", "text/plain", "1.53"),
                                         _record("table", "text/html", ["<table>", "</table>"]),
                                         _record("figure", "image/png", "iVBOR"),
                                         {**_record("styled", "text/plain", "<Styler at 0x7f19>"),
                                          "data": {glued.PREFIX + "text/plain": "<Styler at 0x7f19>",
                                                   glued.PREFIX + "text/html": '<table id="T_a61e0"><th id="T_a61e0_l0">'
                                                                               '1.53</th></table>'}}],
                                 "ch5": [_record("said", "text/plain", "'faster'")]})
    snap = glued.snapshot(book)
    assert snap["ch5"] == {"said": "'faster'"}
    assert snap["ch4"]["speedup"] == "1.53" and snap["ch4"]["table"] == "<table></table>"
    assert snap["ch4"]["figure"].startswith("image/png sha256:")
    # the table, not its repr's memory address, and without the random id a Styler gives each rendering
    assert snap["ch4"]["styled"] == '<table id="T_"><th id="T__l0">1.53</th></table>'


def test_two_builds_compare_equal_only_when_every_value_is_the_same(tmp_path, capsys):
    same = {"ch4": [_record("speedup", "text/plain", "1.53"), _record("said", "text/plain", "'faster'")]}
    a, b = _book(tmp_path, "a", same), _book(tmp_path, "b", same)
    before = tmp_path / "before.json"
    before.write_text(json.dumps(glued.snapshot(a)))
    assert glued.main(["diff", str(before), str(b)]) == 0
    assert "identical: 2 values in 1 notebooks" in capsys.readouterr().out
    c = _book(tmp_path, "c", {"ch4": [_record("speedup", "text/plain", "1.54")]})  # one changed, one gone
    assert glued.main(["diff", str(a), str(c)]) == 1
    out = capsys.readouterr().out
    assert "ch4: 2 and 1 values, 2 differing" in out and "speedup: '1.53' -> '1.54'" in out
    assert "said: \"'faster'\" -> '(absent)'" in out and "DIFFERENT" in out
