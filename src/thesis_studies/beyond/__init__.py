"""Chapter 6, beyond the thesis: adaptive probes and block lengths, the co-designed head, the frequency-truncated
head and lookahead, measured on held-out calibration prompts and judged on the benchmark's
(:mod:`.experiments`); :mod:`.tables` and :mod:`.verdicts` read them, :mod:`.chapter` gives each section's glued
values, :mod:`.figures` draws them; :mod:`.codesign` and :mod:`.lookahead` judge settings without a decoding run
each. Its drafts' heads
(:mod:`.heads`: :mod:`.adaptive`, :mod:`.truncated`) and block-length policies (:mod:`.policies`) plug into the
core's runs, and so do its prompt-lookup drafters (:mod:`.lookup`)."""

from dataclasses import dataclass, field
from functools import partial

from thesis_lib import extensions

from . import experiments, heads, lookup, policies, verdicts


@extensions.parameters
@dataclass
class Parameters:
    """Chapter 6's: its modes and K sweep, the held-out calibration prompts per category, the adaptive head's
    margins and least probe count, the co-designed cluster sizes, the largest K a policy may pick and the
    confidence thresholds tried."""

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


extensions.add_rules(verdicts.RULES)
extensions.BOOK_RUNS.append(experiments.k_sweep_config)
extensions.MODES.append(extensions.Modes(
    names=(tuple(f"{d}_deferred" for d in ("ngram", "adaflash", "freq", "hybrid"))
           + tuple(f"{d}_{s}_{x}" for d in ("dense", "flash") for s in ("ordinary", "deferred") for x in ("hk", "ck", "sk"))
           + ("hybrid_deferred_sk",)),
    flash_drafts=("adaflash", "freq", "hybrid"), probe_drafts=("hybrid",), confidence_drafts=("dense", "flash", "hybrid"),
    k_suffixes=(("hk", "heuristic"), ("ck", "cost"), ("sk", "confidence"))))
extensions.DRAFTERS.append(lookup.make)
extensions.DRAFT_HEADS.update(adaflash=heads.adaptive_head, freq=heads.truncated_head)
extensions.K_POLICIES.update(heuristic=extensions.KPolicy(partial(policies.make_policy, "heuristic")),
                             cost=extensions.KPolicy(partial(policies.make_policy, "cost"), needs_costs=True))
