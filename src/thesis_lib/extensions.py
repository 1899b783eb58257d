"""Where studies plug into the core. A study package (this project's ``thesis_studies``, or any package that names a
module in the entry-point group ``thesis_lib.studies``) imports the core and adds to the registries below; the core
never imports a study by name. Reading a registry (``extensions.LOOPS``, ...) first imports every declared study
(:func:`load`, once), so no caller has to remember to.

- :data:`COMMANDS`: functions ``add_parsers(sub)`` that add commands under ``thesis-lib studies``;
- :data:`MODEL_BENCH_PARTS`: parts of ``model-bench`` beyond the thesis' (``embedl``, ``batch``), each a
  :class:`Part`;
- :data:`VERDICT_RULES`: a notebook's glued verdicts computed by a study's rules (as
  :data:`thesis_lib.analysis.verdicts.RULES`);
- :data:`BOOK_RUNS`: functions ``params -> BenchConfig``: a run a study's chapter needs that follows from the
  parameters alone (a scheduled book build runs them with the thesis' own);
- :data:`DRAFT_HEADS`: drafts beyond the thesis' whose head a study builds for a run, each a function
  ``(cfg, draft, flash_head, progress=...) -> (head, what the run folder records)``;
- :data:`K_POLICIES`: block-length policies beyond the thesis' fixed K, each a :class:`KPolicy`;
- :data:`DRAFTERS`: drafters beyond the thesis' that its chain loop runs, each a function ``(runner, stop_below) ->
  {name: drafter}`` (``stop_below``: the confidence-stopped ones; None: the plain ones);
- :data:`LOOPS`: mode families a study decodes with its own loop, each a :class:`Loop`;
- :data:`MODES`: the modes a study adds to the core's (:mod:`thesis_lib.bench.modes`), each a :class:`Modes`;
- :data:`PARAMS`: a study's book parameters (:func:`parameters`), which :class:`thesis_lib.book.params.Params` holds
  beside the thesis' own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

GROUP = "thesis_lib.studies"


@dataclass(frozen=True)
class Part:
    """A model-bench part: ``run(flash_head, states, dense=..., weight=..., reps=..., progress=...)`` returns the
    part's document; ``needs_weight``: it reads the dense output embedding. A part with ``available`` needs an
    optional package: ``available()`` says what is installed (falsy: nothing, and asking for the part is an error
    that says ``missing``), and the book's model bench runs it wherever it is, adding that to its key. ``text(doc)``:
    the part's lines in ``model-bench``'s report."""

    run: Callable
    needs_weight: bool = False
    available: Callable[[], object] | None = None
    missing: str = ""
    text: Callable[[dict], str] | None = None


@dataclass(frozen=True)
class KPolicy:
    """``make(k, measured, deferred=..., draft=..., k_max=...)``: the policy object a speculative loop asks for each
    round's K (``first()``, then ``update(accepted, drafted)``); ``needs_costs``: ``measured`` must hold the
    machine's step costs (:func:`thesis_lib.decoding.costs.measure_costs`)."""

    make: Callable
    needs_costs: bool = False


@dataclass(frozen=True)
class Modes:
    """Mode names a study adds, by the grammar of :mod:`thesis_lib.bench.modes`: ``names``; ``flash_drafts``: drafts
    among them that need the run's FlashHead head; ``probe_drafts``: drafts whose probe count a variant may set;
    ``confidence_drafts``: drafts whose head gives a confidence; ``k_suffixes``: ``(suffix, policy)`` pairs, a name's
    suffix naming a block-length policy; ``shaped``: modes whose variants may name a width or a node count."""

    names: tuple[str, ...]
    flash_drafts: tuple[str, ...] = ()
    probe_drafts: tuple[str, ...] = ()
    confidence_drafts: tuple[str, ...] = ()
    k_suffixes: tuple[tuple[str, str], ...] = ()
    shaped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Loop:
    """A family of modes a study decodes with its own loop: ``claims(draft, schedule)``: a mode is the family's;
    ``drafters(runner)``: its drafters for a runner (built when the runner is, kept in ``runner.loop_drafters``
    under the family's name); ``run(runner, mode, ids, clock)``: one generation (``mode`` the parsed
    :class:`~thesis_lib.bench.modes.Mode` as asked, a variant included, the runner's K and probes set for it;
    ``clock`` None: the loop's own); ``options(settings, modes)`` (``modes`` parsed):
    the runner's keyword arguments the family takes from a run's settings (a ``BenchConfig`` or a command's
    arguments), checked (a bad one is a ``ConfigError``)."""

    claims: Callable
    drafters: Callable
    run: Callable
    options: Callable = lambda settings, modes: {}


#: the registries of the module docstring, by name; read through the module's attributes (:func:`__getattr__`)
_REGISTRIES: dict[str, list | dict] = {"COMMANDS": [], "VERDICT_RULES": {}, "BOOK_RUNS": [], "MODEL_BENCH_PARTS": {},
                                       "DRAFT_HEADS": {}, "K_POLICIES": {}, "MODES": [], "DRAFTERS": [], "LOOPS": {},
                                       "PARAMS": []}


def __getattr__(name: str):
    """``extensions.<REGISTRY>``: the registry, after every declared study has registered itself (:func:`load`)."""
    if name not in _REGISTRIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load()
    return _REGISTRIES[name]


def parameters(block: type) -> type:
    """Register a study's book parameters: a dataclass whose fields are the lower-cased names of UPPER_CASE
    parameters, with their defaults, and an optional ``check()`` that raises a ``ConfigError`` on a bad value."""
    _REGISTRIES["PARAMS"].append(block)
    return block


_state = "new"  # "loading" while the studies import (their own reads and additions then go straight through)
_lock = threading.RLock()  # another thread's first read waits for the loading one; the loading thread re-enters


def load() -> None:
    """Import every study declared in the entry-point group (once); each registers itself on import. A study that
    fails to import fails every read, not just the first."""
    global _state
    if _state == "loaded":
        return
    with _lock:
        if _state != "new":
            return
        _state = "loading"
        try:
            for ep in entry_points(group=GROUP):
                ep.load()
        except BaseException:
            _state = "new"
            raise
        _state = "loaded"


def add_rules(rules: dict[str, dict]) -> None:
    """A study's verdict rules, per notebook (as :data:`thesis_lib.analysis.verdicts.RULES`)."""
    for notebook, by_key in rules.items():
        _REGISTRIES["VERDICT_RULES"].setdefault(notebook, {}).update(by_key)


def runner_options(settings, modes) -> dict:
    """Every study loop's runner keyword arguments from ``settings`` for the parsed ``modes`` (:attr:`Loop.options`),
    checked."""
    return {key: value for loop in __getattr__("LOOPS").values() for key, value in loop.options(settings, modes).items()}
