"""Bad input, refused first: each case runs ``thesis-lib`` as a user would (a fresh process, an empty model cache)
and must end with exit status 2 and one line on stderr that names the problem, before any model file is converted
and with nothing written. Prints a table: the case, the exit status, the seconds and the message.

    python tools/bad_inputs.py            # every case
    python tools/bad_inputs.py -k yaml    # the cases whose name contains "yaml"

``tests/test_bad_input.py`` runs the same cases in one process (:data:`CASES`, :func:`files`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: name -> (arguments, a part of the message it must print); ``{d}`` is a folder of :func:`files`' inputs
CASES: dict[str, tuple[list[str], str]] = {
    "book: unknown set": (["book", "--params", "nope"], "Unknown parameter set 'nope'"),
    "book: malformed YAML": (["book", "--params", "{d}/malformed.yaml"], "is not valid YAML"),
    "book: BASE cycle": (["book", "--params", "{d}/cycle-a.yaml"], "BASE goes round in a circle"),
    "book: BASE names itself": (["book", "--params", "{d}/self.yaml"], "BASE names the set itself"),
    "book: lower-case key": (["book", "--params", "{d}/lower.yaml"], "parameter names are UPPER_CASE"),
    "book: unknown key": (["book", "--params", "{d}/typo.yaml"], "MODE is no parameter; did you mean MODES?"),
    "book: unknown mode": (["book", "--params", "{d}/mode.yaml"], "Unknown mode(s) flash_warp;"),
    "book: probes 0": (["book", "--params", "{d}/probes.yaml"], "probes must be"),
    "book: clusters past the vocabulary": (["book", "--params", "{d}/clusters.yaml"], "clusters"),
    "book: unknown target": (["book", "--params", "{d}/target.yaml"], "embedded:nope"),
    "book: K 0": (["book", "--params", "{d}/k0.yaml"], "K must be an integer >= 1"),
    "book: K a word": (["book", "--params", "{d}/kword.yaml"], "K must be an integer >= 1 (got 'four')"),
    "book: K sweep 0": (["book", "--params", "{d}/ksweep.yaml"], "K_SWEEP values must be integers >= 1"),
    "book: warm-up -1": (["book", "--params", "{d}/warmup.yaml"], "warmup must be an integer >= 0"),
    "book: unknown precision": (["book", "--params", "{d}/dtype.yaml"], "float13"),
    "book: unknown device": (["book", "--params", "{d}/device.yaml"], "tpu"),
    "book: missing prompt file": (["book", "--params", "{d}/promptfile.yaml"], "does not exist"),
    "book: empty prompt": (["book", "--params", "{d}/emptyprompt.yaml"], "empty"),
    "book: iterations a word": (["book", "--params", "{d}/iterations.yaml"], "ITERATIONS must be an integer >= 1"),
    "book: budget 0 with auto sizes": (["book", "--params", "{d}/budget.yaml"], "BUDGET_MINUTES > 0"),
    "book: a study's batches": (["book", "--params", "{d}/batches.yaml"], "SERVING_BATCHES go up to 16 prompts"),
    "book: a study's tree size": (["book", "--params", "{d}/tree.yaml"], "TREE_TOKENS must be an integer >= 1"),
    "book: --budget 0": (["book", "--budget", "0"], "--budget must be > 0"),
    "bench: unknown mode": (["bench", "--modes", "baseline,warp", "--out", "{d}/runs"], "Unknown mode(s) warp;"),
    "bench: K 0": (["bench", "--k", "0", "--out", "{d}/runs"], "K must be an integer >= 1"),
    "bench: run name with a slash": (["bench", "--name", "a/b", "--out", "{d}/runs"], "plain folder name"),
    "bench: missing prompt file": (["bench", "--prompt-file", "{d}/none.jsonl", "--out", "{d}/runs"],
                                   "does not exist"),
    "generate: empty prompt": (["generate", ""], "The prompt is empty"),
    "generate: empty prompt, transformers' mode": (["generate", "", "--mode", "hf_assisted"], "The prompt is empty"),
    "generate: past the context": (["generate", "hi", "--max-new-tokens", "40000"], "context"),
    "model-bench: probe list a word": (["model-bench", "--probe-list", "a"], "--probe-list"),
    "sweep: --set a word": (["sweep", "run", "--name", "s", "--grid", "k=1,2", "--set", "iterations=abc", "--out", "{d}/sw"],
                            "iterations must be an integer >= 1"),
    "sweep: --set with no value": (["sweep", "run", "--name", "s", "--grid", "k=1", "--set", "iterations", "--out", "{d}/sw"],
                                   "KEY=VALUE"),
    "sweep: newline in --partition": (["sweep", "run", "--name", "s", "--grid", "k=1", "--executor", "slurm", "--partition",
                                       "gpu\nrm -rf x", "--out", "{d}/sw"], "--partition holds a control character"),
}

#: the parameter files the book's cases read, by name (each a YAML text; ``{d}`` as above)
FILES = {
    "malformed.yaml": "K: [1, 2\nMODES: baseline\n",
    "cycle-a.yaml": "BASE: {d}/cycle-b.yaml\nK: 2\n",
    "cycle-b.yaml": "BASE: {d}/cycle-a.yaml\nK: 3\n",
    "self.yaml": "BASE: {d}/self.yaml\n",
    "lower.yaml": "BASE: cpu-embedded\nk: 2\n",
    "typo.yaml": "BASE: cpu-embedded\nMODE: [baseline]\n",
    "mode.yaml": "BASE: cpu-embedded\nMODES: [baseline, flash_warp]\n",
    "probes.yaml": "BASE: cpu-embedded\nPROBES: 0\n",
    "clusters.yaml": "BASE: cpu-embedded\nCLUSTERS: 100000000\n",
    "target.yaml": "BASE: cpu-embedded\nTARGET: embedded:nope\n",
    "k0.yaml": "BASE: cpu-embedded\nK: 0\n",
    "kword.yaml": "BASE: cpu-embedded\nK: four\n",
    "ksweep.yaml": "BASE: cpu-embedded\nK_SWEEP: [0, 2]\n",
    "warmup.yaml": "BASE: cpu-embedded\nWARMUP: -1\n",
    "dtype.yaml": "BASE: cpu-embedded\nDTYPE: float13\n",
    "device.yaml": "BASE: cpu-embedded\nDEVICE: tpu\n",
    "promptfile.yaml": "BASE: cpu-embedded\nPROMPT_FILE: {d}/none.jsonl\n",
    "emptyprompt.yaml": "BASE: cpu-embedded\nPROMPT_FILE: {d}/empty-prompt.jsonl\nPER_CATEGORY: 1\n",
    "iterations.yaml": "BASE: cpu-embedded\nITERATIONS: abc\n",
    "budget.yaml": "BASE: cpu-embedded\nBUDGET_MINUTES: 0\n",
    "batches.yaml": "BASE: cpu-embedded\nSERVING_BATCHES: [1, 16]\n",
    "tree.yaml": "BASE: cpu-embedded\nTREE_TOKENS: 0\n",
    "empty-prompt.jsonl": '{"question_id": "q1", "category": "chat", "turns": [""]}\n',
}


def files(folder: Path) -> Path:
    """Writes :data:`FILES` into ``folder``; returns it."""
    for name, text in FILES.items():
        (folder / name).write_text(text.replace("{d}", str(folder)), encoding="utf-8")
    return folder


def argv(case: str, folder: Path) -> list[str]:
    return [a.replace("{d}", str(folder)) for a in CASES[case][0]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "in"
        folder.mkdir()
        files(folder)
        for i, case in enumerate(c for c in CASES if args.k in c):
            cache = Path(tmp) / f"cache-{i}"  # empty for each case
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-m", "thesis_lib.cli", *argv(case, folder)],
                                      env={**os.environ, "THESIS_LIB_CACHE": str(cache)}, capture_output=True,
                                      text=True, timeout=60)
            except subprocess.TimeoutExpired as exc:  # still working: it took the bad input
                proc = subprocess.CompletedProcess(exc.cmd, -9, "", (exc.stderr or b"").decode()[-300:] + "\n(timed out)")
            seconds = time.perf_counter() - t0
            lines = proc.stderr.strip().splitlines()
            ok = (proc.returncode == 2 and len(lines) == 1 and CASES[case][1] in lines[0]
                  and not any(cache.rglob("*")) and seconds < 5)
            failed += not ok
            written = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))[:3]
            print(f"{'ok ' if ok else 'BAD'} {case:<44} rc {proc.returncode} {seconds:5.1f} s  {written or ''} "
                  f"{lines[-1][:150] if lines else '(nothing on stderr)'}" + ("" if len(lines) <= 1 else
                                                                              f"  [{len(lines)} lines]"))
    print(f"{len([c for c in CASES if args.k in c]) - failed} refused as they should be, {failed} not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
