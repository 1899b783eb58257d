"""The benchmark's modes: every way this library can decode a prompt, by name (thesis sections 3.3-3.7).

The core's modes are the thesis': ``baseline`` (this library's target-only greedy loop) and ``<draft>_<schedule>``
for greedy speculative decoding, with

- drafts ``dense`` (the draft model with its dense head), ``flash`` (the same body with a FlashHead head) and
  ``shared`` (the thesis' "dense shared" control: the FlashHead draft's body with the dense head, run through its
  own drafter; where the FlashHead draft reuses the dense draft's body, as on the embedded pair, it runs the same
  body and head as ``dense`` and cannot differ from it but by code path and noise);
- schedules ``ordinary`` (section 3.3), ``deferred`` (deferred final-token verification, section 3.6.2) and
  ``pipelined`` (the target's append overlapping the draft's next proposal, section 3.6.1);

and transformers' peers: ``hf_greedy`` (``generate()``, greedy, the peer of ``baseline``), ``hf_assisted``
(``generate(assistant_model=...)`` with the same draft and a constant K, its adaptive schedule and confidence
threshold off, the peer of ``dense_ordinary``) and ``hf_assisted_defaults`` (the same call at transformers' own
settings: 20 draft tokens at most, a block ending where the draft's confidence falls below a threshold that adapts
as it goes where scikit-learn is installed).

The studies add theirs (:data:`thesis_lib.extensions.MODES`), named by the same grammar: more drafts
(``<draft>_deferred``), block-length policies as a suffix (``flash_deferred_ck``), speculative sampling
(``sample_<draft>``, beside ``sample_baseline``) and token trees (``<draft>_tree``).

A greedy speculative mode with the fixed K may name its own K and, with a FlashHead draft, its own probe count:
``flash_deferred@k6``, ``flash_deferred@p148``, ``flash_deferred@k6p148`` (a *variant*); a tree mode also its
width, ``flash_tree@k5w3``, or its node count, ``flash_tree@n12``. A K sweep or a probe grid is then one run whose
every setting is timed beside the same target-only baseline, interleaved, instead of a run per setting each timing
its own baseline.
"""

from __future__ import annotations

import re
from typing import Iterable

from .. import extensions
from ..decoding.greedy import SCHEDULES
from ..errors import ConfigError

#: The thesis' drafts.
DRAFTS = ("dense", "flash", "shared")
#: The thesis' greedy speculative modes: its drafts in its three schedules.
SPEC_MODES = tuple(f"{d}_{s}" for d in DRAFTS for s in SCHEDULES)
PEER_MODES = ("hf_greedy", "hf_assisted")
#: transformers' assisted generation at its own settings: a peer of the studies' token trees, not of the thesis' tables.
DEFAULTS_PEER = "hf_assisted_defaults"
#: The core's modes: target-only, the thesis' nine, transformers' three.
CORE_MODES = ("baseline",) + SPEC_MODES + PEER_MODES + (DEFAULTS_PEER,)
#: ``thesis-lib compare``'s default: no FlashHead (needs a clustering) and no pipelining.
DEFAULT_MODES = ("baseline", "dense_ordinary", "dense_deferred") + PEER_MODES
#: Every mode of the thesis' chapter 4 plus the peers: the benchmark protocol's default.
THESIS_MODES = ("baseline", "dense_ordinary", "flash_ordinary", "dense_deferred", "flash_deferred",
                "dense_pipelined", "flash_pipelined") + PEER_MODES
#: The profiled run's modes (Table 4.7): dense draft, dense-shared control, FlashHead draft.
PROFILE_DRAFTS = ("dense", "shared", "flash")
_VARIANT = re.compile(r"^(?P<base>[a-z_]+)@(?:k(?P<k>[0-9]+))?(?:p(?P<p>[0-9]+))?(?:w(?P<w>[0-9]+))?(?:n(?P<n>[0-9]+))?$")


def _studies(attr: str) -> tuple:
    extensions.load()
    return tuple(x for m in extensions.MODES for x in getattr(m, attr))


def all_modes() -> tuple[str, ...]:
    """The core's modes, then every study's."""
    return CORE_MODES + _studies("names")


def flash_drafts() -> tuple[str, ...]:
    """Drafts that need the run's FlashHead head (their own, or for their candidate count)."""
    return ("flash",) + _studies("flash_drafts")


def probe_drafts() -> tuple[str, ...]:
    """Drafts whose probe count a variant may set (their head is the run's FlashHead head)."""
    return ("flash",) + _studies("probe_drafts")


def confidence_drafts() -> tuple[str, ...]:
    """Drafts whose head gives a confidence (a block that stops at the first unsure token)."""
    return _studies("confidence_drafts")


def shaped_modes() -> tuple[str, ...]:
    """Modes whose variants may name a width or a node count (token trees)."""
    return _studies("shaped")


def k_suffixes() -> dict[str, str]:
    """A mode name's suffix -> the block-length policy it names (``flash_deferred_ck``: ``cost``)."""
    extensions.load()
    return {s: policy for m in extensions.MODES for s, policy in m.k_suffixes}


def is_speculative(mode: str) -> bool:
    """Whether a mode (or a variant) is greedy speculative decoding of ours (a draft proposes, the target verifies)."""
    return split_mode(mode)[0] not in ("baseline", "hf", "sample")


def is_sampled(mode: str) -> bool:
    """Whether a mode samples (its text is random: compared with target-only sampling's speed, not with greedy text);
    a name no study declares does not."""
    return base_mode(mode) in all_modes() and split_mode(mode)[0] == "sample"


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
    if (m["w"] or m["n"]) and (m["base"] not in shaped_modes() or int(m["w"] or m["n"]) < 1 or (m["w"] and m["n"])):
        raise ConfigError(f"{mode}: a width w >= 1 or a node count n >= 1 (not both) applies to the tree modes "
                          f"{', '.join(shaped_modes()) or '(none: no study declares one)'} only.")
    base, k, p = m["base"], int(m["k"]) if m["k"] else None, int(m["p"]) if m["p"] else None
    if base not in all_modes() or not is_speculative(base) or k_policy_of(base) != "fixed":
        raise ConfigError(f"{mode}: only greedy speculative modes with the fixed K take a variant "
                          f"(e.g. flash_deferred@k6); {base} is not one.")
    if k is not None and k < 1:
        raise ConfigError(f"{mode}: K must be >= 1.")
    if p is not None and (p < 1 or base.split("_")[0] not in probe_drafts()):
        raise ConfigError(f"{mode}: a probe count >= 1 applies to the drafts {', '.join(probe_drafts())} only.")
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
    """Whether a mode (or a variant) drafts with the run's FlashHead head (``sample_flash`` too)."""
    if base_mode(mode) not in all_modes():
        return False
    draft, schedule = split_mode(mode)
    return (schedule if draft == "sample" else draft) in flash_drafts()


def split_mode(mode: str) -> tuple[str, str]:
    """``"flash_deferred" -> ("flash", "deferred")``; ``("baseline", "")``, ``("sample", <draft or baseline>)`` and
    ``("hf", ...)`` for the rest; a variant as its base mode."""
    mode = base_mode(mode)
    if mode not in all_modes():
        raise ConfigError(f"Unknown mode {mode!r}; known: {', '.join(all_modes())}.")
    if mode == "baseline":
        return "baseline", ""
    if mode.startswith(("sample_", "hf_")):
        kind, rest = mode.split("_", 1)
        return kind, rest
    d, s = mode.split("_")[:2]
    return d, s


def k_policy_of(mode: str) -> str:
    """``fixed``, or the block-length policy a mode's suffix names (a study's: ``heuristic``, ``cost``, ...)."""
    mode = base_mode(mode)
    if mode not in all_modes() or not is_speculative(mode):
        return "fixed"
    return k_suffixes().get(mode.rsplit("_", 1)[-1], "fixed")


def baseline_of(mode: str) -> str:
    """The mode a mode's speed is compared with: target-only sampling for sampling modes, else greedy."""
    return "sample_baseline" if is_sampled(mode) else "baseline"


def check_modes(modes: Iterable[str]) -> tuple[str, ...]:
    modes = tuple(modes)
    unknown = [m for m in modes if base_mode(m) not in all_modes()]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {', '.join(unknown)}; known: {', '.join(all_modes())}.")
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
