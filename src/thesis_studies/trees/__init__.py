"""Chapter 8, token trees (the loop itself is :mod:`thesis_lib.decoding.trees`): which shapes to grow from measured
rank probabilities and costs (:mod:`.shapes`), ``thesis-lib studies tree-bench`` (:mod:`.bench`, :mod:`.cli`),
its tables and verdicts (:mod:`.tables`) and the chapter's data (:mod:`.chapter`)."""

from thesis_lib import extensions

from . import cli, tables

extensions.add_rules(tables.RULES)
extensions.COMMANDS.append(cli.add_parsers)
extensions.MODES.append(extensions.Modes(names=("dense_tree", "flash_tree"), shaped=("dense_tree", "flash_tree")))
