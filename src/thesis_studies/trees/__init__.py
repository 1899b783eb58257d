"""Chapter 8, token trees: their loop and shapes (:mod:`.loop`, run by the core's runner), which shapes to grow from measured
rank probabilities and costs (:mod:`.shapes`), ``thesis-lib studies tree-bench`` (:mod:`.bench`, :mod:`.cli`),
its tables and verdicts (:mod:`.tables`) and the chapter's data (:mod:`.chapter`)."""

from dataclasses import dataclass

from thesis_lib import extensions
from thesis_lib.book.params import counts

from . import cli, loop, tables


@extensions.parameters
@dataclass
class Parameters:
    """Chapter 8's: a saved ``thesis-lib studies tree-bench`` document; None: the chapter measures it at the sizes
    below (measured prompts per category, held-out calibration prompts per category and their tokens, new tokens per
    measured generation, timed repetitions)."""

    tree_file: str | None = None
    tree_per_category: int = 2
    tree_calibration: int = 3
    tree_calibration_tokens: int = 64
    tree_tokens: int = 48
    tree_iterations: int = 2

    def check(self) -> None:
        counts(self, "tree_per_category", "tree_calibration", "tree_calibration_tokens", "tree_tokens",
               "tree_iterations")


extensions.add_rules(tables.RULES)
extensions.COMMANDS.append(cli.add_parsers)
extensions.LOOPS["tree"] = loop.LOOP
extensions.MODES.append(extensions.Modes(names=("dense_tree", "flash_tree"), shaped=("dense_tree", "flash_tree")))
