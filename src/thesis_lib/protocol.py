"""The benchmark protocol (thesis section 3.7): one configuration in, one run folder out.

:class:`BenchConfig` names everything that decides a measurement: models, devices, precision, K, max new
tokens, modes, FlashHead parameters, prompt selection, warm-up and measured iterations, seed, and where the
run folder goes. :func:`run` checks it all cheaply (bad K, unknown mode or category, no prompts, probes out of
range, an existing run folder, unknown models, mismatched tokenizers) before loading any weights, then loads
the pair, builds the FlashHead head if a mode needs it, records the environment, executes the measured set
(``bench.execute``) writing each sample to the run folder as it finishes, and writes the summary.

The CLI (``thesis-lib bench`` / ``thesis-lib profile``) and the notebooks call this same function with the
same parameters. ``profile=True`` is the diagnostic run of Tables 4.7/4.8 (``bench.PROFILE_DRAFTS`` with
one schedule, instrumented drafters): its absolute speeds carry the instrumentation's overhead, so the
headline tables come from a run without it.

CPU-sized defaults (the embedded pair on a 2-core machine): the project's prompt set, 2 prompts per
category (14), 32 new tokens, K = 4, one warm-up round, one measured iteration.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import models
from .bench import PROFILE_DRAFTS, THESIS_MODES, Runner, check_modes, execute, split_mode, summarize
from .decoding import SCHEDULES
from .errors import ConfigError
from .prompts import TURNS, Prompt, load_prompts, select
from .results import Run, check_new_run, environment, open_run, record_environment, write_environment


@dataclass
class BenchConfig:
    """Every parameter of a benchmark run (the run folder's ``config.json``)."""

    name: str = "bench"
    out: str = "runs"
    target: str = models.DEFAULT_TARGET
    draft: str = models.DEFAULT_DRAFT
    device: str = "cpu"
    draft_device: str | None = None
    dtype: str = "auto"
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
    warmup: int = 1
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
    outliers: float = 0.0
    cluster_seed: int = 0
    kmeans_iterations: int = 20

    def __post_init__(self):
        if isinstance(self.modes, str):
            self.modes = tuple(m for m in self.modes.split(",") if m)
        self.modes = tuple(self.modes)

    @classmethod
    def from_dict(cls, doc: dict) -> "BenchConfig":
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

    @property
    def path(self) -> Path:
        return Path(self.out) / self.name

    @property
    def needs_flash(self) -> bool:
        return any(split_mode(m)[0] == "flash" for m in self.modes)

    def check(self) -> list[Prompt]:
        """Every cheap check; returns the selected prompts. Loads no weights."""
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"The run name must be a plain folder name (got {self.name!r}).")
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"K must be an integer >= 1 (got {self.k!r}).")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1 (got {self.max_new_tokens!r}).")
        if self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1 (got {self.iterations}).")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0 (got {self.warmup}).")
        if self.turns not in TURNS:
            raise ConfigError(f"Unknown turns policy {self.turns!r}; use one of {', '.join(TURNS)}.")
        check_modes(self.modes)
        if self.profile:
            bad = [m for m in self.modes if split_mode(m)[0] == "hf"]
            if bad:
                raise ConfigError(f"A profiled run times this library's loops only; drop {', '.join(bad)}.")
        prompts = select(load_prompts(self.prompt_file), self.categories, self.prompts, self.per_category)
        if self.needs_flash:
            check_flash(self)
        for spec in (self.target, self.draft):
            models.check_available(spec)
        return prompts


def profile_modes(schedule: str = "ordinary") -> tuple[str, ...]:
    """The profiled run's modes (Table 4.7): baseline plus dense, dense-shared and FlashHead drafts."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"Unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
    return ("baseline",) + tuple(f"{d}_{schedule}" for d in PROFILE_DRAFTS)


def check_flash(cfg) -> None:
    """FlashHead parameters checked against the draft's config.json before any weights load."""
    from .clustering import check_cluster_count
    from .flashhead import check_probes, default_probes

    if not 0 <= cfg.outliers < 1:
        raise ConfigError(f"outliers must lie in [0, 1) (got {cfg.outliers}).")
    if cfg.probes is not None and cfg.probes < 1:
        raise ConfigError(f"probes must be >= 1 (got {cfg.probes}).")
    if cfg.assets:
        if not Path(cfg.assets).is_dir():
            raise ConfigError(f"The FlashHead assets {cfg.assets!r}: this path is not a folder.")
        return
    vocab = json.loads((models.local_dir(cfg.draft) / "config.json").read_text()).get("vocab_size")
    if vocab:
        c = cfg.clusters if cfg.clusters is not None else vocab // 16
        check_cluster_count(vocab, c)
        check_probes(cfg.probes if cfg.probes is not None else default_probes(c), c)


def flash_head(cfg, draft):
    """The FlashHead head for ``draft`` as the configuration asks (assets, or our cached clustering)."""
    from .flashhead import flashhead_for

    return flashhead_for(draft, assets=cfg.assets, n_clusters=cfg.clusters, n_probes=cfg.probes,
                         seed=cfg.cluster_seed, iterations=cfg.kmeans_iterations, path=cfg.flash_path,
                         centroid_dtype=cfg.centroid_dtype, outliers=cfg.outliers)


def flash_info(head) -> dict:
    return {"n_clusters": head.n_clusters, "n_probes": head.n_probes, "path": head.active_path,
            "centroid_dtype": str(head.centroid_dtype).replace("torch.", ""),
            "candidates": head.candidates_per_step(), "cluster_size": head.cluster_size,
            "always_scored_outliers": head.always_scored_outliers,
            "clustering": {k: v for k, v in head.clustering_info.items() if k != "history"}}


def run(config: BenchConfig | dict, *, resume: bool = False, replace: bool = False, progress: bool = True,
        loaded: tuple | None = None) -> Run:
    """Execute a benchmark run into ``config.out/config.name``; returns the completed :class:`Run`.

    ``loaded``: an already loaded ``(target, draft)`` pair, or ``(target, draft, flash_head)``, to share
    between several runs of one session (their specs must be the configuration's)."""
    cfg = config if isinstance(config, BenchConfig) else BenchConfig.from_dict(config)
    prompts = cfg.check()
    check_new_run(cfg.path, cfg.to_dict(), resume=resume, replace=replace)
    if loaded is not None:
        target, draft, *rest = loaded
        if (target.spec, draft.spec) != (cfg.target, cfg.draft):
            raise ConfigError(f"The loaded pair ({target.spec}, {draft.spec}) is not the configuration's "
                              f"({cfg.target}, {cfg.draft}).")
        head = rest[0] if rest and rest[0] is not None and cfg.needs_flash else None
        if head is not None and cfg.probes is not None:
            head.with_probes(cfg.probes)
    else:
        target, draft = models.load_pair(cfg.target, cfg.draft, device=cfg.device, draft_device=cfg.draft_device,
                                         dtype=cfg.dtype, pack=cfg.pack, progress=progress)
        head = None
    if head is None and cfg.needs_flash:
        head = flash_head(cfg, draft)
    runner = Runner(target, draft, k=cfg.k, max_new_tokens=cfg.max_new_tokens, flash_head=head, profile=cfg.profile)
    folder = open_run(cfg.path, cfg.to_dict(), resume=resume, replace=replace)
    extra = {"prompts": [p.question_id for p in prompts]}
    if head is not None:
        extra["flashhead"] = flash_info(head)
    record_environment(folder, environment(("target", target), ("draft", draft), extra=extra))
    execute(runner, prompts, cfg.modes, iterations=cfg.iterations, warmup=cfg.warmup, chat=cfg.chat,
            turns=cfg.turns, costs=cfg.costs, seed=cfg.seed, progress=progress, done=folder.done(),
            on_record=folder.append)
    if head is not None:  # the path actually taken is known only after the first call (compiled or eager)
        env = folder.environment
        current = env["resumed"][-1] if env.get("resumed") else env
        current["flashhead"]["path"] = head.active_path
        write_environment(folder, env)
    folder.write_summary(summarize(folder.samples))
    return folder
