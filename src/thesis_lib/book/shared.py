"""The chapters' shared results: run folders and JSON documents under ``RUNS_DIR`` named by a hash of their
configuration (:func:`named`, :func:`cached_document`), so the same parameters find them, computed once, and others
never overwrite them: :func:`main_run`, :func:`profile_run`, :func:`pipelined_run`, :func:`grid_run` (seen as :func:`sweep_runs` and
:func:`explorer_runs`), :func:`model_bench`. :func:`pair` loads the models once per process; the ``*_config``
functions let :mod:`~thesis_lib.book.scheduled` run the runs before the notebooks.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .. import extensions
from ..bench import drafts, modelbench, protocol
from ..bench.environment import capability, environment, measured_when, provenance
from ..bench.modes import variant
from ..errors import ConfigError
from ..progress import note
from ..bench.runs import SUMMARY, load_run
from ..models import loading, weight_only
from ..models.auto import draft_precision
from ..models.cache import write_json
from ..models.packing import BF16_ROWS_FLOOR, bf16_packing_available, float32_rows_floor
from .params import ROOT, Params, selected_prompts


def digest(doc) -> str:
    """A short hash of a JSON-able document (names results by their parameters)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:10]


def exact_attention(device: str, draft_device: str | None) -> bool:
    """Whether the target or the draft loads with row-exact attention (:mod:`thesis_lib.models.attention`)."""
    return "exact" in {loading.resolved_attention(d) for d in (device, draft_device or device)}


def rows_floor_key(dtype: str, device: str) -> dict:
    """The key naming the CPU rows floor of packed products (:func:`~thesis_lib.models.packing.rows_floor`) for
    ``dtype`` (``bf16_rows_floor`` or ``f32_rows_floor``, or none), so results made with another are not reused."""
    if device != "cpu":
        return {}
    resolved = loading.resolved_dtype(dtype, device)
    if resolved == "bfloat16" and bf16_packing_available() and BF16_ROWS_FLOOR > 1:
        return {"bf16_rows_floor": BF16_ROWS_FLOOR}
    if resolved == "float32" and float32_rows_floor() > 1:
        return {"f32_rows_floor": float32_rows_floor()}
    return {}


def machine_key(dtype: str, device: str, draft_device: str | None, draft_dtype: str | None = "auto") -> dict:
    """What a result's name adds to its parameters about this machine: the precision "auto" resolves to (and the
    draft's, where it differs), a weight-only target's head format, the weight layouts in use, FlashHead's greedy
    kernel, whether attention is row-exact and the rows floor, so that a result made another way here is not reused."""
    key = {"dtype_resolved": loading.resolved_dtype("auto", device)} if dtype == "auto" else {}
    d_device = draft_device or device
    target = loading.resolved_dtype(dtype, device)
    draft = loading.resolved_dtype(draft_precision(dtype, draft_dtype, d_device), d_device)
    if draft != target:
        key["draft_dtype_resolved"] = draft
    if target in weight_only.FORMATS:
        key["target_head"] = weight_only.head_format(target, head_rows=False)
    layouts = {f: weight_only.LAYOUTS[f] for f in sorted({target, draft}) if f in weight_only.LAYOUTS}
    if layouts:
        key["layouts"] = layouts
    if device == "cpu" and weight_only.available():
        key["flash_greedy"] = "kernel"  # FlashHead's "auto" path (heads.cpu_kernels)
    if exact_attention(device, draft_device):
        key["attention"] = "exact"
    return {**key, **rows_floor_key(dtype, device)}


#: how the loops split a generation's time, named in every run's name so that a run timed another way is not reused:
#: TTFT covers both models' prompt prefill (:func:`thesis_lib.decoding.rounds.prefill`)
TIMING = {"ttft": "target and draft prefill"}


def named(cfg: protocol.BenchConfig, set_name: str, kind: str) -> protocol.BenchConfig:
    """``cfg`` named ``<set>-<kind>-<hash of its parameters and of the prompts it measures>``: an edited prompt
    (its text, category or id) names another run, which is measured, not the old one reused."""
    doc = cfg.identity()
    doc.pop("name"), doc.pop("out")
    doc.update(machine_key(cfg.dtype, cfg.device, cfg.draft_device, cfg.draft_dtype), **TIMING,
               prompts=digest([asdict(q) for q in cfg.check_prompts()]))
    cfg.name = f"{set_name}-{kind}-{digest(doc)}"
    return cfg


_PAIRS: dict = {}


def pair(p: Params, flash: bool = True):
    """``(target, draft, flash_head)`` for these parameters, loaded once per process."""
    key = (p.target, p.draft, p.device, p.draft_device, p.dtype, p.draft_dtype)
    if key not in _PAIRS:
        _PAIRS.clear()
        torch.set_num_threads(protocol.available_cores())  # explicit (and recorded with every run and document)
        note(f"loading {p.target} and {p.draft} ({loading.resolved_dtype(p.dtype, p.device)})")
        target, draft = loading.load_pair(p.target, p.draft, device=p.device, draft_device=p.draft_device,
                                         dtype=p.dtype, progress=p.progress, draft_dtype=p.draft_dtype)
        _PAIRS[key] = [target, draft, None]
    entry = _PAIRS[key]
    if flash and entry[2] is None:
        cfg = p.bench()
        entry[2] = drafts.flash_head(cfg, entry[1], drafts.flash_body(cfg, entry[1], progress=p.progress))
    if flash:  # a run with other probes may have changed the shared head: back to these parameters'
        entry[2].with_probes(p.probes if p.probes is not None else entry[2].configured_probes)
    return tuple(entry)


#: What :func:`machine_key` may add to a result's key: a read-only build matches results without them.
MACHINE_FIELDS = ("dtype_resolved", "draft_dtype_resolved", "target_head", "layouts", "flash_greedy", "attention",
                  "bf16_rows_floor", "f32_rows_floor")


def _without(doc: dict, names) -> dict:
    return {k: v for k, v in json.loads(json.dumps(doc, default=str)).items() if k not in names}


def recorded_run(cfg: protocol.BenchConfig):
    """A complete run folder beside ``cfg``'s path, of its kind, with its configuration (name and folder aside),
    made on any machine; None where there is none."""
    want = _without(cfg.to_dict(), ("name", "out"))
    for folder in sorted(cfg.path.parent.glob(f"{cfg.name.rsplit('-', 1)[0]}-*")):
        if (folder / SUMMARY).is_file():
            run = load_run(folder)
            if _without(protocol.BenchConfig.from_dict(run.config).to_dict(), ("name", "out")) == want:
                return run
    return None


def obtain(cfg: protocol.BenchConfig, p: Params):
    """The run of this configuration: read back if complete, resumed if interrupted, else executed; a read-only
    build (``READ_ONLY``) reads the recorded run of this configuration and never measures."""
    if (cfg.path / SUMMARY).is_file():
        run = load_run(cfg.path)
        if protocol.BenchConfig.from_dict(run.config).to_dict() == json.loads(json.dumps(cfg.to_dict())):
            note(f"run folder {cfg.name}: reused ({measured_when(run.environment)})")
            return run
    if p.read_only:
        run = recorded_run(cfg)
        if run is None:
            raise ConfigError(f"READ_ONLY: {cfg.path.parent} holds no recorded run of {cfg.name}'s configuration; "
                              "this build measures nothing (`make book` measures this machine).")
        note(f"run folder {run.path.name}: read ({measured_when(run.environment)})")
        return run
    n_prompts = len(cfg.check())
    loaded = pair(p, flash=cfg.needs_flash)
    if loaded[2] is not None and cfg.clusters is not None and loaded[2].n_clusters != cfg.clusters:
        loaded = loaded[:2]  # another clustering than the shared head's: the run builds its own
    note(f"run folder {cfg.name}: {'resuming' if cfg.path.exists() else 'measuring'} "
         f"({len(cfg.modes)} modes x {n_prompts} prompts x {cfg.iterations} iteration(s))")
    run = protocol.run(cfg, resume=cfg.path.exists(), progress=p.progress, loaded=loaded)
    pair(p, flash=cfg.needs_flash)  # the shared head's probe count back to these parameters'
    return run


def main_config(p: Params) -> protocol.BenchConfig:
    """The headline run's configuration (Tables 4.5, 4.6, 4.9-4.11; ratios, peers, accepted lengths)."""
    return named(p.bench(), p.set_name, "bench")


def main_run(p: Params):
    """The headline run (:func:`main_config`)."""
    return obtain(main_config(p), p)


def curve_run(p: Params, dtype: str):
    """A point of the thesis' cost-regime curve (``CURVE_DTYPES``): the main run's prompts and sizes with the target
    in ``dtype``, baseline and FlashHead deferred with their costs."""
    q = replace(p, dtype=dtype)
    return obtain(named(q.bench(modes=("baseline", "flash_deferred")), p.set_name, f"curve-{dtype}"), q)


def profile_config(p: Params) -> protocol.BenchConfig:
    """The profiled run of Tables 4.7/4.8 (dense, dense-shared and FlashHead drafts, ordinary schedule)."""
    cfg = p.bench(profile=True, modes=protocol.profile_modes("ordinary"), costs=False)
    return named(cfg, p.set_name, "profile")


def profile_run(p: Params):
    return obtain(profile_config(p), p)


def pipelined_config(p: Params) -> protocol.BenchConfig:
    """Section 3.6.1's run on ``SWEEP_PROMPTS`` prompts: the ordinary and the pipelined schedule of both drafts,
    interleaved, beside target-only decoding (the lossless check)."""
    modes = ("baseline", "dense_ordinary", "dense_pipelined", "flash_ordinary", "flash_pipelined")
    cfg = p.bench(modes=modes, prompts=p.sweep_prompts, per_category=1, iterations=1, costs=False)
    return named(cfg, p.set_name, "pipelined")


def pipelined_run(p: Params):
    return obtain(pipelined_config(p), p)


def grid_config(p: Params) -> protocol.BenchConfig:
    """One run on ``SWEEP_PROMPTS`` prompts for the speedup over K (dense and FlashHead deferred at each ``K_SWEEP``)
    and the static explorer (FlashHead deferred at each ``EXPLORER_PROBES`` x ``EXPLORER_K``), beside one baseline."""
    sweep = [variant(m, k) for k in p.k_sweep for m in ("dense_deferred", "flash_deferred")]
    grid = [variant("flash_deferred", k, n) for k in p.explorer_k or p.k_sweep for n in p.explorer_probes]
    cfg = p.bench(modes=("baseline", *sweep, *grid), prompts=p.sweep_prompts, per_category=1, iterations=1,
                  costs=False)
    return named(cfg, p.set_name, "grid")


def grid_run(p: Params):
    return obtain(grid_config(p), p)


def sweep_runs(p: Params) -> dict:
    """``K -> `` the grid run seen as a run of baseline and the deferred dense and FlashHead drafts at that K."""
    run = grid_run(p)
    return {k: run.view({"baseline": "baseline", **{m: variant(m, k) for m in ("dense_deferred", "flash_deferred")}},
                        k=k) for k in p.k_sweep}


def explorer_runs(p: Params) -> dict:
    """``(K, probes) -> `` the grid run seen as a run of baseline and the FlashHead deferred draft at that setting."""
    run = grid_run(p)
    return {(k, n): run.view({"baseline": "baseline", "flash_deferred": variant("flash_deferred", k, n)}, k=k,
                             probes=n) for k in p.explorer_k or p.k_sweep for n in p.explorer_probes}


def model_bench(p: Params) -> dict:
    """The draft's model-only measurements (Tables 4.1-4.4, FlashHead quality over probes), cached as JSON."""
    prompts = selected_prompts(p)
    doc_key = {"draft": p.draft, "device": p.draft_device or p.device, "dtype": p.dtype, "prompts": [q.question_id for q in prompts],
               "state_tokens": p.state_tokens, "head_reps": p.head_reps, "step_reps": p.step_reps,
               "probes": p.probes, "clusters": p.clusters, "assets": p.assets, "flash_path": p.flash_path,
               "kmeans_iterations": p.kmeans_iterations}
    # a study's part that needs an optional package runs wherever it is installed
    auto = {name: v for name, part in extensions.MODEL_BENCH_PARTS.items()
            if part.available is not None and (v := part.available())}
    doc_key.update(auto)

    def compute():
        _, draft, head = pair(p)
        probes = sorted(set(modelbench.default_probe_list(head.n_clusters)) | {head.n_probes})
        parts = modelbench.PARTS + tuple(auto)
        doc = modelbench.run(draft, head, prompts, parts=parts, probes=probes, state_tokens=p.state_tokens,
                             head_reps=p.head_reps,
                             step_reps=p.step_reps, progress=p.progress, thinking=p.thinking)
        doc["environment"] = environment(("draft", draft))
        return doc

    return cached_document(p, "model-bench", doc_key, compute)


def precision_bench(p: Params, name: str = "PRECISION_FILE") -> tuple[dict | None, str]:
    """The saved measurement document the parameter ``name`` names (``thesis-lib studies precision-bench``'s:
    ``PRECISION_FILE``, ``PRECISION_FILE_NO_BF16``, ``PRECISION_FILE_LAYOUTS``), and a label: what, when and where it was measured."""
    return saved_document(getattr(p, name.lower()), name)


def precision_benches(p: Params, name: str) -> list[tuple[dict, str]]:
    """The saved documents a list parameter names (``PRECISION_FILES_WEIGHT_ONLY``, ``LLAMA_FILES``), each with its label (as
    :func:`precision_bench`); files that do not exist are left out."""
    return [(doc, label) for path in getattr(p, name.lower()) or []
            for doc, label in [saved_document(path, name)] if doc is not None]


def saved_or_measured(p: Params, name: str, kind: str, key: dict, compute) -> tuple[dict, str]:
    """The document the parameter ``name`` (``SERVING_FILE``, ...) names, an error where that file is missing; without
    one, the document this build measures (:func:`cached_document`); and a label saying which."""
    path = getattr(p, name.lower())
    if path:
        doc, label = saved_document(path, name)
        if doc is None:
            raise FileNotFoundError(f"{name} names {path}, which does not exist")
        return doc, label
    doc = cached_document(p, kind, key, compute)
    return doc, f"measured by this build ({p.set_name}), {doc['measured'].get('recorded_at', '?')[:10]}"


def saved_document(path: str | None, name: str) -> tuple[dict | None, str]:
    """A saved measurement document under the project root and its label (None, and why, where it is missing)."""
    if not path or not (ROOT / path).is_file():
        return None, f"no precision document named ({name})"
    doc = json.loads((ROOT / path).read_text(encoding="utf-8"))
    m = doc.get("measured") or {}
    git = m.get("git") or {}
    rev = (git.get("commit") or "unknown")[:10] + (" with uncommitted changes" if git.get("dirty") else "")
    torch = f", torch {doc['torch']}" if "torch" in doc else ""
    return doc, (f"{doc.get('command', 'thesis-lib precision-bench')}; measured {m.get('recorded_at', '?')[:10]} at "
                 f"{rev} on {capability(doc)}, {doc['threads']} threads{torch}; saved in {path}")


def cached_document(p: Params, kind: str, key: dict, compute) -> dict:
    """The JSON result ``<set>-<kind>-<hash of key>`` under ``RUNS_DIR``: read back, else computed and written."""
    if p.thinking is not None:  # every document rests on prompts encoded with the template's switch
        key = {**key, "thinking": p.thinking}
    key = {**key, **machine_key(p.dtype, p.device, p.draft_device, p.draft_dtype)}
    path = Path(p.runs_dir) / f"{p.set_name}-{kind}-{digest(key)}.json"
    if not path.is_file() and p.read_only:  # a recorded document of this key, made on any machine
        want = _without(key, MACHINE_FIELDS)
        path = next((f for f in sorted(path.parent.glob(f"{p.set_name}-{kind}-*.json"))
                     if _without(json.loads(f.read_text(encoding="utf-8")).get("key") or {}, MACHINE_FIELDS) == want),
                    None)
        if path is None:
            raise ConfigError(f"READ_ONLY: {p.runs_dir} holds no recorded {kind} document of these parameters; this "
                              "build measures nothing (`make book` measures this machine).")
    if path.is_file():
        doc = json.loads(path.read_text(encoding="utf-8"))
        note(f"{path.name}: reused ({measured_when(doc.get('measured') or doc.get('environment') or {})})")
        return doc
    measured = provenance()  # the date, revision and code this document is made with, taken before the work
    note(f"{path.name}: computing")
    t0 = time.perf_counter()
    doc = compute()
    doc["key"] = key
    doc["measured"] = measured
    note(f"{path.name}: computed ({time.perf_counter() - t0:.0f} s)")
    write_json(path, doc)
    return doc
