"""The benchmark protocol (thesis section 3.7): one configuration in, one run folder out.

:class:`BenchConfig` names everything that decides a measurement: models, devices, precision, K, max new
tokens, modes, FlashHead parameters, prompt selection, warm-up and measured iterations, seed, and where the
run folder goes. :func:`run` checks it all cheaply (bad K, unknown mode or category, no prompts, probes out of
range, an existing run folder, unknown models, mismatched tokenizers) before loading any weights, then loads
the pair, builds the FlashHead head if a mode needs it, records the environment, executes the measured set
(:func:`~thesis_lib.bench.execute.execute`) writing each sample to the run folder as it finishes, and writes the summary.

The CLI (``thesis-lib bench`` / ``thesis-lib profile``) and the notebooks call this same function with the
same parameters. ``profile=True`` is the diagnostic run of Tables 4.7/4.8 (``modes.PROFILE_DRAFTS`` with
one schedule, instrumented drafters): its absolute speeds carry the instrumentation's overhead, so the
headline tables come from a run without it.

CPU-sized defaults (the embedded pair on a 2-core machine): the project's prompt set, 2 prompts per
category (14), 32 new tokens, K = 4, one warm-up round, one measured iteration.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

import torch

from .. import extensions
from ..errors import ConfigError, at_least
from ..progress import note
from ..heads.clustering import check_cluster_count, default_clusters
from ..heads.flashhead import check_probes, default_probes
from ..models import embedl, loading, specs
from .drafts import flash_body, flash_head, flash_info, study_heads
from .disturbance import Watch, available_cores, judge
from .environment import environment
from .execute import execute
from .metrics import summarize
from .modes import THESIS_MODES, Mode, parse_all, profile_modes
from .prompts import TURNS, Prompt, held_out, load_prompts, select
from .runner import Runner
from .runs import Run, check_new_run, one_writer, open_run, record_environment, write_environment


@dataclass
class BenchConfig:
    """Every parameter of a benchmark run (the run folder's ``config.json``)."""

    name: str = "bench"
    out: str = "runs"
    target: str = specs.DEFAULT_TARGET
    draft: str = specs.DEFAULT_DRAFT
    device: str = "cpu"
    draft_device: str | None = None
    dtype: str = "auto"
    draft_dtype: str | None = None  # the draft's precision (models.auto.draft_precision; None: auto)
    pack: bool | None = None  # None: oneDNN-packed linears for float32 on CPU
    k: int = 4
    max_new_tokens: int = 32
    modes: tuple[str, ...] = THESIS_MODES
    prompt_file: str = "project"
    categories: str | None = None
    per_category: int | None = 2
    prompts: int | None = None
    turns: str = "first"
    chat: bool = True
    #: the chat template's thinking switch (Qwen3: ``enable_thinking``); None: the template's default
    thinking: bool | None = None
    warmup: int = 1
    #: a warm-up generation's length (None: ``max_new_tokens``)
    warmup_tokens: int | None = None
    iterations: int = 1
    seed: int = 0
    costs: bool = True
    profile: bool = False
    # FlashHead (modes flash_*)
    probes: int | None = None
    clusters: int | None = None
    assets: str | None = None
    flash_path: str = "auto"
    centroid_dtype: str = "auto"
    cluster_seed: int = 0
    kmeans_iterations: int = 20
    # beyond the thesis: adaptive K (modes *_hk, *_ck), adaptive probes (adaflash_*), the frequency-truncated head
    # (freq_*; None tokens: as many as FlashHead's candidates), speculative sampling (sample_*)
    k_max: int = 12
    adaptive_margin: float | None = None
    adaptive_min_probes: int = 1
    adaptive_max_probes: int | None = None
    freq_tokens: int | None = None
    freq_calibration: int = 3
    freq_tokens_generated: int = 48
    temperature: float = 0.7
    top_k: int | None = 20
    top_p: float | None = 0.8
    # draft-confidence block ends (modes *_sk): the draft's probability below which a block stops
    stop_below: float | None = None
    # token trees (modes *_tree): K deep and tree_width wide, or tree_shape's nodes (rank paths, "0 1 0.0 0.1")
    tree_width: int = 3
    tree_shape: str | None = None
    #: torch's intra-op threads for the run (None: every core this process may use); recorded with the run
    threads: int | None = None

    def __post_init__(self):
        if isinstance(self.modes, str):
            self.modes = tuple(m for m in self.modes.split(",") if m)
        self.modes = tuple(self.modes)
        if self.draft_dtype == "auto":  # the default, one way: a run's name changes only where the draft's does
            self.draft_dtype = None

    @classmethod
    def from_dict(cls, doc: dict) -> "BenchConfig":
        doc = dict(doc)
        for name, value in RETIRED_FIELDS.items():  # a run folder from before a parameter left: its only value
            if doc.pop(name, value) != value:
                raise ConfigError(f"The benchmark parameter {name} has left the library (it was {value!r} in "
                                  f"every run it can still make); this configuration sets it to {doc.get(name)!r}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(f"Unknown benchmark parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
        return cls(**doc)

    @classmethod
    def profiled(cls, schedule: str = "ordinary", **kw) -> "BenchConfig":
        """The profiled run's configuration (as ``thesis-lib profile``): baseline, dense, dense-shared and
        FlashHead drafts with one schedule, one prompt per category unless told otherwise."""
        kw.setdefault("name", "profile")
        kw.setdefault("per_category", 1)
        return cls(profile=True, modes=profile_modes(schedule), **kw)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["modes"] = list(self.modes)
        return d

    def identity(self) -> dict:
        """:meth:`to_dict` without the parameters added after the first runs where they keep their defaults: what
        names a run, so runs made before those parameters existed keep their names."""
        d = self.to_dict()
        defaults = BenchConfig()
        for name in LATER_FIELDS:
            if d[name] == getattr(defaults, name):
                del d[name]
        d.update(RETIRED_IDENTITY)  # as every run had them, so that runs keep their names
        return d

    @property
    def path(self) -> Path:
        return Path(self.out) / self.name

    @cached_property
    def parsed(self) -> tuple[Mode, ...]:
        """The run's modes, parsed once (a bad list is a ``ConfigError``)."""
        return parse_all(self.modes)

    @property
    def needs_flash(self) -> bool:
        return any(m.flash for m in self.parsed)

    def drafts(self) -> set[str]:
        return {m.draft for m in self.parsed}

    def largest_block(self) -> int:
        """The most tokens one verify forward of this run can score: the largest K of any mode (``k_max`` for the
        block-length policies and the confidence stop, which the runner bounds by it) plus the deferred schedule's
        carried token; 1 (one decoded token) for a run of no mode of ours that verifies blocks."""
        ks = [self.k_max if m.policy != "fixed" else m.k or self.k
              for m in self.parsed if (m.speculative or m.sampled) and m.base != "sample_baseline" and not m.shaped]
        trees = [len(self.tree_shape.split()) if self.tree_shape and m.name == m.base else
                 m.nodes or (m.k or self.k) * (m.width or self.tree_width) for m in self.parsed if m.shaped]
        return max(ks + trees, default=0) + 1

    def calibration_prompts(self) -> list[Prompt]:
        """The frequency head's counting prompts: per category, the first ``freq_calibration`` prompts of the
        prompt file that the run does not measure."""
        return held_out(load_prompts(self.prompt_file), self.check_prompts(), self.freq_calibration)

    def check_prompts(self) -> list[Prompt]:
        return select(load_prompts(self.prompt_file), self.categories, self.prompts, self.per_category)

    def check_name(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"The run name must be a plain folder name (got {self.name!r}).")

    def check(self) -> list[Prompt]:
        """Every cheap check; returns the selected prompts. Loads no weights."""
        self.check_name()
        at_least("K", self.k), at_least("max_new_tokens", self.max_new_tokens), at_least("iterations", self.iterations)
        at_least("warmup", self.warmup, 0), at_least("warmup_tokens", self.warmup_tokens, none=True)
        at_least("threads", self.threads, none=True)
        if self.turns not in TURNS:
            raise ConfigError(f"Unknown turns policy {self.turns!r}; use one of {', '.join(TURNS)}.")
        self.parsed
        for name, device, dtype in (("device", self.device, self.dtype),
                                    ("draft_device", self.draft_device, self.draft_dtype)):
            loading.check_device(device, name)
            if dtype not in (None, "auto", "same"):
                loading.resolved_dtype(dtype, device or self.device)
        extensions.runner_options(self, self.parsed)  # the study loops' settings (a tree's shape, a warp), checked
        if self.profile:
            bad = [m.name for m in self.parsed if m.draft == "hf"]
            if bad:
                raise ConfigError(f"A profiled run times this library's loops only; drop {', '.join(bad)}.")
        prompts = self.check_prompts()
        if self.needs_flash:
            check_flash(self)
        check_beyond(self)
        for spec in (self.target, self.draft):
            specs.check_available(spec)
        specs.check_context(self.target, self.max_new_tokens + self.largest_block(),
                            f"max_new_tokens {self.max_new_tokens} and a block of {self.largest_block()}")
        return prompts


#: Parameters added after the first runs; a run folder written before them holds none of them (their defaults apply).
LATER_FIELDS = ("k_max", "adaptive_margin", "adaptive_min_probes", "adaptive_max_probes", "freq_tokens",
                "freq_calibration", "freq_tokens_generated", "temperature", "top_k", "top_p", "stop_below",
                "thinking", "threads", "tree_width", "tree_shape", "draft_dtype")
#: Parameters that have left the library, with the one value runs may still hold (from_dict drops them there).
RETIRED_FIELDS = {"outliers": 0.0, "split_threads": False}
#: Retired parameters that named runs (outside LATER_FIELDS): the identity keeps them at their value.
RETIRED_IDENTITY = {"outliers": 0.0}


def check_flash(cfg) -> None:
    """FlashHead parameters checked against the draft's config.json before any weights load (the probe counts
    of the modes' variants included)."""
    if cfg.probes is not None and cfg.probes < 1:
        raise ConfigError(f"probes must be >= 1 (got {cfg.probes}).")
    variants = [m.probes for m in getattr(cfg, "parsed", ()) if m.probes is not None]
    if cfg.assets:
        checkpoint = embedl.resolve(cfg.assets, fetch_assets=False)  # a folder, or a hub checkpoint's config
        if checkpoint.n_clusters:
            for p in ([cfg.probes] if cfg.probes is not None else []) + variants:
                check_probes(p, int(checkpoint.n_clusters))
        return
    vocab = specs.model_config(cfg.draft).get("vocab_size")
    if vocab:
        c = cfg.clusters if cfg.clusters is not None else default_clusters(vocab)
        check_cluster_count(vocab, c)
        for p in [cfg.probes if cfg.probes is not None else default_probes(c)] + variants:
            check_probes(p, c)


def check_beyond(cfg) -> None:
    """The beyond-the-thesis parameters, checked before any weights load."""
    drafts = cfg.drafts()
    if not isinstance(cfg.k_max, int) or cfg.k_max < max(1, cfg.k if isinstance(cfg.k, int) else 1):
        raise ConfigError(f"k_max must be an integer >= K (got {cfg.k_max!r}, K = {cfg.k!r}).")
    if "adaflash" in drafts:
        if cfg.adaptive_margin is None:
            raise ConfigError("The adaflash modes need adaptive_margin (the centroid-score margin, in units of |h|).")
        if cfg.adaptive_margin < 0 or cfg.adaptive_min_probes < 1:
            raise ConfigError("adaptive_margin must be >= 0 and adaptive_min_probes >= 1.")
        if cfg.adaptive_max_probes is not None and cfg.adaptive_max_probes < cfg.adaptive_min_probes:
            raise ConfigError("adaptive_max_probes must be >= adaptive_min_probes.")
    if "freq" in drafts:
        at_least("freq_tokens", cfg.freq_tokens, none=True)
        if cfg.freq_calibration < 1 or cfg.freq_tokens_generated < 1:
            raise ConfigError("freq_calibration and freq_tokens_generated must be >= 1.")
        if not cfg.calibration_prompts():
            raise ConfigError("No calibration prompts are left for the frequency head: the run measures them all.")
    confident = [m.name for m in cfg.parsed if m.policy == "confidence"]
    if confident:
        if cfg.stop_below is None or not 0 < cfg.stop_below < 1:
            raise ConfigError(f"The modes {', '.join(confident)} need stop_below, a probability in (0, 1) "
                              f"(got {cfg.stop_below!r}).")


def run(config: BenchConfig | dict, *, resume: bool = False, replace: bool = False, progress: bool = True,
        loaded: tuple | None = None) -> Run:
    """Execute a benchmark run into ``config.out/config.name``; returns the completed :class:`Run`.

    ``loaded``: an already loaded ``(target, draft)`` pair, or ``(target, draft, flash_head)``, to share
    between several runs of one session (their specs must be the configuration's)."""
    cfg = config if isinstance(config, BenchConfig) else BenchConfig.from_dict(config)
    started = time.perf_counter()
    cfg.check_name()
    check_new_run(cfg.path, cfg.to_dict(), resume=resume, replace=replace)  # first: it touches no model file
    prompts = cfg.check()
    with one_writer(cfg.path):  # a second writer of this folder is refused, naming the first
        return _run(cfg, prompts, started, resume=resume, replace=replace, progress=progress, loaded=loaded)


def _run(cfg: BenchConfig, prompts: list[Prompt], started: float, *, resume: bool, replace: bool, progress: bool,
         loaded: tuple | None) -> Run:
    torch.set_num_threads(cfg.threads or available_cores())
    if loaded is not None:
        target, draft, *rest = loaded
        if (target.spec, draft.spec) != (cfg.target, cfg.draft):
            raise ConfigError(f"The loaded pair ({target.spec}, {draft.spec}) is not the configuration's "
                              f"({cfg.target}, {cfg.draft}).")
        head = rest[0] if rest and rest[0] is not None and cfg.needs_flash else None
        if head is not None and cfg.probes is not None:
            head.with_probes(cfg.probes)
    else:
        target, draft = loading.load_pair(cfg.target, cfg.draft, device=cfg.device, draft_device=cfg.draft_device,
                                         dtype=cfg.dtype, pack=cfg.pack, progress=progress,
                                         draft_dtype=cfg.draft_dtype)
        head = None
    for lm in (target, draft):  # the exactness record covers every block this run can verify
        loading.probe_rows(lm, cfg.largest_block())
    if head is None and cfg.needs_flash:
        head = flash_head(cfg, draft, flash_body(cfg, draft, progress=progress))
    extra_heads, beyond = study_heads(cfg, draft, head, progress=progress) if head is not None else ({}, {})
    runner = Runner(target, draft, k=cfg.k, max_new_tokens=cfg.max_new_tokens, flash_head=head, profile=cfg.profile,
                    extra_heads=extra_heads, k_max=cfg.k_max, seed=cfg.seed, stop_below=cfg.stop_below,
                    **extensions.runner_options(cfg, cfg.parsed))
    folder = open_run(cfg.path, cfg.to_dict(), resume=resume, replace=replace)
    extra = {"prompts": [p.question_id for p in prompts]}
    if head is not None:
        extra["flashhead"] = flash_info(head)
    if beyond:
        extra["beyond"] = beyond
    record_environment(folder, environment(("target", target), ("draft", draft), extra=extra))
    with Watch() as machine:
        execute(runner, prompts, cfg.parsed, iterations=cfg.iterations, warmup=cfg.warmup,
                warmup_tokens=cfg.warmup_tokens, chat=cfg.chat, thinking=cfg.thinking, turns=cfg.turns,
                costs=cfg.costs, seed=cfg.seed, progress=progress, done=folder.done(), on_record=folder.append,
                desc=cfg.name)
    env = folder.environment
    current = env["resumed"][-1] if env.get("resumed") else env
    current["machine"] = machine.record  # what else ran meanwhile
    if head is not None:  # the path actually taken is known only after the first call (compiled or eager)
        current["flashhead"] = flash_info(head)
    if runner.k_costs is not None:
        env["k_costs"] = runner.k_costs  # the step costs the cost-model K policy planned with
    write_environment(folder, env)
    said = judge(machine.record)
    if said["disturbed"]:
        note(f"run {folder.path.name} was disturbed: {said['why']}; its timings are not the method's alone")
    folder.write_summary(summarize(folder.samples))
    note(f"run folder {folder.path.name}: {len(folder.samples)} samples ({time.perf_counter() - started:.0f} s)")
    return folder
