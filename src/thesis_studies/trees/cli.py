"""``thesis-lib studies tree-bench``: token trees beside the best chains and transformers' assisted generation
(:mod:`thesis_studies.trees.bench`)."""

from __future__ import annotations


from thesis_lib.cli import options
from thesis_lib.errors import ConfigError


def cmd_tree_bench(args) -> int:
    from thesis_studies.trees import tables as tree_text
    from thesis_lib.bench.environment import provenance
    from thesis_lib.bench.prompts import encode, held_out, load_prompts, prompt_text, select
    from thesis_lib.bench.runner import Runner
    from thesis_studies.trees.bench import MAX_NODES, measure
    from thesis_lib.models import loading

    options.check_decoding(args)
    if args.iterations < 1 or args.calibration_per_category < 1 or args.calibration_tokens < 2:
        raise ConfigError("--iterations and --calibration-per-category must be >= 1, --calibration-tokens >= 2.")
    source = load_prompts(args.prompt_file or "project")
    found = select(source, args.categories, args.prompts, args.per_category)
    calib = held_out(source, found, args.calibration_per_category)
    options.check_flash(args, args.draft)
    out_path = options.new_out_path(args)
    measured = provenance()
    target, draft = loading.load_pair(args.target, args.draft, device=args.device, dtype=args.dtype,
                                      draft_dtype=args.draft_dtype,
                                      pack=options.pack(args))
    loading.probe_rows(target, 1 + MAX_NODES)
    runner = Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens,
                    flash_head=options.flash_head(args, draft))
    calib_ids = [encode(target.tokenizer, prompt_text(p), chat=True, thinking=options.thinking(args)) for p in calib]
    doc = measure(runner, calib_ids, found, calibration_tokens=args.calibration_tokens, iterations=args.iterations,
                  thinking=options.thinking(args))
    doc.update(prompts_used=[p.question_id for p in found], calibration_prompts=[p.question_id for p in calib],
               target=args.target, draft=args.draft, pair=runner.target.info | {"draft": runner.draft.info},
               rows_exact=target.info.get("rows_exact"), rows_probed=target.info.get("rows_probed"),
               measured=measured, command=options.command_line(), **options.machine_record())
    return options.emit(doc, tree_text.tree_text(doc), out_path)


def add_parsers(sub) -> None:
    p = sub.add_parser("tree-bench", help="token trees beside the best chains and assisted generation",
                       description="Calibration prompts (held out): the rank of the target's tokens among each draft "
                       "head's candidates, this machine's verify and draft cost curves, and the tree shapes a cost "
                       "model picks from them. Then, on the measured prompts: tokens per target forward of a set of "
                       "shapes, and target-only decoding, the best chains, the best trees and transformers' assisted "
                       "generate() (at the chain's K and at its own defaults) timed side by side. One JSON document "
                       "as the last line.")
    options.pair(p, max_new_tokens=48)
    options.flash(p)
    options.prompts(p, default_file="project")
    p.add_argument("--per-category", type=int, default=2, help="measured prompts per category (default: %(default)s)")
    p.add_argument("--calibration-per-category", type=int, default=3, help="held-out prompts per category for the "
                   "rank table (default: %(default)s)")
    p.add_argument("--calibration-tokens", type=int, default=64, help="tokens of each calibration continuation "
                   "(default: %(default)s)")
    p.add_argument("--iterations", type=int, default=2, help="timed repetitions of every prompt (default: %(default)s)")
    options.out(p)
    p.set_defaults(func=cmd_tree_bench)
