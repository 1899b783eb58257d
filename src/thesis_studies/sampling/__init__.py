"""Speculative sampling: its loop (:mod:`.loop`, run by the core's runner for the ``sample_*`` modes), proved
lossless by an exact test of the first tokens' distribution on tiny models
(:mod:`.distcheck`, ``thesis-lib studies sampling-check``, :mod:`.cli`)."""

from dataclasses import dataclass

from thesis_lib import extensions

from . import cli, loop


@extensions.parameters
@dataclass
class Parameters:
    """The sampling modes' warp (chapter 6), and the saved ``thesis-lib studies sampling-check`` document with the
    distance its test was sized for."""

    temperature: float = 0.7
    top_k: int | None = 20
    top_p: float | None = 0.8
    sampling_check_file: str | None = "data/reference/sampling-check-d0.01.json"
    sampling_delta: float = 0.01


extensions.COMMANDS.append(cli.add_parsers)
extensions.LOOPS["sample"] = loop.LOOP
extensions.MODES.append(extensions.Modes(names=("sample_baseline", "sample_dense", "sample_flash")))
