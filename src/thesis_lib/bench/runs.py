"""Run folders: where a benchmark run keeps what it measured (thesis section 3.7, "exact output directories").

A run folder holds

- ``config.json``: the run's configuration (everything that decides what is measured);
- ``environment.json``: versions, CPU/GPU, threads, git revision, models and their hashes, FlashHead
  settings (:mod:`~thesis_lib.bench.environment`); a resumed run appends the environment of each later
  session under ``"resumed"``;
- ``samples.jsonl``: one JSON line per finished sample (prompt x iteration x mode), written and flushed to
  disk as soon as the sample is done, so an interrupted run loses no finished sample;
- ``summary.json``: the per-mode summary of all samples, written when the run completes.

An existing folder is never overwritten. :func:`open_run` refuses it unless asked to ``resume`` (the stored
configuration must equal the new one; finished samples are kept and skipped; a half-written last line from
an interruption is cut off) or to ``replace`` (the old folder is moved aside to ``<name>.old-N``, not
deleted). :func:`load_run` reads a folder back for the tables (:mod:`thesis_lib.analysis.tables`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.cache import build_lock, write_json
from .metrics import sample_key

CONFIG, ENVIRONMENT, SAMPLES, SUMMARY = "config.json", "environment.json", "samples.jsonl", "summary.json"


@dataclass
class Run:
    """A run folder's contents."""

    path: Path
    config: dict
    environment: dict
    samples: list[dict] = field(default_factory=list)
    summary: dict | None = None

    @property
    def name(self) -> str:
        return self.config.get("name") or self.path.name

    def modes(self) -> list[str]:
        return list(dict.fromkeys(r["mode"] for r in self.samples))

    def of(self, mode: str) -> list[dict]:
        return [r for r in self.samples if r["mode"] == mode]

    def done(self) -> dict[tuple, dict]:
        return {sample_key(r): r for r in self.samples}

    def append(self, record: dict) -> None:
        """Write one finished sample to ``samples.jsonl`` and force it to disk."""
        append_json_line(self.path / SAMPLES, record)
        self.samples.append(record)

    def write_summary(self, summary: dict) -> None:
        write_json(self.path / SUMMARY, summary)
        self.summary = summary

    def view(self, modes: dict[str, str], *, k: int | None = None, probes: int | None = None) -> "Run":
        """This run seen as a run of ``modes`` only (name shown -> the mode or variant measured, e.g.
        ``{"baseline": "baseline", "flash_deferred": "flash_deferred@k6p148"}``), for readers written for one run
        per setting: the samples and summary under the names shown; the configuration's ``k`` and ``probes`` and
        the environment's FlashHead probe count set to the variant's. The folder stays this one: every view of
        it shares the baseline measured once, interleaved with all its settings."""
        import copy

        shown = {measured: name for name, measured in modes.items()}
        config = {**self.config, "modes": list(modes)}
        if k is not None:
            config["k"] = k
        env = copy.deepcopy(self.environment)
        head = env.get("flashhead")
        if probes is not None:
            config["probes"] = probes
            if head:
                head["candidates"] += (probes - head["n_probes"]) * head["cluster_size"]
                head["n_probes"] = probes
        samples = [{**r, "mode": shown[r["mode"]]} for r in self.samples if r["mode"] in shown]
        summary = None if self.summary is None else {shown[m]: v for m, v in self.summary.items() if m in shown}
        return Run(self.path, config, env, samples, summary)


def append_json_line(file: Path, doc: Any) -> None:
    """One JSON line appended and forced to disk (a crash loses at most the line being written)."""
    with open(file, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_samples(path: Path, *, repair: bool) -> list[dict]:
    """Complete lines of ``samples.jsonl``; a torn last line (an interrupted write) is dropped, and with
    ``repair`` cut from the file so new samples start on a fresh line."""
    file = path / SAMPLES
    if not file.exists():
        return []
    data = file.read_bytes()
    samples, good = [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            samples.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good += len(line)
    if good < len(data):
        rest = data[good:]
        if rest.count(b"\n") > 1:  # more than one damaged line: not an interruption
            raise ConfigError(f"{file} is damaged after {len(samples)} samples; nothing was changed.")
        if repair:
            with open(file, "r+b") as f:
                f.truncate(good)
    return samples


def load_run(path: str | Path) -> Run:
    """Read a run folder (for tables and figures)."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise ConfigError(f"{path} is not a run folder (no {CONFIG}).")
    config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    env_file = path / ENVIRONMENT
    env = json.loads(env_file.read_text(encoding="utf-8")) if env_file.is_file() else {}
    summary_file = path / SUMMARY
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else None
    return Run(path, config, env, _read_samples(path, repair=False), summary)


def _aside(path: Path) -> Path:
    n = 1
    while (dest := path.with_name(f"{path.name}.old-{n}")).exists():
        n += 1
    return dest


def one_writer(path: str | Path):
    """The right to write the run folder ``path``, held for a whole run: an OS lock on ``.writers/<name>`` beside
    it (:func:`~thesis_lib.models.cache.build_lock`; one hidden folder, which no reader of run folders lists),
    released however the writer ends. Another writer (a second ``--resume``, a resubmitted job) is refused at once
    with the holder named: its samples would be duplicated."""
    path = Path(path)
    return build_lock(path.parent / ".writers", f"run folder {path.name}", timeout=0, owner_file=path.name)


def check_new_run(path: str | Path, config: dict, *, resume: bool = False, replace: bool = False) -> str:
    """What :func:`open_run` would do (``"new"``, ``"resume"``, ``"replace"``), or a clear error; cheap, so
    callers run it before loading any model."""
    path = Path(path)
    if resume and replace:
        raise ConfigError("Choose one of resume and replace.")
    if not path.exists():
        return "new"
    if replace:
        return "replace"
    if not resume:
        raise ConfigError(f"The run folder {path} exists; nothing was changed. Pass resume (--resume) to finish "
                          "it, replace (--replace: the old folder is moved aside, not deleted), or choose "
                          "another name.")
    if not (path / CONFIG).is_file():
        raise ConfigError(f"{path} exists but is not a run folder (no {CONFIG}); nothing was changed.")
    stored = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    diff = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
    if diff:
        raise ConfigError(f"Cannot resume {path}: its configuration differs in {', '.join(diff)} "
                          f"(stored {[stored.get(k) for k in diff]}, now {[config.get(k) for k in diff]}).")
    return "resume"


def open_run(path: str | Path, config: dict, *, resume: bool = False, replace: bool = False) -> Run:
    """Create a run folder, or reopen one to resume it, or move an old one aside and start afresh."""
    path = Path(path)
    action = check_new_run(path, config, resume=resume, replace=replace)
    if action == "resume":
        run = load_run(path)
        run.samples = _read_samples(path, repair=True)
        return run
    if action == "replace":
        os.replace(path, _aside(path))
    path.mkdir(parents=True)
    write_json(path / CONFIG, config)
    return Run(path, config, {})


def record_environment(run: Run, env: dict) -> None:
    """Store the environment; on a resumed run, keep the first and add this session's under ``resumed``."""
    file = run.path / ENVIRONMENT
    if file.is_file():
        doc = json.loads(file.read_text(encoding="utf-8"))
        doc.setdefault("resumed", []).append(env)
    else:
        doc = env
    write_environment(run, doc)


def write_environment(run: Run, doc: dict) -> None:
    write_json(run.path / ENVIRONMENT, doc)
    run.environment = doc
