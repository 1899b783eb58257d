"""Write the mutation-testing report of `make mutation` (mutmut's results in ``mutants/``) as Markdown.

Per module: mutants, killed, survived, not covered by the selected tests, timed out; the score is killed over all
mutants but those listed as equivalent in ``tools/mutation_equivalents.json`` (mutant name -> why no test can tell
it from the original). Every survivor is listed with its diff and either that reason or "open". The report names
the revision, date, machine, mutmut version and the tests selected, so it can be read without running anything.
"""

from __future__ import annotations

import fnmatch
import json
import math
import random
import platform
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

#: What `make mutation` mutates: module -> its functions in scope (None: all of it). The sampling module's
#: acceptance rule, the heads' greedy selection; pyproject's ``only_mutate`` names the files.
SCOPE = {
    "thesis_lib.decoding.greedy": None,
    "thesis_lib.decoding.drafters": None,
    "thesis_lib.decoding.stats": None,
    "thesis_lib.bench.metrics": None,
    "thesis_lib.decoding.sampling": ("accept_or_resample", "draw", "Sampler.probs", "speculative_sample"),
    "thesis_lib.heads.dense": ("DenseGreedyHead.logits", "DenseGreedyHead.forward", "DenseGreedyHead.greedy_confidence",
                               "DenseGreedyHead._refined", "refines", "refined_argmax", "top_probability"),
    "thesis_lib.heads.flashhead": ("_select", "_torch_cluster_scores", "_candidates_fused", "_greedy_fused",
                                   "_confidence_fused", "FlashHead.forward", "FlashHead.greedy_confidence",
                                   "FlashHead._fast", "FlashHead.top_clusters", "FlashHead._candidate_scores",
                                   "FlashHead.reference", "FlashHead.candidate_ids"),
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


def sample(n: int, seed: int = 0) -> list[str]:
    """``n`` mutants drawn uniformly (seeded) from those in scope that mutmut generated; remembered in
    ``mutants/sample.json`` so that the report scores that sample and says so."""
    names = sorted(n_ for meta in (ROOT / "mutants").rglob("*.py.meta")
                   for n_ in json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if in_scope(n_))
    if not names:
        raise SystemExit("no mutants under mutants/: let mutmut generate them first")
    chosen = sorted(random.Random(seed).sample(names, min(n, len(names))))
    SAMPLE.write_text(json.dumps({"seed": seed, "population": len(names), "names": chosen}, indent=1))
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


CHECK = ROOT / "mutants" / "sample-check.json"  # a second, fresh sample: the suite as it is after the first's fixes


def results(sample: Path = SAMPLE) -> dict[str, str]:
    """Mutant name -> status (mutmut's, folded by :data:`FOLD`) of the mutants in scope (those of ``sample``
    where it exists), from the ``.meta`` files of the last run."""
    out = {}
    chosen = set(json.loads(sample.read_text())["names"]) if sample.is_file() else None
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


def report() -> str:
    status = results()
    if not status:
        raise SystemExit("no mutmut results under mutants/: run `make mutation` first")
    equivalent = json.loads(EQUIVALENTS.read_text(encoding="utf-8")) if EQUIVALENTS.is_file() else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    lines = ["# Mutation testing of the decoding core", "",
             f"`make mutation` at revision {commit}, {time.strftime('%Y-%m-%d')}, on {cpu} ({platform.machine()}); "
             f"mutmut {mutmut_version}. Modules mutated: {', '.join(f'`{p}`' for p in cfg['only_mutate'])}. "
             f"Tests run against each mutant (those that cover the mutated function): "
             f"{', '.join(f'`{t}`' for t in cfg['pytest_add_cli_args_test_selection'])}.", "",
             "Score: killed over the mutants checked, the equivalent ones left out (listed below with the reason no "
             "test can tell them from the original). *Not covered*: no selected test runs the mutated function. *Not "
             "checked*: the run stopped before it reached them.", ""]
    if SAMPLE.is_file():
        drawn = json.loads(SAMPLE.read_text())
        lines += [f"**A sample.** The run checked a uniform random sample (seed {drawn['seed']}) of "
                  f"{len(drawn['names'])} of the {drawn['population']} mutants in scope (the full run takes about "
                  "ten hours on two cores); scores come with a 95 % Wilson interval (the first pass's estimates the whole "
                  "scope's; the fresh sample below measures the tests written since).", ""]
    lines += [
             "| Module | Mutants | Not checked | Killed | Survived | Not covered | Timeout | Other | Equivalent | Score |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_module: dict[str, Counter] = {}
    for name, st in status.items():
        c = by_module.setdefault(module_of(name), Counter())
        c["mutants"] += 1
        c["equivalent" if name in equivalent else st] += 1
    total = Counter()
    for module, c in sorted(by_module.items()):
        total.update(c)
        lines.append(_row(module, c))
    lines.append(_row("**all**", total))
    judged = total["mutants"] - total["equivalent"] - total["not checked"]
    lo, hi = wilson(total["killed"], judged)
    lines += ["", f"Killed: {total['killed']} of {judged} non-equivalent mutants checked, "
              f"{100 * total['killed'] / max(judged, 1):.1f} % (95 % interval {100 * lo:.1f}-{100 * hi:.1f} %)."]
    killers = json.loads(KILLERS.read_text(encoding="utf-8")) if KILLERS.is_file() else {}
    added = [n for n in status if n in killers]
    if added:  # the first pass: what the suite killed before the tests written for this sample's survivors
        first = sum(st == "killed" and n not in killers for n, st in status.items())
        lo, hi = wilson(first, judged)
        lines += ["", f"First pass, before the tests added for its survivors: {first} of {judged}, "
                  f"{100 * first / max(judged, 1):.1f} % (95 % interval {100 * lo:.1f}-{100 * hi:.1f} %). That figure "
                  "estimates the scope's score of the suite as it was; the score above does not estimate the whole "
                  "scope, since the added tests were written for this sample's survivors."]
    if CHECK.is_file():  # a fresh sample, drawn from the mutants not in the first, checked with the suite as it is
        check = results(CHECK)
        drawn = json.loads(CHECK.read_text())
        ok = [n for n in check if n not in equivalent and check[n] != "not checked"]
        k = sum(check[n] == "killed" for n in ok)
        lo, hi = wilson(k, len(ok))
        lines += ["", f"## A fresh sample, with the suite as it is now", "",
                  f"{len(drawn['names'])} more mutants drawn uniformly (seed {drawn['seed']}) from the "
                  f"{drawn['population']} not in the first sample: killed {k} of {len(ok)} non-equivalent, "
                  f"{100 * k / max(len(ok), 1):.1f} % (95 % interval {100 * lo:.1f}-{100 * hi:.1f} %), "
                  f"{sum(n in equivalent for n in check)} equivalent. This is the estimate of the whole scope's score."]
        for n in [n for n in ok if check[n] != "killed"]:
            after = (f"; a test added after this sample's run kills it (run against the mutant by hand): "
                     f"`{killers[n]}`" if n in killers else "; open")
            lines += ["", f"- `{n}` ({check[n]}{after})", "", "  ```diff",
                      *[f"  {d}" for d in diff(n).splitlines()], "  ```"]
    if added:
        lines += ["", f"## Survivors of a first pass, killed by tests added for them ({len(added)})", ""]
        lines += [f"- `{n}` ({status[n]} now): `{killers[n]}`" for n in added]
    open_ = [n for n, st in status.items() if st not in ("killed", "not checked") and n not in equivalent]
    lines += ["", f"## Equivalent mutants ({sum(n in equivalent for n in status)})", ""]
    lines += [f"- `{n}`: {equivalent[n]}" for n in status if n in equivalent]
    lines += ["", f"## Not killed and not equivalent ({len(open_)})", ""]
    for n in open_:
        lines += [f"- `{n}` ({status[n]})", "", "  ```diff", *[f"  {d}" for d in diff(n).splitlines()], "  ```"]
    return "\n".join(lines) + "\n"


def _row(module: str, c: Counter) -> str:
    """A module's counts; the score is over the mutants checked (all of them, once a run has finished)."""
    judged = c["mutants"] - c["equivalent"] - c["not checked"]
    score = f"{100 * c['killed'] / judged:.1f} %" if judged else "–"
    other = c["mutants"] - sum(c[k] for k in ("not checked", "killed", "survived", "no tests", "timeout", "equivalent"))
    return (f"| {module} | {c['mutants']} | {c['not checked']} | {c['killed']} | {c['survived']} | {c['no tests']} | "
            f"{c['timeout']} | {other} | {c['equivalent']} | {score} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--patterns"]:  # mutmut run's name patterns for the whole scope
        sys.stdout.write("\n".join(patterns()) + "\n")
    elif sys.argv[1:2] == ["--sample"]:  # --sample N [SEED]: a seeded uniform sample of the generated mutants
        sys.stdout.write("\n".join(sample(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)) + "\n")
    else:
        sys.stdout.write(report())
