"""The ``thesis-lib`` command line: one module per group of commands, the options they share in :mod:`.options`.

- models (:mod:`.decode`): ``prepare`` (convert the embedded pair once), ``generate`` (one prompt, one mode),
  ``compare`` (every mode on the demo prompts, interleaved; the last line is a JSON document), ``cluster``.
- measurements (:mod:`.measure`): ``model-bench`` (Tables 4.1-4.4), ``bench`` and ``profile`` (the benchmark
  protocol into a resumable run folder; Tables 4.5-4.11), ``table`` (tables from run folders), ``results`` (the
  thesis' main ratios beside a build's).
- sweeps (:mod:`.sweep`): ``sweep run|status|table|cancel|job``, in order here or one Slurm job per run.
- the book (:mod:`.book`): ``book``, ``explore`` (live explorer).
- ``studies <command>``: the commands of the studies beside the core (:data:`thesis_lib.extensions.COMMANDS`:
  ``serving-bench``, ``tree-bench``, ``precision-bench``, ``step-profile``, ``llama-bench``, ``gpu-check``,
  ``sampling-check``).

Errors the user can fix print as one message and exit with status 2, before any heavy work.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ThesisLibError
from .. import extensions
from . import book, decode, measure, sweep



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thesis-lib", description="The thesis-companion command line: speculative decoding with a dense or "
        "FlashHead draft, measured as the thesis measured it.", epilog="Each command takes --help; the README's "
        "table and docs/usage.md describe them.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for group in (decode, measure, book, sweep):
        group.add_parsers(sub)
    studies = sub.add_parser("studies", help="the studies beside the thesis: batches, trees, precisions, peers, the "
                             "GPU check, the sampling check (each command takes --help)")
    study_sub = studies.add_subparsers(dest="study_command", required=True, title="commands", metavar="COMMAND")
    for add_parsers in extensions.COMMANDS:
        add_parsers(study_sub)
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
