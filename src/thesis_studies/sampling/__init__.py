"""Speculative sampling proved lossless: an exact test of the first tokens' distribution on tiny models
(:mod:`.distcheck`, ``thesis-lib studies sampling-check``, :mod:`.cli`)."""

from thesis_lib import extensions

from . import cli

extensions.COMMANDS.append(cli.add_parsers)
extensions.MODES.append(extensions.Modes(names=("sample_baseline", "sample_dense", "sample_flash")))
