"""Chapter 7, the thesis' open serving questions: batched greedy decoding (:mod:`.loops`), the heads at batch B
(:mod:`.heads`), longer generations (:mod:`.lengths`) and memory (:mod:`.memory`), measured on one pair
(:mod:`.modes`); their tables (:mod:`.batch_tables`, :mod:`.tables`), the chapter's data (:mod:`.chapter`) and
``thesis-lib studies serving-bench`` (:mod:`.cli`)."""

from dataclasses import dataclass, field

from thesis_lib import extensions
from thesis_lib.book.params import counts
from thesis_lib.errors import ConfigError

from . import batch_tables, cli, heads, tables


@extensions.parameters
@dataclass
class Parameters:
    """Chapter 7's: a saved ``thesis-lib studies serving-bench`` document (None: the chapter measures at the sizes
    below: batch sizes, prompts, new tokens, answer lengths, prompts per long-answer category, repetitions) and a
    saved ``thesis-lib model-bench --parts batch`` document (both heads on 1-32 real states at once; None: measured
    here)."""

    serving_file: str | None = None
    serving_batches: list = field(default_factory=lambda: [1, 4])
    serving_prompts: int = 8
    serving_tokens: int = 16
    serving_lengths: list = field(default_factory=lambda: [32, 64, 128])
    serving_length_prompts: int = 1
    serving_reps: int = 1
    batch_heads_file: str | None = None

    def check(self) -> None:
        for name in ("serving_batches", "serving_lengths"):
            if not getattr(self, name) or any(not isinstance(n, int) or n < 1 for n in getattr(self, name)):
                raise ConfigError(f"{name.upper()} must be a list of integers >= 1 (got {getattr(self, name)!r}).")
        counts(self, "serving_prompts", "serving_tokens", "serving_length_prompts", "serving_reps")
        if max(self.serving_batches) > self.serving_prompts:
            raise ConfigError(f"SERVING_BATCHES go up to {max(self.serving_batches)} prompts at once; SERVING_PROMPTS "
                              f"is {self.serving_prompts}.")


extensions.add_rules(tables.RULES)
extensions.COMMANDS.append(cli.add_parsers)
extensions.MODEL_BENCH_PARTS["batch"] = extensions.Part(run=heads.model_bench_part, text=batch_tables.part_text)
