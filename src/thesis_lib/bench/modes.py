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
from dataclasses import dataclass, replace
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


def declared(attr: str) -> tuple:
    """What the studies declare under ``attr`` of :class:`thesis_lib.extensions.Modes` (their mode names, drafts that
    need the run's FlashHead head, drafts whose probe count a variant may set, drafts whose head gives a confidence,
    tree modes, ``(suffix, policy)`` pairs), every study's in turn."""
    return tuple(x for m in extensions.MODES for x in getattr(m, attr))


def all_modes() -> tuple[str, ...]:
    """The core's modes, then every study's."""
    return CORE_MODES + declared("names")


@dataclass(frozen=True)
class Mode:
    """A mode, parsed once where its name enters (:func:`parse`): what every layer below reads.

    ``name``: as written, a variant included (a run's samples are keyed by it); ``base``: the mode a variant is of;
    ``draft``: ``baseline``, ``hf``, ``sample`` or the draft that proposes (``flash``); ``schedule``: that draft's
    schedule (``deferred``; for ``hf_*`` and ``sample_*`` the rest of the name: ``greedy``, ``flash``); ``k``,
    ``probes``, ``width``, ``nodes``: a variant's own settings (None: the run's); ``policy``: ``fixed`` or the
    block-length policy a suffix names (``flash_deferred_ck``: ``cost``); ``speculative``: greedy speculative
    decoding of ours (a draft proposes, the target verifies); ``sampled``: it samples (its text is random: compared
    with target-only sampling's speed, not with greedy text); ``flash``: it drafts with the run's FlashHead head
    (``sample_flash`` too); ``shaped``: a token tree, whose variants may name a width or a node count."""

    name: str
    base: str
    draft: str
    schedule: str
    k: int | None = None
    probes: int | None = None
    width: int | None = None
    nodes: int | None = None
    policy: str = "fixed"
    speculative: bool = False
    sampled: bool = False
    flash: bool = False
    shaped: bool = False

    def __str__(self) -> str:
        return self.name

    @property
    def baseline(self) -> str:
        """The mode this one's speed is compared with: target-only sampling for a sampling mode, else greedy."""
        return "sample_baseline" if self.sampled else "baseline"


def parse(mode: "str | Mode") -> Mode:
    """The one place a mode's name is read: ``"flash_deferred@k6p148"`` -> its :class:`Mode` (a Mode: itself). An
    unknown name, or a malformed or disallowed variant, is a :class:`ConfigError` that says what may be set where."""
    if isinstance(mode, Mode):
        return mode
    known, base, k, p, w, n = all_modes(), mode, None, None, None, None
    if "@" in mode:
        m = _VARIANT.match(mode)
        if not m or not (m["k"] or m["p"] or m["w"] or m["n"]):
            raise ConfigError(f"Malformed mode variant {mode!r}: write <mode>@k<K>, <mode>@p<probes> or "
                              "<mode>@k<K>p<probes>, e.g. flash_deferred@k6p148 (a tree mode also w<width> or "
                              "n<nodes>: flash_tree@k5w3, flash_tree@n12).")
        base, (k, p, w, n) = m["base"], (int(x) if x else None for x in m.group("k", "p", "w", "n"))
        if (w is not None or n is not None) and (base not in declared("shaped") or (w if w is not None else n) < 1
                                                 or (w is not None and n is not None)):
            raise ConfigError(f"{mode}: a width w >= 1 or a node count n >= 1 (not both) applies to the tree modes "
                              f"{', '.join(declared('shaped')) or '(none: no study declares one)'} only.")
        if base not in known or not _base(base).speculative or _base(base).policy != "fixed":
            raise ConfigError(f"{mode}: only greedy speculative modes with the fixed K take a variant "
                              f"(e.g. flash_deferred@k6); {base} is not one.")
        if k is not None and k < 1:
            raise ConfigError(f"{mode}: K must be >= 1.")
        probed = ("flash",) + declared("probe_drafts")
        if p is not None and (p < 1 or base.split("_")[0] not in probed):
            raise ConfigError(f"{mode}: a probe count >= 1 applies to the drafts {', '.join(probed)} only.")
    if base not in known:
        raise ConfigError(f"Unknown mode {base!r}; known: {', '.join(known)}.")
    return replace(_base(base), name=mode, k=k, probes=p, width=w, nodes=n)


def _base(base: str) -> Mode:
    """A known mode name without a variant, parsed."""
    if base == "baseline":
        draft, schedule = "baseline", ""
    elif base.startswith(("sample_", "hf_")):
        draft, schedule = base.split("_", 1)
    else:
        draft, schedule = base.split("_")[:2]
    speculative, sampled = draft not in ("baseline", "hf", "sample"), draft == "sample"
    return Mode(name=base, base=base, draft=draft, schedule=schedule, speculative=speculative, sampled=sampled,
                policy=dict(declared("k_suffixes")).get(base.rsplit("_", 1)[-1], "fixed") if speculative else "fixed",
                flash=(schedule if sampled else draft) in ("flash",) + declared("flash_drafts"),
                shaped=base in declared("shaped"))


def variant(mode: str, k: int | None = None, probes: int | None = None, width: int | None = None) -> str:
    """The variant of ``mode`` at its own K, probe count and (a tree) width (checked): ``variant("flash_deferred", 6,
    148)`` is ``"flash_deferred@k6p148"``; none given: the mode itself."""
    if k is None and probes is None and width is None:
        return mode
    name = (f"{mode}@" + (f"k{k}" if k is not None else "") + (f"p{probes}" if probes is not None else "")
            + (f"w{width}" if width is not None else ""))
    parse(name)
    return name


def parse_all(modes: Iterable["str | Mode"]) -> tuple[Mode, ...]:
    """A run's modes, parsed: none unknown (all named at once), at least one, none twice."""
    names = tuple(str(m) for m in modes)
    for name in names:
        if "@" in name:
            parse(name)  # a malformed or disallowed variant says so first
    known = all_modes()
    unknown = [m for m in names if m.split("@")[0] not in known]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {', '.join(unknown)}; known: {', '.join(known)}.")
    if not names:
        raise ConfigError("No modes selected.")
    if len(set(names)) != len(names):
        raise ConfigError(f"A mode is listed twice: {', '.join(names)}.")
    return tuple(parse(m) for m in names)


def profile_modes(schedule: str = "ordinary") -> tuple[str, ...]:
    """The profiled run's modes (Table 4.7): baseline plus dense, dense-shared and FlashHead drafts."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"Unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
    return ("baseline",) + tuple(f"{d}_{schedule}" for d in PROFILE_DRAFTS)
