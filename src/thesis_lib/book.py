"""The book's machinery: parameter sets, the heavy results the chapter notebooks share, papermill, staging
and the Jupyter Book build (``thesis-lib book`` / ``make book``).

What this module knows:

- **Parameter sets** (``params/<name>.yaml``): ``cpu-embedded`` (the default: the embedded pair on a CPU),
  ``smoke`` (tiny random models, for the tests) and ``gpu-thesis`` (the thesis' Qwen3 pair on two GPUs).
  Every notebook declares the UPPER_CASE names it uses in its ``parameters`` cell; :func:`execute` passes
  each notebook only the names it declares.
- **Shared results** (:class:`Params`, :func:`main_run`, :func:`profile_run`, :func:`sweep_runs`,
  :func:`model_bench`): each is a run folder or JSON document under ``RUNS_DIR`` whose name carries a hash
  of its configuration, so the same parameters find the same results (computed once, by whichever
  notebook asks first) and other parameters never overwrite them. One process loads the pair once
  (:func:`pair`) and shares it between runs.
- **Execution** (:func:`execute`): papermill runs the notebooks, heavy chapter first, into the staged book;
  a notebook whose source, parameters and library code are unchanged since its last execution is reused.
- **Staging and build** (:func:`stage`, :func:`build`): chapter prose (``book/``), the top-level
  ``_config.yml`` and ``_toc.yml``, the executed notebooks and their figures are put together in
  ``build/<set>/book`` with MathJax, require.js and the widget manager vendored from the npm registry
  (:func:`vendor`), then ``jupyter-book build -W -n`` renders it without executing anything.

It knows nothing about what a chapter shows: that is the notebooks' (figures: :mod:`thesis_lib.figures`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import models, protocol
from .errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PARAMS_DIR = ROOT / "params"
NOTEBOOK_DIR = ROOT / "notebooks"
PROSE_DIR = ROOT / "book"
NOTEBOOKS = ("ch2_theory", "ch3_methods", "ch4_results", "ch5_conclusion", "ch6_beyond", "explorer")
#: Chapter 4 runs the benchmarks the others read, so it goes first.
RUN_ORDER = ("ch4_results", "ch2_theory", "ch3_methods", "ch5_conclusion", "ch6_beyond", "explorer")
DEFAULT_SET = "cpu-embedded"


# --- parameter sets -------------------------------------------------------------------------------------

def parameter_sets() -> list[str]:
    return sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))


def load_parameters(name: str) -> dict:
    """A named parameter set (``params/<name>.yaml``) or a YAML file's path; UPPER_CASE names only."""
    import yaml

    path = Path(name)
    if not path.is_file():
        path = PARAMS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"Unknown parameter set {name!r}; use one of {', '.join(parameter_sets())} or a YAML file.")
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    bad = [k for k in doc if not (isinstance(k, str) and k.isupper())]
    if bad:
        raise ConfigError(f"{path.name}: parameter names are UPPER_CASE ({', '.join(map(str, bad))} are not).")
    return doc


@dataclass
class Params:
    """The parameters every chapter shares (the notebooks' UPPER_CASE names, lower-cased here)."""

    set_name: str = DEFAULT_SET
    target: str = models.DEFAULT_TARGET
    draft: str = models.DEFAULT_DRAFT
    device: str = "cpu"
    draft_device: str | None = None
    dtype: str = "auto"
    k: int = 4
    k_sweep: list = field(default_factory=lambda: [1, 2, 4, 6])
    max_new_tokens: int = 32
    modes: list = field(default_factory=lambda: ["baseline", "dense_ordinary", "flash_ordinary", "dense_deferred",
                                                 "flash_deferred", "hf_assisted"])
    prompt_file: str = "project"
    per_category: int | None = 1
    prompts: int | None = None
    sweep_prompts: int = 3
    iterations: int = 1
    warmup: int = 1
    seed: int = 0
    probes: int | None = None
    clusters: int | None = None
    assets: str | None = None
    kmeans_iterations: int = 20
    flash_path: str = "auto"
    state_tokens: int = 32
    example_prompt: int = 0
    head_reps: int = 3
    step_reps: int = 3
    runs_dir: str = "runs/book"
    # the "Beyond the thesis" chapter (issue 6)
    beyond_modes: list = field(default_factory=lambda: ["baseline", "flash_deferred", "adaflash_deferred",
                                                        "freq_deferred", "ngram_deferred", "hybrid_deferred",
                                                        "flash_deferred_hk", "flash_deferred_ck", "sample_dense",
                                                        "sample_flash"])
    beyond_k_sweep: list = field(default_factory=lambda: [2, 3, 6, 8])
    calibration_per_category: int = 3
    adaptive_margins: list = field(default_factory=lambda: [0.06, 0.08, 0.1, 0.12, 0.14, 0.16])
    adaptive_min_probes: int = 8
    codesign_cluster_sizes: list = field(default_factory=lambda: [64, 32, 16])
    k_max: int = 12
    stop_below_grid: list = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    temperature: float = 0.7
    top_k: int | None = 20
    top_p: float | None = 0.8
    sampling_check_file: str | None = "data/reference/sampling-check-d0.01.json"
    sampling_delta: float = 0.01
    fig_dir: str = "figures"
    progress: bool = True

    @classmethod
    def from_namespace(cls, ns: dict) -> "Params":
        """From a notebook's globals: every UPPER_CASE name that is a field here (``SET_NAME`` and so on)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k.lower(): v for k, v in ns.items() if k.isupper() and k.lower() in names})

    def check(self) -> "Params":
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"K must be an integer >= 1 (got {self.k!r}).")
        if any(not isinstance(k, int) or k < 1 for k in self.k_sweep):
            raise ConfigError(f"K_SWEEP values must be integers >= 1 (got {self.k_sweep!r}).")
        return self

    def bench(self, **kw) -> protocol.BenchConfig:
        base = dict(out=self.runs_dir, target=self.target, draft=self.draft, device=self.device,
                    draft_device=self.draft_device, dtype=self.dtype, k=self.k, max_new_tokens=self.max_new_tokens,
                    modes=tuple(self.modes), prompt_file=self.prompt_file, per_category=self.per_category,
                    prompts=self.prompts, iterations=self.iterations, warmup=self.warmup, seed=self.seed,
                    probes=self.probes, clusters=self.clusters, assets=self.assets, flash_path=self.flash_path,
                    kmeans_iterations=self.kmeans_iterations)
        base.update(kw)
        return protocol.BenchConfig(**base)


def params(ns: dict) -> Params:
    """The chapter notebooks' one call: their parameters as :class:`Params`, checked."""
    return Params.from_namespace(ns).check()


def selected_prompts(p: Params):
    """The prompts of the main run (prompt file, per category, count), without loading any model."""
    from .prompts import load_prompts, select

    return select(load_prompts(p.prompt_file), None, p.prompts, p.per_category)


def _digest(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _named(cfg: protocol.BenchConfig, set_name: str, kind: str) -> protocol.BenchConfig:
    doc = cfg.identity()
    doc.pop("name"), doc.pop("out")
    cfg.name = f"{set_name}-{kind}-{_digest(doc)}"
    return cfg


# --- shared results -------------------------------------------------------------------------------------

_PAIRS: dict = {}


def pair(p: Params, flash: bool = True):
    """``(target, draft, flash_head)`` for these parameters, loaded once per process."""
    key = (p.target, p.draft, p.device, p.draft_device, p.dtype)
    if key not in _PAIRS:
        _PAIRS.clear()
        target, draft = models.load_pair(p.target, p.draft, device=p.device, draft_device=p.draft_device,
                                         dtype=p.dtype, progress=p.progress)
        _PAIRS[key] = [target, draft, None]
    entry = _PAIRS[key]
    if flash and entry[2] is None:
        entry[2] = protocol.flash_head(p.bench(), entry[1])
    if flash:  # a run with other probes may have changed the shared head: back to these parameters'
        from .flashhead import default_probes

        entry[2].with_probes(p.probes if p.probes is not None else default_probes(entry[2].n_clusters))
    return tuple(entry)


def obtain(cfg: protocol.BenchConfig, p: Params):
    """The run of this configuration: read back if complete, resumed if interrupted, else executed."""
    from .results import SUMMARY, load_run

    if (cfg.path / SUMMARY).is_file():
        run = load_run(cfg.path)
        if protocol.BenchConfig.from_dict(run.config).to_dict() == json.loads(json.dumps(cfg.to_dict())):
            return run
    cfg.check()
    loaded = pair(p, flash=cfg.needs_flash)
    if loaded[2] is not None and cfg.clusters is not None and loaded[2].n_clusters != cfg.clusters:
        loaded = loaded[:2]  # another clustering than the shared head's: the run builds its own
    run = protocol.run(cfg, resume=cfg.path.exists(), progress=p.progress, loaded=loaded)
    pair(p, flash=cfg.needs_flash)  # the shared head's probe count back to these parameters'
    return run


def main_run(p: Params):
    """The headline run (Tables 4.5, 4.6, 4.9-4.11; ratios, peers, accepted lengths)."""
    return obtain(_named(p.bench(), p.set_name, "bench"), p)


def profile_run(p: Params):
    """The diagnostic profiled run of Tables 4.7/4.8 (dense, dense-shared and FlashHead drafts, ordinary
    schedule, instrumented drafters; no component costs)."""
    cfg = p.bench(profile=True, modes=protocol.profile_modes("ordinary"), costs=False)
    return obtain(_named(cfg, p.set_name, "profile"), p)


def sweep_runs(p: Params) -> dict:
    """Speedup over K: baseline and the deferred dense and FlashHead drafts at each K of ``K_SWEEP``
    on ``SWEEP_PROMPTS`` prompts (one run folder per K)."""
    out = {}
    for k in p.k_sweep:
        cfg = p.bench(k=k, modes=("baseline", "dense_deferred", "flash_deferred"), prompts=p.sweep_prompts,
                      per_category=1, iterations=1, costs=False)
        out[k] = obtain(_named(cfg, p.set_name, f"sweep-k{k}"), p)
    return out


def sweep_speedups(sweeps: dict, run) -> tuple[dict, dict]:
    """Figure 4.4's data: per deferred mode, measured pooled speedup over target-only at each K of the sweep,
    and the chapter 2 model's (the main run's measured costs, acceptance from its mean emitted per round)."""
    from . import tables, theory

    measured, model = {}, {}
    costs = theory.measured_costs(run)
    for m, c in (("dense_deferred", costs["c_dense"]), ("flash_deferred", costs.get("c_flash", costs["c_dense"]))):
        label = tables.LABELS[m]
        measured[label] = {k: tables.totals(r.of(m))["decode_tokens_per_s"] / tables.totals(r.of("baseline"))["decode_tokens_per_s"]
                           for k, r in sorted(sweeps.items())}
        a = theory.alpha_from_emitted(tables.totals(run.of(m))["mean_emitted"], run.config["k"])
        model[label] = {k: float(theory.speedup(a, k, c, costs["verify_k1"], 0.0)) for k in sweeps}
    return measured, model


def model_bench(p: Params) -> dict:
    """The draft's model-only measurements (Tables 4.1-4.4, FlashHead quality over probes), cached as JSON."""
    from . import modelbench

    prompts = selected_prompts(p)
    doc_key = {"draft": p.draft, "device": p.draft_device or p.device, "dtype": p.dtype, "prompts": [q.question_id for q in prompts],
               "state_tokens": p.state_tokens, "head_reps": p.head_reps, "step_reps": p.step_reps,
               "probes": p.probes, "clusters": p.clusters, "assets": p.assets, "flash_path": p.flash_path,
               "kmeans_iterations": p.kmeans_iterations}

    def compute():
        from .results import environment

        _, draft, head = pair(p)
        probes = sorted(set(modelbench.default_probe_list(head.n_clusters)) | {head.n_probes})
        doc = modelbench.run(draft, head, prompts, probes=probes, state_tokens=p.state_tokens, head_reps=p.head_reps,
                             step_reps=p.step_reps, progress=p.progress)
        doc["environment"] = environment(("draft", draft))
        return doc

    return cached_document(p, "model-bench", doc_key, compute)


def cached_document(p: Params, kind: str, key: dict, compute) -> dict:
    """A JSON result under ``RUNS_DIR`` named by the parameter set, its kind and a hash of ``key``: read back
    if there, else ``compute()``d, given its key and written atomically."""
    path = Path(p.runs_dir) / f"{p.set_name}-{kind}-{_digest(key)}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    doc = compute()
    doc["key"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return doc


def hardware(env: dict) -> str:
    """One line naming the machine of a run's environment (GPU names if any, else the CPU and threads)."""
    cuda = env.get("cuda_devices") or env.get("cuda") or []
    if cuda:
        names = [d.get("name", str(d)) if isinstance(d, dict) else str(d) for d in cuda]
        return ", ".join(dict.fromkeys(names)) + (f" x{len(names)}" if len(names) > 1 else "")
    cpu = env.get("cpu") or env.get("processor") or "CPU"
    threads = env.get("threads") or env.get("torch_threads")
    return f"{cpu}" + (f", {threads} threads" if threads else "")


def source_label(run_or_doc, p: Params) -> str:
    """The ``Source`` of this project's rows in a table: parameter set, models and machine."""
    env = run_or_doc.environment if hasattr(run_or_doc, "environment") else run_or_doc.get("environment", {})
    short = lambda s: s.split(":")[-1].split("/")[-1]
    return f"this run ({p.set_name}): {short(p.target)} + {short(p.draft)}, {hardware(env)}"


# --- execution --------------------------------------------------------------------------------------------

def _library_digest() -> str:
    h = hashlib.sha256()
    for f in sorted((ROOT / "src" / "thesis_lib").rglob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def notebook_parameters(name: str) -> set[str]:
    import papermill

    return set(papermill.inspect_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb")))


def build_dir(set_name: str) -> Path:
    return ROOT / "build" / set_name / "book"


def execute(set_name: str = DEFAULT_SET, *, recompute: bool = False, only: list[str] | None = None,
            overrides: dict | None = None, progress: bool = True) -> dict[str, str]:
    """Run the chapter notebooks with a parameter set into ``build/<set>/book/notebooks``; returns each
    notebook's fate ("executed" or "reused"). Every bad name fails before any notebook runs."""
    import papermill

    values = {**load_parameters(set_name), **(overrides or {})}
    names = list(only or RUN_ORDER)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        raise ConfigError(f"Unknown notebook(s) {', '.join(unknown)}; the chapters are {', '.join(NOTEBOOKS)}.")
    Params.from_namespace(values).check()
    out_dir = build_dir(set_name)
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    values.setdefault("SET_NAME", set_name)
    values["FIG_DIR"] = str((out_dir / "figures").relative_to(ROOT))
    lib = _library_digest()
    fates = {}
    for name in sorted(names, key=RUN_ORDER.index):
        src = NOTEBOOK_DIR / f"{name}.ipynb"
        declared = notebook_parameters(name)
        given = {k: v for k, v in values.items() if k in declared}
        key = _digest({"source": hashlib.sha256(src.read_bytes()).hexdigest(), "parameters": given, "library": lib})
        dest = out_dir / "notebooks" / f"{name}.ipynb"
        if not recompute and dest.is_file():
            meta = json.loads(dest.read_text(encoding="utf-8")).get("metadata", {}).get("thesis_companion", {})
            if meta.get("key") == key:
                fates[name] = "reused"
                continue
        t0 = time.perf_counter()
        tmp = dest.with_suffix(".partial.ipynb")
        papermill.execute_notebook(str(src), str(tmp), parameters=given, cwd=str(ROOT), kernel_name="python3",
                                   progress_bar=progress, log_output=False)
        nb = json.loads(tmp.read_text(encoding="utf-8"))
        for cell in nb["cells"]:  # the parameter cells fold away in the book ("Show code cell source")
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if {"parameters", "injected-parameters"} & set(tags) and "hide-input" not in tags:
                tags.append("hide-input")
        nb.setdefault("metadata", {})["thesis_companion"] = {
            "key": key, "parameter_set": set_name, "parameters": given, "seconds": round(time.perf_counter() - t0, 1)}
        tmp.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, dest)
        fates[name] = "executed"
    return fates


# --- vendored JavaScript (offline pages) ------------------------------------------------------------------

#: npm packages the pages need, pinned by the registry's sha512 integrity.
NPM = {
    "requirejs": ("2.3.8", "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw=="),
    "@jupyter-widgets/html-manager": ("1.0.15", "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA=="),
    "mathjax": ("3.2.2", "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="),
}
NPM_REGISTRY = os.environ.get("THESIS_LIB_NPM_REGISTRY", "https://registry.npmjs.org")


def _npm_tarball(package: str) -> bytes:
    version, integrity = NPM[package]
    cache = models.cache_dir() / "npm" / f"{package.replace('/', '__')}-{version}.tgz"
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
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(data)
    return data


#: Loaded between require.js and the widget manager: the manager's modules find their fonts next to the module
#: URL that require.js reports, which by default is relative to the page (and so missing); this maps the
#: ``@jupyter-widgets`` module names to the folder this script itself was served from.
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


# --- staging and build --------------------------------------------------------------------------------------

def stage(set_name: str = DEFAULT_SET) -> Path:
    """Put the book's sources together in ``build/<set>/book`` (the executed notebooks are already there)."""
    out = build_dir(set_name)
    missing = [n for n in NOTEBOOKS if not (out / "notebooks" / f"{n}.ipynb").is_file()]
    if missing:
        raise ConfigError(f"Not yet executed for {set_name!r}: {', '.join(missing)} (run `thesis-lib book` first).")
    for f in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / f, out / f)
    for f in PROSE_DIR.rglob("*"):
        if f.is_file() and "_build" not in f.parts:
            dest = out / f.relative_to(PROSE_DIR)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
    vendor(out / "_vendor")
    return out


def build(set_name: str = DEFAULT_SET, *, recompute: bool = False, progress: bool = True) -> Path:
    """Execute (or reuse) the notebooks, stage, and build the HTML with warnings as errors; returns the
    folder of the built pages."""
    execute(set_name, recompute=recompute, progress=progress)
    out = stage(set_name)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(out), "-W", "-n", "--keep-going",
           "--builder", "html"]
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"jupyter-book build failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}")
    return out / "_build" / "html"


def environment_table(run, model_bench_doc: dict | None = None):
    """The environment page's table: versions, machine, models (spec, dtype, device, file hashes), FlashHead
    settings and the run folders, from a run's recorded environment."""
    import pandas as pd

    env = run.environment
    rows = [("run folder", run.name), ("recorded at", env.get("recorded_at")), ("git commit", (env.get("git") or {}).get("commit")),
            ("uncommitted changes", (env.get("git") or {}).get("dirty")), ("python", env.get("python")),
            ("torch", env.get("torch")), ("transformers", env.get("transformers")), ("platform", env.get("platform")),
            ("machine", hardware(env)), ("CPU cores", env.get("cpu_count")),
            ("CUDA devices", ", ".join(env.get("cuda_devices") or []) or "none")]
    for role, m in (env.get("models") or {}).items():
        rows.append((f"{role} model", f"{m.get('spec')} ({m.get('dtype')}, {m.get('device')})"))
        if m.get("gguf_sha256"):
            rows.append((f"{role} GGUF sha256", m["gguf_sha256"]))
        pkgs = m.get("packages") or []
        if pkgs:
            rows.append((f"{role} packages", f"{len(pkgs)} PyPI packages: {pkgs[0]} ... {pkgs[-1]}"))
        if m.get("cpu_kernels"):
            rows.append((f"{role} CPU kernels", m["cpu_kernels"]))
    fh = env.get("flashhead") or {}
    if fh:
        rows.append(("FlashHead", f"C = {fh.get('n_clusters')}, p = {fh.get('n_probes')}, path {fh.get('path')}, "
                                  f"centroids {fh.get('centroid_dtype')}"))
        sha = (fh.get("clustering") or {}).get("sha256")
        if sha:
            rows.append(("FlashHead clustering sha256", json.dumps(sha)))
    if model_bench_doc:
        rows.append(("model-bench key", _digest(model_bench_doc.get("key", {}))))
    return pd.DataFrame([(k, "" if v is None else str(v)) for k, v in rows], columns=["Item", "Value"])
