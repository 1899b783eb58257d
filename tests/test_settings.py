"""The settings, declared in several places, checked against each other: the benchmark configuration
(``BenchConfig``) and the options of ``thesis-lib bench`` / ``profile``; the book's parameter sets, the notebooks'
parameter cells and :class:`~thesis_lib.book.params.Params`. A name added to one and forgotten in another fails
here instead of being dropped without a word."""

from __future__ import annotations

from dataclasses import fields

import pytest

from thesis_lib.bench.protocol import BenchConfig
from thesis_lib.book import execute, params, sizing
from thesis_lib.cli import build_parser

#: BenchConfig fields no option of ``thesis-lib bench`` sets under their own name, and why.
NOT_OPTIONS = {
    "pack": "set by --pack / --no-pack (None: the library picks)",
    "chat": "set by --no-chat",
    "costs": "set by --no-costs",
    "profile": "the profile command's",
    "warmup_tokens": "the book's (WARMUP_TOKENS): a warm-up shorter than the measured length",
    "adaptive_max_probes": "chapter 6's calibration sets it from the head's own probe count",
    "freq_tokens_generated": "chapter 6's calibration sets it to the main run's length",
}
#: Options of ``thesis-lib bench`` that are no BenchConfig field: what to do with the run folder.
RUN_OPTIONS = {"help", "no_chat", "no_costs", "no_pack", "resume", "replace"}
#: Parameter-set keys the planner reads before any notebook runs (book.sizing); the notebooks declare them to
#: show the plan, and Params does not carry them.
PLANNER_KEYS = set(sizing.PLANNER_KEYS)
#: Params fields no parameter cell declares: read by ``thesis-lib book`` itself (the rehearsal's virtual GPUs are
#: set up before a kernel starts), or left at their default in a notebook (progress bars on).
BUILD_FIELDS = {"rehearsal", "progress"}


def _command(name: str):
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[name]


def test_every_benchmark_parameter_is_an_option_of_the_bench_command_or_says_why_not():
    options = {a.dest for a in _command("bench")._actions}
    config = {f.name for f in fields(BenchConfig)}
    assert config - options == set(NOT_OPTIONS), "a BenchConfig field without a bench option (or NOT_OPTIONS is stale)"
    assert options - config == RUN_OPTIONS, "a bench option that sets no BenchConfig field"
    assert {f"no_{n}" for n in ("pack", "chat", "costs")} <= options


def test_the_profile_command_takes_the_same_options_but_the_modes():
    bench = {a.dest for a in _command("bench")._actions}
    profile = {a.dest for a in _command("profile")._actions}
    assert "schedule" in profile and "modes" in bench and "modes" not in profile
    beyond = {"k_max", "adaptive_margin", "adaptive_min_probes", "freq_tokens", "freq_calibration", "temperature",
              "top_k", "top_p", "stop_below"}  # the thesis' drafts only: no setting of the studies' modes
    assert bench - {"modes"} - beyond == profile - {"schedule"}


@pytest.mark.parametrize("set_name", params.parameter_sets())
def test_every_key_of_a_parameter_set_is_a_notebook_parameter_and_a_params_field(set_name):
    values = params.load_parameters(set_name)
    declared = set().union(*(execute.notebook_parameters(n) for n in execute.NOTEBOOKS))
    known = {n.upper() for n in params.Params.names()}
    build = {f.upper() for f in BUILD_FIELDS}
    stray = sorted(k for k in values if k not in PLANNER_KEYS
                   and (k not in known or (k not in declared and k not in build)))
    assert not stray, f"{set_name}: keys no notebook declares or Params lacks: {stray}"


def test_every_notebook_parameter_is_a_params_field_and_every_field_is_declared():
    known = {n.upper() for n in params.Params.names()}
    declared = {}
    for name in execute.NOTEBOOKS:
        for key in execute.notebook_parameters(name):
            declared.setdefault(key, []).append(name)
    assert not {k: v for k, v in declared.items() if k not in known | PLANNER_KEYS}, "parameters Params does not know"
    assert known - set(declared) == {f.upper() for f in BUILD_FIELDS}, "Params fields no notebook declares"


def test_a_study_s_parameters_are_read_checked_and_given_back_beside_the_thesis_own():
    from dataclasses import replace

    from thesis_lib import extensions
    from thesis_lib.errors import ConfigError

    p = params.Params.from_namespace({"K": 2, "TREE_TOKENS": 5, "SERVING_PROMPTS": 4, "NOT_A_PARAMETER": 1}).check()
    assert (p.k, p.tree_tokens, p.serving_prompts, p.serving_batches) == (2, 5, 4, [1, 4])
    assert params.Params.from_namespace(p.values()) == p and replace(p, k=3).tree_tokens == 5
    q = replace(p, k=3)
    q.tree_tokens = 9  # set in its block, which the copy does not share
    assert (q.tree_tokens, q.values()["TREE_TOKENS"], p.tree_tokens) == (9, 9, 5) and q != replace(p, k=3)
    assert p.bench().k == 2 and p.bench(k=6).k == 6 and p.bench().out == p.runs_dir
    blocks = [params.Params, *extensions.PARAMS]
    assert sum(len(fields(b)) for b in blocks) - 1 == len(params.Params.names()), "two blocks declare one name"
    with pytest.raises(ConfigError, match="SERVING_BATCHES go up to 16 prompts"):
        params.Params.from_namespace({"SERVING_BATCHES": [1, 16]}).check()
    with pytest.raises(ConfigError, match="TREE_TOKENS must be an integer >= 1"):
        params.Params.from_namespace({"TREE_TOKENS": 0}).check()
    with pytest.raises(ConfigError, match="K_SWEEP values must be integers >= 1"):
        params.Params.from_namespace({"K_SWEEP": None}).check()
    params.Params.from_namespace({"EXPLORER_K": None}).check()  # None: the K sweep's values
    with pytest.raises(AttributeError, match="TREE_WIDTH"):
        p.tree_width  # a run's setting (BenchConfig), no book parameter


#: Labels that name the command a saved document was made with, as it was called then (glued beside its numbers).
AS_RUN_THEN = {("src/thesis_lib/book/shared.py", "thesis-lib precision-bench"),
               ("src/thesis_studies/beyond/experiments.py", "thesis-lib sampling-check")}


def test_no_help_text_or_page_names_a_command_that_does_not_exist():
    """Every ``thesis-lib <command>`` (or ``thesis-lib studies <command>``) the code, the README, the usage guide,
    the book's pages, the parameter sets and the notebooks name is a command of the CLI."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    core = set(sub.choices)
    studies = set(next(a for a in sub.choices["studies"]._actions
                       if a.__class__.__name__ == "_SubParsersAction").choices)
    files = [*(root / "src").rglob("*.py"), root / "README.md", root / "docs" / "usage.md", root / "Makefile",
             *(root / "book").glob("*.md"), *(root / "params").glob("*.yaml"), *(root / "notebooks").glob("*.ipynb")]
    named = {(str(f.relative_to(root)), m[0]) for f in files
             for m in re.finditer(r"thesis-lib (studies )?([a-z][a-z-]+)", f.read_text(encoding="utf-8"))
             if m[2] not in (studies if m[1] else core)}
    assert named == AS_RUN_THEN
