"""Prompts: question files in the Spec-Bench format, the shipped sets, selection, and turning a prompt into ids.

Sources (:func:`load_prompts`): a shipped set by name (``demo``, ``project``), a local JSON-lines file, or
an ``http(s)`` URL (for example Spec-Bench's own ``question.jsonl``), downloaded once into
``$THESIS_LIB_CACHE/prompts/`` and read from there afterwards; without a network and without a cached copy
it fails with a message that says to pass a local copy. :func:`select` keeps some categories and a count,
with clear errors for unknown categories or an empty selection. Each record keeps all its ``turns``.

A prompt goes through the tokenizer's chat template (one user turn, generation prompt added) when the
tokenizer has one, unless ``chat=False``. The demo set (``data/demo_prompts.jsonl``) is this project's own
small set in the Spec-Bench question format (``question_id``, ``category``, ``turns``); it is not
Spec-Bench. The *project* set (``data/project_prompts.jsonl``) is larger and also this project's own:
8 prompts in each of conversation (two turns), German-to-English translation, summarisation, question
answering, mathematical reasoning, retrieval-augmented QA (context + question) and coding. Only the first
turn is used for now; multi-turn runs come with the benchmark protocol.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, at_least
from ..models.cache import cache_dir, write_atomic

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str  # the first turn
    turns: tuple[str, ...] = ()


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Read a Spec-Bench-format question file; the first turn of each question is its prompt."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Prompt file {str(path)!r} does not exist.")
    prompts = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            turns = tuple(str(t) for t in rec["turns"])
            if not turns[0].strip():
                raise ValueError("its first turn is empty")
            prompts.append(Prompt(str(rec["question_id"]), str(rec.get("category", "")), turns[0], turns))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(f"{path.name}, line {line_no}: not a question record ({exc}).") from None
    return prompts


NAMED_SETS = {"demo": "demo_prompts.jsonl", "project": "project_prompts.jsonl"}


def load_prompts(source: str | Path, *, timeout: float = 20.0) -> list[Prompt]:
    """A shipped set by name (``demo``, ``project``), a question file's path, or an http(s) URL (cached)."""
    source = str(source)
    if source in NAMED_SETS:
        return load_jsonl(DATA_DIR / NAMED_SETS[source])
    if source.startswith(("http://", "https://")):
        return load_jsonl(fetch_prompt_file(source, timeout=timeout))
    return load_jsonl(source)


def prompt_cache_dir() -> Path:
    return cache_dir() / "prompts"


def fetch_prompt_file(url: str, *, timeout: float = 20.0, refresh: bool = False) -> Path:
    """Download a question file once into the prompt cache; later calls read the cached copy."""
    import hashlib
    import urllib.error
    import urllib.request

    name = url.rstrip("/").rsplit("/", 1)[-1] or "questions.jsonl"
    path = prompt_cache_dir() / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}"
    if path.is_file() and not refresh:
        return path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data = resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError(f"Cannot download the prompt file {url} ({exc}) and no copy is cached. "
                          "Download it elsewhere and pass its local path instead.") from None
    return write_atomic(path, data)


def select(prompts: list[Prompt], categories: str | list[str] | None = None, count: int | None = None,
           per_category: int | None = None) -> list[Prompt]:
    """Keep the given categories (comma-separated or a list), then the first ``per_category`` prompts of each
    category (file order kept), then the first ``count`` prompts."""
    if categories:
        wanted = set(categories.split(",") if isinstance(categories, str) else categories)
        available = {p.category for p in prompts}
        missing = wanted - available
        if missing:
            raise ConfigError(f"Unknown categor{'y' if len(missing) == 1 else 'ies'} {sorted(missing)}; "
                              f"available: {sorted(available)}.")
        prompts = [p for p in prompts if p.category in wanted]
    at_least("The prompt count", count, none=True)
    if per_category is not None:
        if per_category < 1:
            raise ConfigError(f"The prompts per category must be >= 1 (got {per_category}).")
        prompts = first_per_category(prompts, per_category)
    prompts = prompts[:count] if count else prompts
    if not prompts:
        raise ConfigError("No prompts selected.")
    return prompts


def first_per_category(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The first ``n`` prompts of each category, file order kept."""
    seen: dict[str, int] = {}
    kept = []
    for p in prompts:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] <= n:
            kept.append(p)
    return kept


def held_out(prompts: list[Prompt], measured: list[Prompt], per_category: int) -> list[Prompt]:
    """A calibration set kept apart from what is measured: the first ``per_category`` prompts of each category that
    are not among ``measured`` ([] where none is left)."""
    taken = {p.question_id for p in measured}
    return first_per_category([p for p in prompts if p.question_id not in taken], per_category)


def demo_prompts(n: int | None = None) -> list[Prompt]:
    """The demo set shipped with the package (code, chat, translation, maths)."""
    prompts = load_jsonl(DATA_DIR / "demo_prompts.jsonl")
    return prompts[:n] if n else prompts


#: How a multi-turn record becomes one prompt: its first turn, or all turns flattened into one user message
#: (the thesis' benchmark path uses flattened prompts).
TURNS = ("first", "flatten")


def prompt_text(prompt: Prompt, turns: str = "first") -> str:
    """The text sent for ``prompt``: its first turn, or (``flatten``) all turns joined by blank lines."""
    if turns not in TURNS:
        raise ConfigError(f"Unknown turns policy {turns!r}; use one of {', '.join(TURNS)}.")
    if turns == "flatten" and len(prompt.turns) > 1:
        return "\n\n".join(prompt.turns)
    return prompt.text


def encode(tokenizer: Any, text: str, *, chat: bool = True, thinking: bool | None = None) -> list[int]:
    """Token ids of one user prompt, through the chat template if the tokenizer has one and ``chat``.

    ``thinking`` is passed to the template as ``enable_thinking`` (Qwen3's templates think unless told
    ``False``; templates without the switch ignore it); ``None`` leaves the template's own default."""
    if chat and getattr(tokenizer, "chat_template", None):
        extra = {} if thinking is None else {"enable_thinking": bool(thinking)}
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, **extra)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])
