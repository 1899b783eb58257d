"""The GPU acceptance run at the thesis' shapes with random weights (``thesis-lib studies gpu-check``, :mod:`.cli`):
the heads (:mod:`.run`), the draft's step (:mod:`.step`), the target's verify cost (:mod:`.verify`), CUDA graphs
captured by hand and timed on the device (:mod:`.graphs`), the tables
the book shows (:mod:`.tables`) and chapter 4's GPU verdicts (:mod:`.verdicts`)."""

from dataclasses import dataclass

from thesis_lib import extensions

from . import cli, verdicts


@extensions.parameters
@dataclass
class Parameters:
    """A saved ``thesis-lib studies gpu-check`` document shown in chapters 2, 4, 7 and 8 (random weights: GPU cost,
    not acceptance)."""

    gpu_check_file: str | None = None


extensions.add_rules(verdicts.RULES)
extensions.COMMANDS.append(cli.add_parsers)
