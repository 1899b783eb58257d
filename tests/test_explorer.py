"""The live explorer: the panel's queueing (no browser), and the Voila app driven by a real browser (issue 20)."""

from __future__ import annotations

import json
import time

import pytest

from thesis_lib.book import browser, live, params, widgets
from thesis_lib.errors import ConfigError

import live_browser


def _smoke_params():
    values = {**params.load_parameters("smoke"), "SET_NAME": "smoke"}
    return params.Params.from_namespace(values).check()


def test_moves_during_a_generation_are_coalesced_and_remembered():
    """Settings changed while a generation runs queue; when it ends only the latest runs (not one per move), and
    the history keeps both, newest first; target-only decoding runs once per prompt and is reused."""
    p = _smoke_params()
    panel = widgets.live_panel(p)
    assert panel.idle(120), panel.status.value
    assert panel.runs == 1 and panel.p.max == 17 and panel.p.value == 3 and panel.header.value.count("smoke")
    baseline = panel.baselines[0]
    panel._busy = True  # hold the worker as a running generation would, then move three controls
    panel.k.value, panel.p.value, panel.k.value = 5, 7, 2
    assert "queued next" in panel.status.value and "K = 2" in panel.status.value
    panel._busy = False
    assert panel.idle(60)
    assert panel.runs == 2 and [(h["k"], h["probes"]) for h in panel.history] == [(2, 7), (3, 3)]
    assert panel.baselines[0] is baseline and all(h["lossless"] for h in panel.history)
    assert 'data-k="2"' in panel.result.value and 'data-probes="7"' in panel.result.value


def test_a_new_head_setting_is_warmed_untimed_once(monkeypatch):
    """The first generation at a (mode, probes) setting first pays the head's compilation in an untimed warm-up;
    a K move at the same setting does not repeat it, a probe move does."""
    flags = []
    real = widgets.generate_marked

    def spy(*args, **kw):
        flags.append((kw["k"], kw["probes"], kw["warmup"]))
        return real(*args, **kw)

    monkeypatch.setattr(widgets, "generate_marked", spy)
    panel = widgets.live_panel(_smoke_params())
    assert panel.idle(120)
    panel.k.value = 5
    assert panel.idle(60)
    panel.p.value = 7
    assert panel.idle(60)
    assert flags == [(3, 3, True), (5, 3, False), (5, 7, True)]


def test_a_setting_tried_again_shows_its_spread_and_target_only_decoding_is_warmed_first(monkeypatch):
    """The history gives a setting tried twice or more its median speed ratio and range over its repetitions (once
    is no interval); the first target-only generation of a prompt is preceded by an untimed one."""
    assert widgets._repeated([1.2]) == "" and widgets._repeated([]) == ""
    assert widgets._repeated([1.3, 1.1, 1.2]) == "1.20x (1.10-1.30x, 3 runs)"
    calls = []
    real = widgets.greedy_generate
    monkeypatch.setattr(widgets, "greedy_generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    panel = widgets.live_panel(_smoke_params())
    assert panel.idle(120)
    assert len(calls) == 2  # the untimed warm-up, then the timed baseline
    panel.k.value = 5
    assert panel.idle(60)
    panel.k.value = 3
    assert panel.idle(60)
    assert len(calls) == 2 and [h["k"] for h in panel.history] == [3, 5, 3]
    ratios = [h["ratio"] for h in panel.history if h["k"] == 3]
    assert widgets._repeated(ratios) in panel.table.value and "2 runs" in panel.table.value


def test_every_mode_of_the_panel_runs_and_is_lossless():
    p = _smoke_params()
    panel = widgets.live_panel(p)
    assert panel.idle(120)
    for mode in widgets.EXPLORER_MODES[1:]:
        panel.mode.value = mode
        assert panel.idle(60), mode
        assert f'data-mode="{mode}"' in panel.result.value and 'data-lossless="True"' in panel.result.value, mode
    assert panel.runs == len(widgets.EXPLORER_MODES)


def test_the_tree_width_control_shapes_the_tree_modes_only():
    """The width slider is live for the tree modes and idle otherwise; a width move reruns the tree at that width
    (a tree K deep and that many nodes per depth), lossless, and the history remembers it."""
    panel = widgets.live_panel(_smoke_params())
    assert panel.idle(120) and panel.w.disabled
    panel.mode.value = "flash_tree"
    assert panel.idle(60) and not panel.w.disabled
    panel.w.value = 3
    assert panel.idle(60)
    assert 'data-width="3"' in panel.result.value and 'data-lossless="True"' in panel.result.value
    assert [(h["mode"], h["width"]) for h in panel.history[:2]] == [("flash_tree", 3), ("flash_tree", 2)]
    panel.mode.value = "dense_deferred"
    assert panel.idle(60) and panel.w.disabled and 'data-width=""' in panel.result.value


def test_a_bad_parameter_set_fails_before_any_server_starts():
    with pytest.raises(ConfigError, match="Unknown parameter set"):
        live.prepare("no-such-set")
    with pytest.raises(ConfigError, match="K must be"):
        live.prepare("smoke", {"K": 0})


def test_the_app_notebook_names_its_set():
    nb = json.loads(live.prepare("smoke").read_text(encoding="utf-8"))
    injected = next(c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", []))
    assert "SET_NAME = \"smoke\"" in "".join(injected["source"]) and "TARGET = \"tiny:target\"" in "".join(injected["source"])


def test_the_live_app_in_a_real_browser():
    """Voila serves the panel on the smoke set; headless Chromium moves the K slider and the probe slider and
    picks another mode, and each time the shown result follows (K, probes, mode in the result's header and
    attributes; the output equals target-only output); no request leaves localhost; the server is stopped."""
    if browser.chromium_path() is None:
        pytest.skip("no Chromium on this machine (make test installs Debian's chromium where it can)")
    shots = params.ROOT / "build" / "smoke" / "screenshots-live"
    report = live_browser.drive_live_app(live.prepare("smoke"), shots)
    assert report["external_requests"] == [] and report["server_stopped"]
    states = report["states"]
    assert [s["k"] for s in states] == ["3", "4", "4", "4"]
    assert [s["probes"] for s in states] == ["3", "3", "4", ""]
    assert [s["mode"] for s in states] == ["flash_deferred"] * 3 + ["dense_deferred"]
    assert all(s["lossless"] == "True" for s in states) and "K = 4" in states[1]["text"]
    assert report["history_rows"] >= 4 and all((shots / s["screenshot"]).stat().st_size > 10_000 for s in states)
