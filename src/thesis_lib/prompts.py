"""Prompts: the demo prompt set and turning a prompt into token ids.

A prompt goes through the tokenizer's chat template (one user turn, generation prompt added) when the
tokenizer has one, unless ``chat=False``. The demo set (``data/prompts/demo.jsonl``) is this project's own
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

from .errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str


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
            prompts.append(Prompt(str(rec["question_id"]), str(rec.get("category", "")), str(rec["turns"][0])))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(f"{path.name}, line {line_no}: not a question record ({exc}).") from None
    return prompts


NAMED_SETS = {"demo": "demo_prompts.jsonl", "project": "project_prompts.jsonl"}


def load_prompts(name_or_path: str | Path) -> list[Prompt]:
    """A named set shipped with the package (``demo``, ``project``) or a question file's path."""
    if str(name_or_path) in NAMED_SETS:
        return load_jsonl(DATA_DIR / NAMED_SETS[str(name_or_path)])
    return load_jsonl(name_or_path)


def demo_prompts(n: int | None = None) -> list[Prompt]:
    """The demo set shipped with the package (code, chat, translation, maths)."""
    prompts = load_jsonl(DATA_DIR / "demo_prompts.jsonl")
    return prompts[:n] if n else prompts


def encode(tokenizer: Any, text: str, *, chat: bool = True) -> list[int]:
    """Token ids of one user prompt, through the chat template if the tokenizer has one and ``chat``."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])
