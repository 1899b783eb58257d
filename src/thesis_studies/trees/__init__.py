"""Chapter 8, token trees: their loop and shapes (:mod:`.loop`, run by the core's runner), which shapes to grow from measured
rank probabilities and costs (:mod:`.shapes`), ``thesis-lib studies tree-bench`` (:mod:`.bench`, :mod:`.cli`),
its tables and verdicts (:mod:`.tables`) and the chapter's data (:mod:`.chapter`)."""

from thesis_lib import extensions

from . import cli, loop, tables

extensions.add_rules(tables.RULES)
extensions.COMMANDS.append(cli.add_parsers)
extensions.LOOPS["tree"] = loop.LOOP
extensions.MODES.append(extensions.Modes(names=("dense_tree", "flash_tree"), shaped=("dense_tree", "flash_tree")))
