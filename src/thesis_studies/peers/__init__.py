"""Peers on the same files: llama.cpp's decoding (:mod:`.llama`, ``thesis-lib studies llama-bench``; what its
documents say, :mod:`.llama_tables`) and Embedl's own FlashHead beside this library's (:mod:`.embedl`, model-bench's
``embedl`` part)."""

from dataclasses import dataclass, field

from thesis_lib import extensions

from . import cli, embedl, llama_tables


@extensions.parameters
@dataclass
class Parameters:
    """Saved peer documents: ``thesis-lib model-bench --parts embedl``'s, shown where Embedl's package is not
    installed, and ``thesis-lib studies llama-bench``'s, llama.cpp beside this project in chapter 2 (one per kind of
    machine or precision; the first is the one the text reads)."""

    embedl_peer_file: str | None = None
    llama_files: list = field(default_factory=list)


extensions.COMMANDS.append(cli.add_parsers)
extensions.add_rules(llama_tables.RULES)
extensions.MODEL_BENCH_PARTS["embedl"] = extensions.Part(
    run=embedl.model_bench_part, needs_weight=True, available=embedl.available,
    missing="--parts embedl compares with Embedl's own head, which needs its PyPI package: "
            "pip install -e '.[embedl]' (flash-head 0.1.10).")
