"""The JavaScript the built pages need offline (MathJax, require.js, the widget manager), vendored from the
npm registry: tarballs pinned by their sha512, cached once, unpacked into the book's ``_vendor/`` folder."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from ..errors import ConfigError
from ..models.cache import cache_dir, write_atomic

#: npm packages the pages need, pinned by the registry's sha512 integrity.
NPM = {
    "requirejs": ("2.3.8", "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw=="),
    "@jupyter-widgets/html-manager": ("1.0.15", "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA=="),
    "mathjax": ("3.2.2", "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="),
}
NPM_REGISTRY = os.environ.get("THESIS_LIB_NPM_REGISTRY", "https://registry.npmjs.org")


def _npm_tarball(package: str) -> bytes:
    version, integrity = NPM[package]
    cache = cache_dir() / "npm" / f"{package.replace('/', '__')}-{version}.tgz"
    want = base64.b64decode(integrity.split("-", 1)[1])
    if cache.is_file() and hashlib.sha512(cache.read_bytes()).digest() == want:
        return cache.read_bytes()
    url = f"{NPM_REGISTRY}/{package}/-/{package.split('/')[-1]}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read()
    except OSError as e:
        raise ConfigError(f"Cannot fetch {package}@{version} from the npm registry ({e}); the book's pages need it "
                          f"to show maths and widgets offline. Put the tarball at {cache} by hand.") from e
    if hashlib.sha512(data).digest() != want:
        raise ConfigError(f"{package}@{version} from {url} does not match its pinned sha512.")
    write_atomic(cache, data)
    return data


#: Loaded between require.js and the widget manager: maps the ``@jupyter-widgets`` modules to this script's folder,
#: where their fonts are found (require.js would resolve them relative to the page, where they are missing).
WIDGET_PATHS_JS = ("widget-paths.js", """(function () {
  var src = document.currentScript.src, base = src.slice(0, src.lastIndexOf("/"));
  require.config({paths: {"@jupyter-widgets/html-manager/dist": base, "@jupyter-widgets": base}});
  window.__jupyter_widgets_assets_path__ = base + "/";
})();
""")


def vendor(dest: Path) -> Path:
    """Unpack require.js, the widget manager and MathJax (its ``es5`` build, no speech rules) into ``dest``."""
    stamp = dest / ".vendored"
    pins = json.dumps([NPM, WIDGET_PATHS_JS], sort_keys=True)
    if stamp.is_file() and stamp.read_text() == pins:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    wanted = {"requirejs": lambda n: n == "package/require.js" and "require.js",
              "@jupyter-widgets/html-manager": lambda n: n.startswith("package/dist/") and not n.endswith(".map")
              and n[len("package/dist/"):],
              "mathjax": lambda n: n.startswith("package/es5/") and not n.startswith("package/es5/sre/")
              and "mathjax/" + n[len("package/es5/"):]}
    for package, pick in wanted.items():
        with tarfile.open(fileobj=io.BytesIO(_npm_tarball(package)), mode="r:gz") as tar:
            for member in tar.getmembers():
                target = pick(member.name) if member.isfile() else None
                if target:
                    out = dest / target
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tar.extractfile(member).read())
    (dest / WIDGET_PATHS_JS[0]).write_text(WIDGET_PATHS_JS[1], encoding="utf-8")
    stamp.write_text(pins)
    return dest
