"""The live explorer driven in a real browser (test_explorer's driver): Voila serves the explorer's notebook, Chromium
moves its sliders and picks a mode, and each result is recorded with a screenshot."""

from __future__ import annotations

import json
import time
from pathlib import Path

from thesis_lib.book import live
from thesis_lib.book.browser import FLAGS, _chromium, _log_external


def drive_live_app(notebook: str | Path, out_dir: str | Path, *, timeout_ms: int = 180000) -> dict:
    """Serve the live explorer's ``notebook`` with Voila, move the K and probe sliders one step by keyboard and pick
    dense deferred, each time waiting for the result; returns the states seen, timings and off-localhost requests."""
    exe = _chromium()
    from playwright.sync_api import sync_playwright

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    proc, url = live.start(Path(notebook), log=out_dir / "voila.log")
    report: dict = {"url": url, "states": [], "external_requests": []}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            _log_external(page, report["external_requests"])
            t0 = time.monotonic()

            def record(name: str, selector: str) -> None:
                page.wait_for_selector(selector, timeout=timeout_ms)
                res = page.locator(".tc-result")
                shot = f"{len(report['states'])}-{name}.png"
                page.screenshot(path=str(out_dir / shot), full_page=True)
                report["states"].append({"name": name, "seconds": round(time.monotonic() - t0, 2),
                                         "mode": res.get_attribute("data-mode"), "k": res.get_attribute("data-k"),
                                         "probes": res.get_attribute("data-probes"),
                                         "lossless": res.get_attribute("data-lossless"),
                                         "text": res.inner_text()[:300], "screenshot": shot})

            page.goto(url, timeout=timeout_ms)
            record("first", ".tc-result")
            handles = page.locator(".widget-slider .noUi-handle")
            for i, (name, attr) in enumerate((("k", "data-k"), ("probes", "data-probes"))):
                value = int(report["states"][-1][name]) + 1
                t0 = time.monotonic()
                handles.nth(i).focus()
                page.keyboard.press("ArrowRight")
                record(f"{name}-{value}", f'.tc-result[{attr}="{value}"]')
            t0 = time.monotonic()
            page.get_by_role("button", name="dense, deferred").click()
            record("dense-deferred", '.tc-result[data-mode="dense_deferred"]')
            report["history_rows"] = page.locator(".tc-history tr").count() - 1
            browser.close()
    finally:
        live.stop(proc)
        report["server_stopped"] = proc.poll() is not None
    (out_dir / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report
