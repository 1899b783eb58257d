"""The real-browser check of the built book (:func:`check`; the tests drive the live app with the same browser): the
system's headless Chromium (``CHROMIUM`` or ``chromium``, never Playwright's download) driven by Playwright."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

from ..errors import ConfigError

PAGES = ("index.html", "intro.html", "theory.html", "methods.html", "results.html", "conclusion.html", "beyond.html",
         "serving.html", "trees.html", "reproduce.html", "environment.html", "machine.html", "notebooks/ch2_theory.html",
         "notebooks/ch3_methods.html", "notebooks/ch4_results.html", "notebooks/ch5_conclusion.html",
         "notebooks/ch6_beyond.html", "notebooks/ch7_serving.html", "notebooks/ch8_trees.html",
         "notebooks/explorer.html")
#: Chromium flags for a closed network (no background connections, no component updates).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium() -> str:
    exe = chromium_path()
    if exe is None:
        raise ConfigError("No Chromium found (install Debian's `chromium`, or set CHROMIUM to its path).")
    return exe


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the built book silently, noting every path it could not find (``server.missing``)."""

    def log_message(self, *args):
        pass

    def log_request(self, code="-", size="-"):
        if isinstance(code, int) and 400 <= code < 500:
            self.server.missing.append(self.path.split("?")[0])


class _Server(http.server.ThreadingHTTPServer):
    missing: list

    def handle_error(self, request, client_address):
        pass  # a browser that closes a connection early is not the book's problem


def _serve(root: Path):
    handler = functools.partial(_Quiet, directory=str(root))
    server = _Server(("127.0.0.1", 0), handler)
    server.missing = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


_PAGE_JS = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const imgs = Array.from(document.querySelectorAll('main img, article img, .bd-article img'));
  const main = document.querySelector('main') || document.body, text = main.innerText;
  const article = document.querySelector('article.bd-article') || main, width = article.clientWidth;
  return {
    wide_tables: Array.from(article.querySelectorAll('table')).filter(t => t.scrollWidth > width + 1).length,
    progress_leaks: (text.match(/\\d+%\\||it\\/s\\]|s\\/gen|model shards|IPKernelApp|Traceback/g) || []).length,
    images: imgs.map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
    formulas: document.querySelectorAll('mjx-container').length,
    raw_tex: (text.match(/\\\\\\(|\\\\\\[|\\$\\$/g) || []).length,
    widgets: document.querySelectorAll('.jupyter-widgets, .widget-slider, .widget-vbox').length,
    title: document.title,
  };
}"""


def _log_external(page, sink: list) -> None:
    """Append to ``sink`` the URL of every request ``page`` makes to a host other than localhost."""
    page.on("request", lambda r: sink.append(r.url)
            if urlparse(r.url).hostname not in ("127.0.0.1", "localhost", None) and not r.url.startswith("data:")
            else None)


def check(html_dir: str | Path, out_dir: str | Path, pages=PAGES, timeout_ms: int = 30000) -> dict:
    """Serve ``html_dir`` on localhost and load each page (off-localhost requests, missing files, broken images,
    untypeset TeX, progress or kernel output in the text, and tables wider than the text column fail it); returns
    ``{"pages": {...}, "ok": bool}``, written with screenshots to ``out_dir``."""
    html_dir, out_dir = Path(html_dir), Path(out_dir)
    exe = _chromium()
    missing = [p for p in pages if not (html_dir / p).is_file()]
    if missing:
        raise ConfigError(f"Not in the built book: {', '.join(missing)}.")
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    server = _serve(html_dir)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    report = {"pages": {}, "ok": True}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            external: list[str] = []
            _log_external(page, external)
            for name in pages:
                external.clear()
                server.missing.clear()
                page.goto(base + name, wait_until="networkidle", timeout=timeout_ms)
                info = page.evaluate(_PAGE_JS)
                shot = out_dir / (name.replace("/", "__").replace(".html", ".png"))
                page.screenshot(path=str(shot), full_page=True)
                files = []
                for img in info["images"]:
                    src = img["src"] or ""
                    f = (html_dir / Path(name).parent / src.split("?")[0]).resolve() if not src.startswith("data:") else None
                    files.append({**img, "file_bytes": f.stat().st_size if f and f.is_file() else (None if f is None else 0)})
                bad_images = [i for i in files if not i["ok"] or i["file_bytes"] == 0]
                missing = sorted({m for m in server.missing if m != "/favicon.ico"})  # browsers ask for one
                entry = {"title": info["title"], "external_requests": list(external), "missing_files": missing,
                         "images": len(files),
                         "bad_images": bad_images, "formulas": info["formulas"], "raw_tex": info["raw_tex"],
                         "widgets": info["widgets"], "wide_tables": info["wide_tables"],
                         "progress_leaks": info["progress_leaks"], "screenshot": shot.name,
                         "screenshot_bytes": shot.stat().st_size}
                if page.locator(".tc-static-explorer").count():
                    entry["static_explorer"] = _drive_static_explorer(page)
                entry["ok"] = (not external and not missing and not bad_images and info["raw_tex"] == 0
                               and info["progress_leaks"] == 0 and info["wide_tables"] == 0)
                report["ok"] &= entry["ok"]
                report["pages"][name] = entry
            browser.close()
    finally:
        server.shutdown()
    (out_dir / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def _drive_static_explorer(page) -> list[dict]:
    """Move the static explorer's controls (last K, first probe count, dense), reading the shown state and its figure
    (points drawn, the K marked) each time."""
    box = ".tc-static-explorer"

    def read() -> dict:
        el, fig = page.locator(".tc-static-state"), page.locator(f"{box} .tc-static-figure")
        chosen = fig.locator("circle.tc-chosen")
        return {**{a: el.get_attribute(f"data-{a}") for a in ("k", "probes", "mode", "found")},
                "text": el.inner_text()[:600], "figure_points": fig.get_attribute("data-points"),
                "figure_chosen_k": chosen.get_attribute("data-k") if chosen.count() else None,
                "figure_bars": fig.locator("line.tc-bar").count(),
                "interval": el.locator(".tc-interval").inner_text() if el.locator(".tc-interval").count() else None}

    seen = [read()]
    page.select_option(f"{box} select[name=k]", page.locator(f"{box} select[name=k] option").all_inner_texts()[-1])
    seen.append(read())
    page.select_option(f"{box} select[name=probes]",
                       page.locator(f"{box} select[name=probes] option").all_inner_texts()[0])
    seen.append(read())
    page.check(f"{box} input[value=dense_deferred]")
    seen.append(read())
    return seen
