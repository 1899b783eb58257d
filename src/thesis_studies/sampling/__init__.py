"""Speculative sampling: its loop (:mod:`.loop`, run by the core's runner for the ``sample_*`` modes), proved
lossless by an exact test of the first tokens' distribution on tiny models
(:mod:`.distcheck`, ``thesis-lib studies sampling-check``, :mod:`.cli`)."""

from thesis_lib import extensions

from . import cli, loop

extensions.COMMANDS.append(cli.add_parsers)
extensions.LOOPS["sample"] = loop.LOOP
extensions.MODES.append(extensions.Modes(names=("sample_baseline", "sample_dense", "sample_flash")))
