"""Write the mutation-testing report of `make mutation` (mutmut's results in ``mutants/``) as Markdown.

Per module: mutants, killed, survived, not covered by the selected tests, timed out; the score is killed over all
sampled mutants, and again without those listed as equivalent in ``tools/mutation_equivalents.json`` (mutant name ->
why no input tells it from the original). A mutant that ran past its time limit counts as killed: mutmut's limit is
a multiple of the time the same tests took on the unmutated code on the same machine (recorded beside it). Every
survivor is listed with its diff and either that reason or "open". The report names
the revision, date, machine, mutmut version and the tests selected, so it can be read without running anything.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from mutmut import __version__ as mutmut_version
from mutmut.stats import status_by_exit_code

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "tools" / "mutation_equivalents.json"
KILLERS = ROOT / "tools" / "mutation_killers.json"  # mutant name -> the test added to kill it

#: What `make mutation` mutates: module -> its functions in scope (None: all of it). The decoding package whole
#: (its loops included: they carry no decorator that would hide them from mutmut) and the studies' loops and
#: policies, FlashHead, the intervals and the verdict sentences, the core's and the studies', and the target-side
#: code below the loop; pyproject's ``only_mutate`` names the files.
SCOPE = {
    "thesis_lib.decoding.greedy": None,
    "thesis_lib.decoding.drafters": None,
    "thesis_lib.decoding.stats": None,
    "thesis_lib.decoding.rounds": None,
    "thesis_studies.sampling.loop": None,
    "thesis_studies.trees.loop": None,
    "thesis_studies.beyond.lookup": None,
    "thesis_studies.trees.shapes": None,
    "thesis_studies.serving.loops": None,
    "thesis_lib.decoding.state": None,
    "thesis_studies.beyond.policies": None,
    "thesis_lib.decoding.costs": None,
    "thesis_lib.decoding.clocks": None,
    "thesis_lib.heads.flashhead": None,
    "thesis_lib.analysis.uncertainty": None,
    "thesis_lib.analysis.verdicts": None,
    "thesis_studies.precision.verdicts": None,
    "thesis_studies.gpucheck.verdicts": None,
    "thesis_studies.beyond.verdicts": None,
    # below the loop, where the target's exactness lives: the dense head, attention, the packed and
    # weight-only layers (not the kernel's build and loading, nor the page release), the fused norm and rotary, the
    # compact step, the runner and the metrics
    "thesis_lib.heads.dense": None,
    "thesis_lib.models.attention": None,
    "thesis_lib.models.packing": ("PackedLinear.__init__", "PackedLinear.forward", "PackedLinear.weight",
                                  "layer_bias", "is_packed", "float32_rows_floor", "rows_floor", "pack_linears",
                                  "_pack"),
    "thesis_lib.models.weight_only": ("quantize_int8", "WeightOnlyLinear.__init__", "WeightOnlyLinear.forward",
                                      "WeightOnlyLinear.weight", "WeightOnlyLinear.weight_bytes", "quantize_int4",
                                      "pack_int4", "unpack", "head_format", "convert", "_swap"),
    "thesis_lib.models.fused": None,
    "thesis_lib.models.compact": None,
    "thesis_lib.bench.runner": None,
    "thesis_lib.bench.metrics": None,
}


def patterns() -> list[str]:
    """mutmut's mutant-name patterns for :data:`SCOPE` (``mutmut run`` takes them)."""
    out = []
    for module, functions in SCOPE.items():
        if functions is None:
            out.append(f"{module}.*")
            continue
        for f in functions:
            cls, _, meth = f.rpartition(".")
            out.append(f"{module}.xǁ{cls}ǁ{meth}__mutmut_*" if cls else f"{module}.x_{f}__mutmut_*")
    return out


def in_scope(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns())


SAMPLE = ROOT / "mutants" / "sample.json"
#: the samples checked so far, with their revision, machine and each mutant's status (``--record`` appends one)
HISTORY = ROOT / "data" / "reference" / "mutation-samples.json"


#: Modules that moved since earlier samples were checked (issue 63: the studies left the core), old prefix -> new,
#: and the verdict functions that left ``analysis.verdicts`` for a study's; mutmut numbers a mutant within its
#: function, so a moved function's mutants keep their numbers.
MOVED = {"thesis_lib.decoding.batched.": "thesis_studies.serving.loops.",
         "thesis_lib.decoding.policies.": "thesis_studies.beyond.policies.",
         "thesis_lib.decoding.tree_shapes.": "thesis_studies.trees.shapes.",
         "thesis_lib.decoding.sampling.": "thesis_studies.sampling.loop.",
         "thesis_lib.decoding.trees.": "thesis_studies.trees.loop.",
         **{f"thesis_lib.decoding.drafters.{f}": f"thesis_studies.beyond.lookup.{f}"
            for f in ("xǁNgramDrafterǁ", "xǁHybridDrafterǁ", "x__padded__")},
         **{f"thesis_lib.decoding.stats.x_{f}__": f"thesis_lib.decoding.rounds.x_{f}__"
            for f in ("check_request", "cut_at_eos", "finish", "accepted_prefix", "emit_round")},
         "thesis_lib.decoding.stats.x_opening__": "thesis_lib.decoding.rounds.x_prefill__"}
MOVED_VERDICTS = {
    "thesis_studies.precision.verdicts": ("switch_effect", "_with_it", "loop_beyond"),
    "thesis_studies.gpucheck.verdicts": ("gpu_head_target", "gpu_step_target", "gpu_probes_meeting", "step_reach",
                                         "draft_regime", "block_rise", "fewer_kernels", "chained_gain", "one_row",
                                         "compiled_sound"),
    "thesis_studies.beyond.verdicts": ("cheaper", "head_side", "bound_allows", "share_of_room", "stop_trade",
                                       "smaller_here", "furthest_off", "walk_counts"),
}


def current(name: str) -> str:
    """A mutant's name today, for a name recorded before its module or function moved."""
    for old, new in MOVED.items():
        if name.startswith(old):
            return new + name[len(old):]
    prefix = "thesis_lib.analysis.verdicts.x_"
    if name.startswith(prefix):
        function = name[len(prefix):].rsplit("__mutmut_", 1)[0]
        for module, functions in MOVED_VERDICTS.items():
            if function in functions:
                return f"{module}.x_{name[len(prefix):]}"
    return name


def history() -> dict:
    """The recorded samples, each mutant under its name today (:func:`current`)."""
    doc = json.loads(HISTORY.read_text(encoding="utf-8")) if HISTORY.is_file() else {"samples": []}
    for past in doc["samples"]:
        past["status"] = {current(n): st for n, st in past["status"].items()}
    return doc


def sample(n: int, seed: int = 0) -> list[str]:
    """``n`` mutants drawn uniformly (seeded) from those in scope that mutmut generated and no earlier sample
    checked (a fresh sample is not biased by tests written for an earlier one's survivors); remembered in
    ``mutants/sample.json`` so that the report scores that sample and ``--record`` keeps it."""
    seen = {name for past in history()["samples"] for name in past["status"]}
    names = sorted(n_ for meta in (ROOT / "mutants").rglob("*.py.meta")
                   for n_ in json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if in_scope(n_))
    if not names:
        raise SystemExit("no mutants under mutants/: let mutmut generate them first")
    fresh = [n_ for n_ in names if n_ not in seen]
    chosen = sorted(random.Random(seed).sample(fresh, min(n, len(fresh))))
    SAMPLE.write_text(json.dumps({"seed": seed, "population": len(fresh), "names": chosen}, indent=1))
    return chosen


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95 % by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid, half = (p + z * z / (2 * n)), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


#: mutmut's statuses as the report counts them: a type checker's catch is a kill; a child killed by its hard CPU
#: limit shows as a "segfault", so it counts as a timeout; the rest stay as they are
FOLD = {"caught by type check": "killed", "segfault": "timeout"}


def results() -> dict[str, str]:
    """Mutant name -> status (mutmut's, folded by :data:`FOLD`) of the newest run's sample (all mutants in scope
    where no sample was drawn), from the ``.meta`` files under ``mutants/``."""
    out = {}
    chosen = set(json.loads(SAMPLE.read_text())["names"]) if SAMPLE.is_file() else None
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"].items():
            if in_scope(name) and (chosen is None or name in chosen):
                status = status_by_exit_code[code]
                out[name] = FOLD.get(status, status)
    return out


def diff(name: str) -> str:
    shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=ROOT, capture_output=True, text=True)
    return "\n".join(line for line in shown.stdout.splitlines()
                     if line[:1] in "+-" and not line.startswith(("+++", "---")))


def module_of(name: str) -> str:
    return name.split(".x_")[0].split(".xǁ")[0]


def record() -> None:
    """Append the newest run to :data:`HISTORY`: its seed, revision, date, machine, every mutant's status and the
    diff of each one not killed."""
    status = results()
    if not status:
        raise SystemExit("no mutmut results under mutants/: run `make mutation` first")
    drawn = json.loads(SAMPLE.read_text()) if SAMPLE.is_file() else {"seed": None, "population": len(status)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = set(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), []))
    kind = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    h = history()
    h["samples"].append({
        "name": f"seed-{drawn['seed']}" if drawn["seed"] is not None else "whole scope", "seed": drawn["seed"],
        "revision": commit, "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu}, {kind}, {os.cpu_count()} cores", "population": drawn["population"],
        "purpose": "drawn from the mutants no earlier sample checked, with the suite as it is at this revision",
        "status": status, "diffs": {n: diff(n) for n, st in status.items() if st not in ("killed", "not checked")},
        "timeouts": timed_out(status)})
    HISTORY.write_text(json.dumps(h, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def timed_out(status: dict[str, str]) -> dict[str, dict]:
    """For each mutant that ran past its limit: the seconds its tests took on the unmutated code (mutmut's stats
    phase, this machine) and the CPU-time limit mutmut gave it, 2 x multiplier x (those seconds + constant)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    estimated = {}
    for meta in (ROOT / "mutants").rglob("*.py.meta"):
        estimated.update(json.loads(meta.read_text(encoding="utf-8")).get("estimated_durations_by_key", {}))
    return {n: {"original_s": round(estimated.get(n, float("nan")), 2),
                "limit_s": math.ceil((estimated.get(n, float("nan")) + cfg["timeout_constant"])
                                     * cfg["timeout_multiplier"] * 2)}
            for n, st in status.items() if st == "timeout" and n in estimated}


def killed(status: str) -> bool:
    """A kill: a failing test, or a run past the limit its tests keep on the unmutated code."""
    return status in ("killed", "timeout")


def _score(status: dict[str, str], equivalent: dict) -> tuple[int, int, int]:
    """Killed and checked mutants of one sample, and those of the checked that were not killed and are set aside
    as equivalent (a killed mutant is a kill, whatever the list says)."""
    ok = [n for n, st in status.items() if st != "not checked"]
    return (sum(killed(status[n]) for n in ok), len(ok),
            sum(n in equivalent and not killed(status[n]) for n in ok))


def _interval(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / max(n, 1):.1f} % [{100 * lo:.1f}-{100 * hi:.1f} %]"


def _scores(status: dict[str, str], equivalent: dict) -> str:
    """Both scores of a sample: killed over every checked mutant, and over those not set aside as equivalent."""
    k, n, eq = _score(status, equivalent)
    return f"{k} of {n}, {_interval(k, n)}; without the {eq} equivalent: {k} of {n - eq}, {_interval(k, n - eq)}"


def report() -> str:
    """The report, from :data:`HISTORY` alone (committed: it reads without a run)."""
    samples = history()["samples"]
    if not samples:
        raise SystemExit(f"no samples in {HISTORY.name}: run `make mutation` first")
    # each listed under its name today, as the samples are (:func:`history`)
    equivalent, killers = ({current(n): why for n, why in json.loads(f.read_text(encoding="utf-8")).items()}
                           if f.is_file() else {} for f in (EQUIVALENTS, KILLERS))
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    newest = samples[-1]
    lines = ["# Mutation testing of the decoding core and the target side below it", "",
             f"`make mutation` (mutmut {mutmut_version}). Modules mutated: "
             f"{', '.join(f'`{p}`' for p in cfg['only_mutate'])} (the functions in `tools/mutation_report.py`'s "
             f"SCOPE). Tests run against each mutant (those that cover the mutated function): "
             f"{', '.join(f'`{t}`' for t in cfg['pytest_add_cli_args_test_selection'])}.", "",
             "The whole scope takes hours on two cores, so each run checks a uniform random sample of the mutants no "
             "earlier sample checked (tests written for one sample's survivors do not flatter the next). Score: "
             "killed over every mutant checked, and again with the mutants set aside as equivalent left out (each "
             "listed below with the argument why no input tells it from the original), with 95 % Wilson intervals. "
             "A mutant that ran past its CPU-time limit counts as killed: the limit is 2 x "
             f"{cfg['timeout_multiplier']:g} x (the time its tests took on the unmutated code on the same machine + "
             f"{cfg['timeout_constant']:g} s), and each sample records both numbers for its timeouts.", "",
             f"**Score now** (the newest sample, `{newest['name']}` at revision {newest['revision']}, "
             f"{newest['date']}, its first pass): killed {_scores(newest['status'], equivalent)}.", "",
             "First pass: killed by the suite as it was when the sample ran; the next column also counts the tests "
             "written for its survivors afterwards (`tools/mutation_killers.json`), so only a first pass estimates "
             "the scope.", "",
             "| Sample | Revision, date | Machine | Drawn from | Checked | Equivalent | First pass, over all [95 %] | "
             "First pass, without equivalents | With tests added for it | What it measures |",
             "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
    for s in samples:
        k, n, eq = _score(s["status"], equivalent)
        later = sum(killed(st) or x in killers for x, st in s["status"].items() if st != "not checked")
        lines.append(f"| {s['name']} (seed {s['seed']}) | {s['revision']}, {s['date']} | {s['machine']} | "
                     f"{s['population']} | {n} | {eq} | {_interval(k, n)} | {_interval(k, n - eq)} | "
                     f"{later} of {n} | {s['purpose']} |")
    lines += ["", "## The newest sample by file", "",
              "| Module | Drawn | Not checked | Killed | of which timeouts | Survived | Not covered | Other | "
              "Equivalent (not killed) | Score over all | Without equivalents |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_module: dict[str, Counter] = {}
    for name, st in newest["status"].items():
        c = by_module.setdefault(module_of(name), Counter())
        c["drawn"] += 1
        c[st] += 1
        c["equivalent"] += name in equivalent and not killed(st)
    total = Counter()
    for module, c in sorted(by_module.items()):
        total.update(c)
        lines.append(_row(module, c))
    lines.append(_row("**all**", total))
    lines += ["", "*Not covered*: no selected test runs the mutated function. *Not checked*: the run stopped before "
              "it reached them. *Survived*, *not covered* and *other* count the equivalent mutants too."]
    timeouts = newest.get("timeouts", {})
    if timeouts:
        lines += ["", "Timeouts of the newest sample (seconds of CPU: the unmutated code's tests, the limit):", ""]
        lines += [f"- `{x}`: {t['original_s']} s, limit {t['limit_s']} s" for x, t in sorted(timeouts.items())]
    for s in samples:
        left = [x for x, st in s["status"].items() if not killed(st) and st != "not checked" and x not in equivalent]
        lines += ["", f"## Survivors of `{s['name']}` ({len(left)})", ""]
        for x in left:
            killer = killers.get(x)
            if killer is None:
                after = "open"
            elif killer.startswith("fixed: "):
                after = f"the original was the fault, fixed since: {killer.removeprefix('fixed: ')}"
            else:
                after = f"killed by a test added after this sample's run (run against the mutant by hand): `{killer}`"
            shown = s["diffs"].get(x, "").splitlines()
            lines += [f"- `{x}` ({s['status'][x]}; {after})", ""]
            lines += ["  ```diff", *[f"  {d}" for d in shown], "  ```", ""] if shown else []
    seen = [x for s in samples for x in s["status"] if x in equivalent]
    lines += ["", f"## Equivalent mutants ({len(seen)})", ""]
    lines += [f"- `{x}`: {equivalent[x]}" for x in seen]
    return "\n".join(lines) + "\n"


def _row(module: str, c: Counter) -> str:
    """A file's counts; scores over the mutants checked (all of them, once a run has finished)."""
    checked = c["drawn"] - c["not checked"]
    kills = c["killed"] + c["timeout"]
    other = c["drawn"] - sum(c[k] for k in ("not checked", "killed", "survived", "no tests", "timeout"))

    def pct(k, n):
        return f"{100 * k / n:.1f} %" if n else "–"

    return (f"| {module} | {c['drawn']} | {c['not checked']} | {kills} | {c['timeout']} | {c['survived']} | "
            f"{c['no tests']} | {other} | {c['equivalent']} | {pct(kills, checked)} | "
            f"{pct(kills, checked - c['equivalent'])} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--patterns"]:  # mutmut run's name patterns for the whole scope
        sys.stdout.write("\n".join(patterns()) + "\n")
    elif sys.argv[1:] == ["--record"]:  # keep the newest run's results in the history
        record()
    elif sys.argv[1:2] == ["--sample"]:  # --sample N [SEED]: a seeded uniform sample of the generated mutants
        sys.stdout.write("\n".join(sample(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)) + "\n")
    else:
        sys.stdout.write(report())
