"""Peers on the same files: llama.cpp's decoding (:mod:`.llama`, ``thesis-lib studies llama-bench``) and Embedl's
own FlashHead beside this library's (:mod:`.embedl`, model-bench's ``embedl`` part)."""

from thesis_lib import extensions

from . import cli, embedl

extensions.COMMANDS.append(cli.add_parsers)
extensions.MODEL_BENCH_PARTS["embedl"] = extensions.Part(
    run=embedl.model_bench_part, needs_weight=True, available=embedl.available,
    missing="--parts embedl compares with Embedl's own head, which needs its PyPI package: "
            "pip install -e '.[embedl]' (flash-head 0.1.10).")
