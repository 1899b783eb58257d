"""The ``thesis-lib`` command line: one module per group of commands, the options they share in :mod:`.options`.

- models (:mod:`.decode`): ``prepare`` (convert the embedded pair once), ``generate`` (one prompt, one mode),
  ``compare`` (every mode on the demo prompts, interleaved; the last line is a JSON document), ``cluster``.
- measurements (:mod:`.measure`): ``model-bench`` (Tables 4.1-4.4), ``bench`` and ``profile`` (the benchmark
  protocol into a resumable run folder; Tables 4.5-4.11), ``table`` (tables from run folders),
  ``precision-bench`` (float32, bfloat16, int4 side by side), ``sampling-check`` (speculative sampling lossless).
- the thesis' open questions (:mod:`.serving`): ``serving-bench`` (batches, longer generations, memory).
- sweeps (:mod:`.sweep`): ``sweep run|status|table|cancel|job``, in order here or one Slurm job per run.
- the book (:mod:`.book`): ``book``, ``explore`` (live explorer), ``gpu-check`` (the GPU acceptance run).

Errors the user can fix print as one message and exit with status 2, before any heavy work.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ThesisLibError
from . import book, decode, measure, serving, sweep


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thesis-lib", description="The thesis-companion command line: speculative decoding with a dense or "
        "FlashHead draft, measured as the thesis measured it.", epilog="Each command takes --help; the README's "
        "table and docs/usage.md describe them.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for group in (decode, measure, serving, book, sweep):
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate()'s deprecation notes would bury the progress bar
    try:
        return args.func(args)
    except ThesisLibError as exc:
        print(f"thesis-lib: error: {exc}", file=sys.stderr)
        return 2
