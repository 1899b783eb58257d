"""Chapter 7, the thesis' open serving questions: batched greedy decoding (:mod:`.loops`), the heads at batch B
(:mod:`.heads`), longer generations (:mod:`.lengths`) and memory (:mod:`.memory`), measured on one pair
(:mod:`.modes`); their tables (:mod:`.batch_tables`, :mod:`.tables`), the chapter's data (:mod:`.chapter`) and
``thesis-lib studies serving-bench`` (:mod:`.cli`)."""

from thesis_lib import extensions

from . import batch_tables, cli, heads, tables

extensions.add_rules(tables.RULES)
extensions.COMMANDS.append(cli.add_parsers)
extensions.MODEL_BENCH_PARTS["batch"] = extensions.Part(run=heads.model_bench_part, text=batch_tables.part_text)
