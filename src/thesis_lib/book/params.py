"""The book's parameter sets (``params/<name>.yaml``; default ``cpu-embedded``) and :class:`Params`, the UPPER_CASE
parameters the notebooks declare, lower-cased; :data:`ROOT` is the repository the book is built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ..bench import protocol
from ..bench.prompts import load_prompts, select
from ..errors import ConfigError
from ..models import specs

ROOT = Path(__file__).resolve().parents[3]
PARAMS_DIR = ROOT / "params"
DEFAULT_SET = "cpu-embedded"


def parameter_sets() -> list[str]:
    return sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))


def load_parameters(name: str) -> dict:
    """A named parameter set (``params/<name>.yaml``) or a YAML file's path; UPPER_CASE names only. A set that
    names ``BASE`` (another set) takes that set's values and changes only those it gives."""
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
    base = doc.pop("BASE", None)
    if base is not None:
        if Path(str(base)).stem == path.stem:
            raise ConfigError(f"{path.name}: BASE names the set itself.")
        doc = {**load_parameters(str(base)), **doc}
    return doc


def set_label(set_name: str) -> str:
    """A parameter set's name: a named set's own, a YAML file's stem."""
    return Path(set_name).stem if set_name.endswith((".yaml", ".yml")) else set_name


@dataclass
class Params:
    """The parameters every chapter shares; :meth:`bench` turns them into a benchmark configuration."""

    set_name: str = DEFAULT_SET
    target: str = specs.DEFAULT_TARGET
    draft: str = specs.DEFAULT_DRAFT
    device: str = "cpu"
    draft_device: str | None = None
    dtype: str = "auto"
    draft_dtype: str = "auto"
    k: int = 4
    k_sweep: list = field(default_factory=lambda: [1, 2, 4, 6])
    max_new_tokens: int = 32
    modes: list = field(default_factory=lambda: ["baseline", "dense_ordinary", "flash_ordinary", "dense_deferred",
                                                 "flash_deferred", "hf_assisted"])
    prompt_file: str = "project"
    per_category: int | None = 1
    prompts: int | None = None
    sweep_prompts: int = 3
    #: the static explorer's grid: FlashHead deferred at these probe counts for each K of ``explorer_k`` (None: k_sweep)
    explorer_k: list | None = None
    explorer_probes: list = field(default_factory=list)
    iterations: int = 1
    warmup: int = 1
    warmup_tokens: int | None = None
    seed: int = 0
    probes: int | None = None
    clusters: int | None = None
    assets: str | None = None
    kmeans_iterations: int = 20
    flash_path: str = "auto"
    state_tokens: int = 32
    #: the chat template's thinking switch (Qwen3's ``enable_thinking``); None: the template's default
    thinking: bool | None = None
    example_prompt: int = 0
    head_reps: int = 3
    step_reps: int = 3
    runs_dir: str = "runs/book"
    # the "Beyond the thesis" chapter
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
    #: ``thesis-lib model-bench --parts embedl``'s saved output, shown where Embedl's package is not installed
    embedl_peer_file: str | None = None
    #: a saved ``thesis-lib studies gpu-check`` document shown in chapter 4 (random weights: GPU cost, not acceptance)
    gpu_check_file: str | None = None
    #: a saved ``thesis-lib studies precision-bench`` document shown in chapter 2 (float32 vs bfloat16 on this CPU kind)
    precision_file: str | None = None
    #: the same from a CPU without native bf16 (``precision-bench --emulated``): DTYPE auto's pick checked there
    precision_file_no_bf16: str | None = None
    #: a saved document comparing float32's two packed layouts
    precision_file_layouts: str | None = None
    #: saved documents timing the weight-only formats beside float32 (``precision-bench --precisions
    #: float32,...,int8-weights``): the byte floor table of chapter 2
    precision_files_weight_only: list = field(default_factory=list)
    #: a saved ``thesis-lib studies llama-bench`` document: llama.cpp beside this project in chapter 2
    llama_file: str | None = None
    #: a saved ``thesis-lib studies step-profile`` document: where a decode step's time goes, in chapter 2's appendix
    step_profile_file: str | None = None
    #: chapter 7: a saved ``thesis-lib studies serving-bench`` document (batched decoding, longer generations, memory);
    #: None: the chapter measures them itself at the SERVING_* sizes below
    serving_file: str | None = None
    serving_batches: list = field(default_factory=lambda: [1, 4])
    serving_prompts: int = 8
    serving_tokens: int = 16
    serving_lengths: list = field(default_factory=lambda: [32, 64, 128])
    serving_length_prompts: int = 1  # per long-answer category (coding, math_reasoning)
    serving_reps: int = 1
    #: chapter 7: a saved ``thesis-lib model-bench --parts batch`` document (both heads on 1-32 real states at
    #: once); None: measured here
    batch_heads_file: str | None = None
    #: chapter 8: a saved ``thesis-lib studies tree-bench`` document (token trees); None: the chapter measures it itself
    #: with the TREE_* sizes below (measured prompts per category, held-out calibration prompts per category and
    #: their tokens, new tokens per measured generation, timed repetitions)
    tree_file: str | None = None
    tree_per_category: int = 2
    tree_calibration: int = 3
    tree_calibration_tokens: int = 64
    tree_tokens: int = 48
    tree_iterations: int = 2
    sampling_delta: float = 0.01
    fig_dir: str = "figures"
    progress: bool = True
    #: the GPU path rehearsed on a CPU (:mod:`thesis_lib.book.rehearsal`): stand-in hub repos, virtual GPUs
    rehearsal: bool = False
    #: a build that measures nothing: every run and document comes from ``RUNS_DIR`` (recorded on another machine
    #: too: matched by configuration, not by this machine's name for it), its sizes from the plan saved there
    read_only: bool = False

    @classmethod
    def from_namespace(cls, ns: dict) -> "Params":
        """From a notebook's globals: every UPPER_CASE name that is a field here (``SET_NAME`` and so on)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k.lower(): v for k, v in ns.items() if k.isupper() and k.lower() in names})

    def check(self) -> "Params":
        for name in ("per_category", "max_new_tokens", "iterations"):
            v = getattr(self, name)
            if not (v is None and name == "per_category") and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                why = "; auto is for `thesis-lib book`, which sizes the sample first" if v == "auto" else ""
                raise ConfigError(f"{name.upper()} must be an integer >= 1 (got {v!r}){why}.")
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"K must be an integer >= 1 (got {self.k!r}).")
        if any(not isinstance(k, int) or k < 1 for k in self.k_sweep):
            raise ConfigError(f"K_SWEEP values must be integers >= 1 (got {self.k_sweep!r}).")
        if any(not isinstance(k, int) or k < 1 for k in self.explorer_k or []):
            raise ConfigError(f"EXPLORER_K values must be integers >= 1 (got {self.explorer_k!r}).")
        for name in ("serving_batches", "serving_lengths"):
            if not getattr(self, name) or any(not isinstance(n, int) or n < 1 for n in getattr(self, name)):
                raise ConfigError(f"{name.upper()} must be a list of integers >= 1 (got {getattr(self, name)!r}).")
        for name in ("serving_prompts", "serving_tokens", "serving_length_prompts", "serving_reps", "tree_per_category",
                     "tree_calibration", "tree_calibration_tokens", "tree_tokens", "tree_iterations"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name.upper()} must be an integer >= 1 (got {v!r}).")
        if max(self.serving_batches) > self.serving_prompts:
            raise ConfigError(f"SERVING_BATCHES go up to {max(self.serving_batches)} prompts at once; SERVING_PROMPTS "
                              f"is {self.serving_prompts}.")
        if any(not isinstance(n, int) or n < 1 for n in self.explorer_probes):
            raise ConfigError(f"EXPLORER_PROBES values must be integers >= 1 (got {self.explorer_probes!r}).")
        return self

    def bench(self, **kw) -> protocol.BenchConfig:
        base = dict(out=self.runs_dir, target=self.target, draft=self.draft, device=self.device,
                    draft_device=self.draft_device, dtype=self.dtype, draft_dtype=self.draft_dtype, k=self.k, max_new_tokens=self.max_new_tokens,
                    modes=tuple(self.modes), prompt_file=self.prompt_file, per_category=self.per_category,
                    prompts=self.prompts, iterations=self.iterations, warmup=self.warmup,
                    warmup_tokens=self.warmup_tokens, seed=self.seed,
                    probes=self.probes, clusters=self.clusters, assets=self.assets, flash_path=self.flash_path,
                    kmeans_iterations=self.kmeans_iterations, thinking=self.thinking)
        base.update(kw)
        return protocol.BenchConfig(**base)


def selected_prompts(p: Params):
    """The prompts of the main run (prompt file, per category, count), without loading any model."""
    return select(load_prompts(p.prompt_file), None, p.prompts, p.per_category)
