"""The benchmark's modes: every way this library can decode a prompt, by name (thesis sections 3.3-3.7).

A mode is ``baseline`` (this library's target-only greedy loop), ``<draft>_<schedule>`` for greedy
speculative decoding, optionally with a block-length suffix (:data:`SPEC_MODES` lists which), a ``sample_*``
mode, or a peer from transformers:

- drafts: ``dense`` (the draft model with its dense head), ``flash`` (the same body with a FlashHead head),
  ``shared`` (the thesis' "dense shared" control: the FlashHead draft's body with the dense head, run through
  its own drafter; where the FlashHead draft reuses the dense draft's body, as on the embedded pair, it runs
  the same body and head as ``dense`` and cannot differ from it but by code path and noise), and beyond the thesis ``ngram`` (prompt lookup), ``adaflash``
  (adaptive probes), ``freq`` (the frequency-truncated head) and ``hybrid`` (lookup + FlashHead draft);
- schedules: ``ordinary`` (section 3.3), ``deferred`` (deferred final-token verification, section 3.6.2),
  ``pipelined`` (the target's append overlapping the draft's next proposal, section 3.6.1);
- suffixes ``_hk`` / ``_ck`` / ``_sk``: transformers' +2/-1 heuristic, the cost-model K, or a block that ends
  at the draft's first unsure token;
- ``sample_baseline`` / ``sample_dense`` / ``sample_flash``: target-only and speculative sampling;
- ``dense_tree`` / ``flash_tree`` (beyond the thesis): token trees drafted from the draft head's ranked candidates
  and verified in one target forward, deferred schedule (:mod:`thesis_lib.decoding.trees`); K is the tree's
  depth, the run's ``tree_width`` its most nodes per depth (or ``tree_shape`` names every node);
- ``hf_greedy``: transformers' ``generate()``, greedy, the peer of ``baseline``; ``hf_assisted``:
  ``generate(assistant_model=...)`` with the same draft and a constant K (its adaptive schedule and
  confidence threshold off), the peer of ``dense_ordinary``; ``hf_assisted_defaults``: the same call at
  transformers' own settings (20 draft tokens at most, a block ending where the draft's confidence falls below a
  threshold that adapts as it goes where scikit-learn is installed).

A greedy speculative mode with the fixed K may name its own K and, with a FlashHead draft, its own probe count:
``flash_deferred@k6``, ``flash_deferred@p148``, ``flash_deferred@k6p148`` (a *variant*); a tree mode also its
width, ``flash_tree@k5w3`` (a beam, :meth:`~thesis_lib.decoding.trees.TreeShape.beam`), or its node count,
``flash_tree@n12`` (the grown tree of that size, at most K deep with ``@k``, :meth:`~thesis_lib.decoding.trees.TreeShape.grown`). A K sweep or a probe grid
is then one run whose every setting is timed beside the same target-only baseline, interleaved, instead of a run
per setting each timing its own baseline.
"""

from __future__ import annotations

import re
from typing import Iterable

from ..decoding.greedy import SCHEDULES
from ..errors import ConfigError

#: ngram: prompt lookup, no draft model; adaflash: FlashHead with adaptive probes; freq: the frequency-truncated
#: head; hybrid: prompt lookup where the text repeats, the FlashHead draft elsewhere.
DRAFTS = ("dense", "flash", "shared", "ngram", "adaflash", "freq", "hybrid")
#: Block-length policies other than the fixed K, as mode suffixes (``flash_deferred_ck``). ``sk``: the draft
#: stops its block at its first token below the confidence threshold ``stop_below``, at most ``k_max``
#: tokens (lookup blocks of the hybrid: what matched, up to ``k_max``).
K_SUFFIXES = {"hk": "heuristic", "ck": "cost", "sk": "confidence"}
#: Drafts whose head gives a confidence (``sk`` modes).
CONFIDENCE_DRAFTS = ("dense", "flash", "hybrid")
PEER_MODES = ("hf_greedy", "hf_assisted")
#: transformers' assisted generation at its own settings: a peer of the tree modes, not of the thesis' tables.
DEFAULTS_PEER = "hf_assisted_defaults"
#: Token trees (deferred schedule): K their depth, a width per run or per variant.
TREE_MODES = ("dense_tree", "flash_tree")
#: The greedy speculative modes: the thesis' drafts (dense, FlashHead, and the dense-shared control) in its three
#: schedules; the drafts beyond the thesis deferred; the block-length policies on the dense and FlashHead drafts,
#: ordinary and deferred; the confidence stop on the hybrid too.
SPEC_MODES = (tuple(f"{d}_{s}" for d in ("dense", "flash", "shared") for s in SCHEDULES)
              + tuple(f"{d}_deferred" for d in ("ngram", "adaflash", "freq", "hybrid"))
              + tuple(f"{d}_{s}_{x}" for d in ("dense", "flash") for s in ("ordinary", "deferred") for x in K_SUFFIXES)
              + ("hybrid_deferred_sk",) + TREE_MODES)
#: Speculative *sampling* (deferred schedule) and its reference, target-only sampling.
SAMPLE_MODES = ("sample_baseline", "sample_dense", "sample_flash")
ALL_MODES = ("baseline",) + SPEC_MODES + SAMPLE_MODES + PEER_MODES + (DEFAULTS_PEER,)
#: Drafts that need the FlashHead head (their own, or for their candidate count).
FLASH_DRAFTS = ("flash", "adaflash", "freq", "hybrid")
FLASH_MODES = tuple(m for m in SPEC_MODES if m.split("_")[0] in FLASH_DRAFTS) + ("sample_flash",)
#: ``thesis-lib compare``'s default: no FlashHead (needs a clustering) and no pipelining.
DEFAULT_MODES = ("baseline", "dense_ordinary", "dense_deferred") + PEER_MODES
#: Every mode of the thesis' chapter 4 plus the peers: the benchmark protocol's default.
THESIS_MODES = ("baseline", "dense_ordinary", "flash_ordinary", "dense_deferred", "flash_deferred",
                "dense_pipelined", "flash_pipelined") + PEER_MODES
#: The profiled run's modes (Table 4.7): dense draft, dense-shared control, FlashHead draft.
PROFILE_DRAFTS = ("dense", "shared", "flash")


#: Drafts whose probe count a variant may set (their head is the run's FlashHead head).
PROBE_DRAFTS = ("flash", "hybrid")
_VARIANT = re.compile(r"^(?P<base>[a-z_]+)@(?:k(?P<k>[0-9]+))?(?:p(?P<p>[0-9]+))?(?:w(?P<w>[0-9]+))?(?:n(?P<n>[0-9]+))?$")


def variant_of(mode: str) -> tuple[str, int | None, int | None]:
    """``"flash_deferred@k6p148" -> ("flash_deferred", 6, 148)``; a plain mode is its own base, ``(mode, None,
    None)``. A malformed or disallowed variant is a :class:`ConfigError` that says what may be set where."""
    if "@" not in mode:
        return mode, None, None
    m = _VARIANT.match(mode)
    if not m or not (m["k"] or m["p"] or m["w"] or m["n"]):
        raise ConfigError(f"Malformed mode variant {mode!r}: write <mode>@k<K>, <mode>@p<probes> or "
                          "<mode>@k<K>p<probes>, e.g. flash_deferred@k6p148 (a tree mode also w<width> or "
                          "n<nodes>: flash_tree@k5w3, flash_tree@n12).")
    if (m["w"] or m["n"]) and (m["base"] not in TREE_MODES or int(m["w"] or m["n"]) < 1 or (m["w"] and m["n"])):
        raise ConfigError(f"{mode}: a width w >= 1 or a node count n >= 1 (not both) applies to the tree modes "
                          f"{', '.join(TREE_MODES)} only.")
    base, k, p = m["base"], int(m["k"]) if m["k"] else None, int(m["p"]) if m["p"] else None
    if base not in SPEC_MODES or k_policy_of(base) != "fixed":
        raise ConfigError(f"{mode}: only greedy speculative modes with the fixed K take a variant "
                          f"(e.g. flash_deferred@k6); {base} is not one.")
    if k is not None and k < 1:
        raise ConfigError(f"{mode}: K must be >= 1.")
    if p is not None and (p < 1 or base.split("_")[0] not in PROBE_DRAFTS):
        raise ConfigError(f"{mode}: a probe count >= 1 applies to the drafts {', '.join(PROBE_DRAFTS)} only.")
    return base, k, p


def tree_of(mode: str) -> tuple[int | None, int | None]:
    """A tree mode variant's own width and node count (``flash_tree@k5w3 -> (3, None)``, ``flash_tree@n12 -> (None,
    12)``); None where it names none."""
    variant_of(mode)
    m = _VARIANT.match(mode) if "@" in mode else None
    return (int(m["w"]) if m and m["w"] else None), (int(m["n"]) if m and m["n"] else None)


def base_mode(mode: str) -> str:
    """The mode a variant is of (``flash_deferred@k6 -> flash_deferred``); a plain mode itself."""
    return variant_of(mode)[0]


def variant(mode: str, k: int | None = None, probes: int | None = None, width: int | None = None) -> str:
    """The variant of ``mode`` at its own K, probe count and (a tree) width (checked): ``variant("flash_deferred", 6,
    148)`` is ``"flash_deferred@k6p148"``; none given: the mode itself."""
    if k is None and probes is None and width is None:
        return mode
    name = (f"{mode}@" + (f"k{k}" if k is not None else "") + (f"p{probes}" if probes is not None else "")
            + (f"w{width}" if width is not None else ""))
    variant_of(name)
    return name


def needs_flash_head(mode: str) -> bool:
    """Whether a mode (or a variant) drafts with the run's FlashHead head."""
    return base_mode(mode) in FLASH_MODES


def split_mode(mode: str) -> tuple[str, str]:
    """``"flash_deferred" -> ("flash", "deferred")``; ``("baseline", "")`` and ``("hf", ...)`` for the rest; a
    variant as its base mode."""
    mode = base_mode(mode)
    if mode not in ALL_MODES:
        raise ConfigError(f"Unknown mode {mode!r}; known: {', '.join(ALL_MODES)}.")
    if mode in SPEC_MODES:
        d, s = mode.split("_")[:2]
        return d, s
    if mode in SAMPLE_MODES:
        return "sample", mode[len("sample_"):]
    return ("baseline", "") if mode == "baseline" else ("hf", mode[3:])


def k_policy_of(mode: str) -> str:
    """``fixed``, or the block-length policy a mode's suffix names (``heuristic``, ``cost``)."""
    mode = base_mode(mode)
    return K_SUFFIXES.get(mode.rsplit("_", 1)[-1], "fixed") if mode in SPEC_MODES else "fixed"


def baseline_of(mode: str) -> str:
    """The mode a mode's speed is compared with: target-only sampling for sampling modes, else greedy."""
    mode = base_mode(mode)
    return "sample_baseline" if mode in SAMPLE_MODES else "baseline"


def check_modes(modes: Iterable[str]) -> tuple[str, ...]:
    modes = tuple(modes)
    unknown = [m for m in modes if base_mode(m) not in ALL_MODES]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {', '.join(unknown)}; known: {', '.join(ALL_MODES)}.")
    if not modes:
        raise ConfigError("No modes selected.")
    if len(set(modes)) != len(modes):
        raise ConfigError(f"A mode is listed twice: {', '.join(modes)}.")
    return modes


def profile_modes(schedule: str = "ordinary") -> tuple[str, ...]:
    """The profiled run's modes (Table 4.7): baseline plus dense, dense-shared and FlashHead drafts."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"Unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
    return ("baseline",) + tuple(f"{d}_{schedule}" for d in PROFILE_DRAFTS)
