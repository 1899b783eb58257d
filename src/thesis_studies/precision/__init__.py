"""Chapter 2's precision section: float32, bfloat16, int8 and int4 side by side on the CPU (:mod:`.bench`,
``thesis-lib studies precision-bench``), their tables (:mod:`.tables`), the byte floor (:mod:`.floor`), where a
step's time goes (:mod:`.stepprofile`, ``thesis-lib studies step-profile``) and the verdicts (:mod:`.verdicts`)."""

from thesis_lib import extensions

from . import cli, verdicts

extensions.add_rules(verdicts.RULES)
extensions.COMMANDS.append(cli.add_parsers)
