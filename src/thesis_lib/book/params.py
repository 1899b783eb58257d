"""The book's parameter sets (``params/<name>.yaml``; default ``cpu-embedded``) and :class:`Params`, the UPPER_CASE
parameters the notebooks declare, lower-cased: the thesis' own as its fields, each study's in the block it registers
(:func:`thesis_lib.extensions.parameters`); :data:`ROOT` is the repository the book is built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .. import extensions
from ..bench import protocol
from ..bench.prompts import load_prompts, select
from ..errors import ConfigError, at_least
from ..models import specs

ROOT = Path(__file__).resolve().parents[3]
PARAMS_DIR = ROOT / "params"
DEFAULT_SET = "cpu-embedded"


def parameter_sets() -> list[str]:
    return sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))


def load_parameters(name: str, _seen: tuple = ()) -> dict:
    """A named parameter set (``params/<name>.yaml``) or a YAML file's path; UPPER_CASE names only. A set that
    names ``BASE`` (another set) takes that set's values and changes only those it gives."""
    import yaml

    path = Path(name)
    if not path.is_file():
        path = PARAMS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"Unknown parameter set {name!r}; use one of {', '.join(parameter_sets())} or a YAML file.")
    if path.resolve() in _seen:
        raise ConfigError(f"{path.name}: BASE goes round in a circle ({' -> '.join(p.name for p in _seen)} -> "
                          f"{path.name}).")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        at = f", line {exc.problem_mark.line + 1}" if getattr(exc, "problem_mark", None) else ""
        raise ConfigError(f"{path.name} is not valid YAML ({getattr(exc, 'problem', None) or exc}{at}).") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path.name} is not a mapping of parameter names to values.")
    bad = [k for k in doc if not (isinstance(k, str) and k.isupper())]
    if bad:
        raise ConfigError(f"{path.name}: parameter names are UPPER_CASE ({', '.join(map(str, bad))} are not).")
    base = doc.pop("BASE", None)
    if base is not None:
        if Path(str(base)).stem == path.stem:
            raise ConfigError(f"{path.name}: BASE names the set itself.")
        doc = {**load_parameters(str(base), (*_seen, path.resolve())), **doc}
    return doc


def set_label(set_name: str) -> str:
    """A parameter set's name: a named set's own, a YAML file's stem."""
    return Path(set_name).stem if set_name.endswith((".yaml", ".yml")) else set_name


@dataclass
class Params:
    """The thesis' parameters, which every chapter shares, and the studies' beside them (read like fields:
    ``p.tree_tokens``); :meth:`bench` turns them into a benchmark configuration."""

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
    #: the thesis' cost regime's curve: the main run again with the target in each of these precisions (baseline and
    #: FlashHead deferred only), beside the main run's own (empty: none measured; the book reads the committed ones)
    curve_dtypes: list = field(default_factory=list)
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
    fig_dir: str = "figures"
    progress: bool = True
    #: the GPU path rehearsed on a CPU (:mod:`thesis_lib.book.rehearsal`): stand-in hub repos, virtual GPUs
    rehearsal: bool = False
    #: a build that measures nothing: every run and document comes from ``RUNS_DIR`` (recorded on another machine
    #: too: matched by configuration, not by this machine's name for it), its sizes from the plan saved there
    read_only: bool = False

    #: the studies' parameters, one dataclass each (:data:`thesis_lib.extensions.PARAMS`), read as attributes here
    studies: tuple = ()

    def __post_init__(self):
        given = {type(block): block for block in self.studies}  # copied: a replaced Params shares no block
        self.studies = tuple(replace(given[block]) if block in given else block() for block in extensions.PARAMS)

    def _owner(self, name: str):
        """The study block that holds the parameter ``name``; None where no study declares it."""
        return next((b for b in self.__dict__.get("studies", ()) if name in b.__dataclass_fields__), None)

    def __getattr__(self, name):  # a study's parameter (a field of this class is found before this is asked)
        block = self._owner(name)
        if block is None:
            raise AttributeError(f"'Params' object has no attribute {name!r} (no parameter {name.upper()})")
        return getattr(block, name)

    def __setattr__(self, name, value):  # a study's parameter is set in its block
        object.__setattr__(self._owner(name) or self, name, value)

    @staticmethod
    def names() -> set[str]:
        """Every parameter's name, lower-cased: the thesis' and the studies'."""
        return {f.name for block in (Params, *extensions.PARAMS) for f in fields(block)} - {"studies"}

    @classmethod
    def from_namespace(cls, ns: dict) -> "Params":
        """From a notebook's globals: every UPPER_CASE name that is a parameter here (``SET_NAME`` and so on)."""
        values = {k.lower(): v for k, v in ns.items() if k.isupper()}
        own = [{f.name: values[f.name] for f in fields(block) if f.name in values} for block in extensions.PARAMS]
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values and f.name != "studies"},
                   studies=tuple(block(**v) for block, v in zip(extensions.PARAMS, own)))

    def values(self) -> dict:
        """Every parameter by its UPPER_CASE name (:meth:`from_namespace` takes them back)."""
        return {name.upper(): getattr(self, name) for name in self.names()}

    def check(self) -> "Params":
        for name in ("per_category", "max_new_tokens", "iterations"):
            if getattr(self, name) == "auto":
                raise ConfigError(f"{name.upper()}: auto is for `thesis-lib book`, which sizes the sample first; "
                                  "give an integer >= 1 here.")
            at_least(name.upper(), getattr(self, name), none=name == "per_category")
        at_least("K", self.k)
        for name in ("k_sweep", "explorer_k", "explorer_probes"):
            v = getattr(self, name)
            if not (v is None and name == "explorer_k") and (
                    not isinstance(v, (list, tuple)) or any(not isinstance(n, int) or n < 1 for n in v)):
                raise ConfigError(f"{name.upper()} values must be integers >= 1 (got {v!r}).")
        if not isinstance(self.curve_dtypes, (list, tuple)) or not all(isinstance(d, str) for d in self.curve_dtypes):
            raise ConfigError(f"CURVE_DTYPES must be a list of precisions (got {self.curve_dtypes!r}).")
        for block in self.studies:
            getattr(block, "check", lambda: None)()
        return self

    def bench(self, **kw) -> protocol.BenchConfig:
        """The benchmark configuration: each of the thesis' own fields that names a ``BenchConfig`` field too
        (``MODES`` as a tuple), ``RUNS_DIR`` as its folder, then ``kw``. A study's parameters go to a run only
        where its code passes them."""
        shared = {f.name for f in fields(protocol.BenchConfig)} & {f.name for f in fields(self)}
        return protocol.BenchConfig(**{**{n: getattr(self, n) for n in shared}, "modes": tuple(self.modes),
                                       "out": self.runs_dir, **kw})


def counts(block, *names: str) -> None:
    """Each named parameter of ``block`` an integer >= 1, else a ``ConfigError`` naming it."""
    for name in names:
        at_least(name.upper(), getattr(block, name))


def selected_prompts(p: Params):
    """The prompts of the main run (prompt file, per category, count), without loading any model."""
    return select(load_prompts(p.prompt_file), None, p.prompts, p.per_category)
