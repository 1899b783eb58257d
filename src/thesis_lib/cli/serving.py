"""``serving-bench``: the thesis' open questions of section 5.3 on any pair and device: greedy decoding of B prompts
at once (``decode``), longer generations (``lengths``) and the memory each mode holds (``memory``). ``tree-bench``:
token trees beside the best chains and transformers' assisted generation (:mod:`thesis_lib.bench.trees`)."""

from __future__ import annotations

import platform

from ..errors import ConfigError
from . import options

PARTS = ("decode", "lengths", "memory")


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{what} takes comma-separated integers (got {text!r}).") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what} takes integers >= 1 (got {text!r}).")
    return values


def cmd_serving_bench(args) -> int:
    import torch

    from ..analysis import formatting
    from ..bench import batched, lengths
    from ..bench.environment import provenance
    from ..bench.prompts import demo_prompts, encode, load_prompts, select
    from ..bench.serving import Pair, measure, mixed
    from ..models import loading
    from ..models.cpu import cpu_name, fast_bf16

    parts = [p for p in args.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        raise ConfigError(f"--parts takes some of {', '.join(PARTS)} (got {args.parts!r}).")
    options.check_decoding(args)
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1 (got {args.reps}).")
    batches = _ints(args.batches, "--batches")
    sizes = _ints(args.lengths, "--lengths")
    lengths.check_lengths(sizes)
    modes = [m for m in args.modes.split(",") if m]
    if args.per_category < 1:
        raise ConfigError(f"--per-category must be >= 1 (got {args.per_category}).")
    source = load_prompts(args.prompt_file) if args.prompt_file else demo_prompts()
    found = mixed(select(source, args.categories), args.per_category, args.prompts)
    if "decode" in parts:
        batched.check_decode(modes, batches, len(found))
    long = select(source, args.length_categories, None, args.length_per_category) if "lengths" in parts else []
    options.check_flash(args, args.draft)
    out_path = options.new_out_path(args)
    measured = provenance()
    target, draft = loading.load_pair(args.target, args.draft, device=args.device, dtype=args.dtype,
                                      draft_dtype=args.draft_dtype,
                                      pack=options.pack(args))
    head = options.flash_head(args, draft)
    pair = Pair(target, draft, head, k=args.k)

    def ids(prompts):
        return [encode(target.tokenizer, p.text, chat=not args.no_chat, thinking=options.thinking(args)) for p in prompts]

    doc = measure(pair, parts, ids(found), long_prompts=ids(long), max_new_tokens=args.max_new_tokens,
                  batches=batches, modes=modes, reps=args.reps, lengths=sizes)
    doc["prompts_used"] = [p.question_id for p in found]
    if long:
        doc["lengths"]["prompts_used"] = [p.question_id for p in long]
    doc.update(measured=measured, command=options.command_line(), machine=platform.machine(), processor=cpu_name(),
               threads=options.threads(), torch=torch.__version__, fast_bf16=fast_bf16(),
               cpu_capability=torch.backends.cpu.get_cpu_capability())
    return options.emit(doc, formatting.serving_text(doc), out_path)


def cmd_tree_bench(args) -> int:
    import torch

    from ..analysis import trees as tree_text
    from ..bench.environment import provenance
    from ..bench.prompts import encode, load_prompts, prompt_text, select
    from ..bench.runner import Runner
    from ..bench.trees import MAX_NODES, calibration_prompts, measure
    from ..models import loading
    from ..models.cpu import cpu_name, fast_bf16

    options.check_decoding(args)
    if args.iterations < 1 or args.calibration_per_category < 1 or args.calibration_tokens < 2:
        raise ConfigError("--iterations and --calibration-per-category must be >= 1, --calibration-tokens >= 2.")
    source = load_prompts(args.prompt_file or "project")
    found = select(source, args.categories, args.prompts, args.per_category)
    calib = calibration_prompts(source, found, args.calibration_per_category)
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
               measured=measured, command=options.command_line(), machine=platform.machine(), processor=cpu_name(),
               threads=options.threads(), torch=torch.__version__, fast_bf16=fast_bf16(),
               cpu_capability=torch.backends.cpu.get_cpu_capability())
    return options.emit(doc, tree_text.tree_text(doc), out_path)


def add_parsers(sub) -> None:
    from ..bench.batched import DECODE_BATCHES, DECODE_MODES
    from ..bench.lengths import LENGTHS

    p = sub.add_parser("serving-bench", help="batches, longer generations and memory (the thesis' open questions)",
                       description="decode: the prompts in groups of B decoded at once, batched target-only "
                       "against batched speculative decoding (each row accepts its own tokens per round; every row "
                       "checked against target-only), modes interleaved, with the step costs at each B. lengths: "
                       "target-only and deferred speculative decoding of 32 to 256 new tokens, acceptance by output "
                       "position, the draft head's share of a step as the context grows. memory: bytes of the "
                       "models, FlashHead's tensors, the KV caches, and each mode's peak resident memory. One JSON "
                       "document as the last line.")
    options.pair(p, max_new_tokens=32)
    options.flash(p)
    options.prompts(p, default_file="project")
    p.add_argument("--per-category", type=int, default=3, help="prompts of each category, taken in turn across "
                   "the categories (default: %(default)s)")
    p.set_defaults(prompts=16)
    p.add_argument("--parts", default="decode", help=f"comma-separated, of {', '.join(PARTS)} (default: %(default)s)")
    p.add_argument("--batches", default=",".join(map(str, DECODE_BATCHES)), help="batch sizes (default: %(default)s)")
    p.add_argument("--modes", default=",".join(DECODE_MODES), help="baseline and some of its drafts and schedules "
                   "(default: %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="repetitions of every group (default: %(default)s)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="lengths part: new tokens per generation "
                   "(default: %(default)s)")
    p.add_argument("--length-categories", default="coding,math_reasoning", help="lengths part: categories of "
                   "the prompt file, long answers (default: %(default)s)")
    p.add_argument("--length-per-category", type=int, default=2, help="lengths part: prompts of each (default: "
                   "%(default)s)")
    options.out(p)
    p.set_defaults(func=cmd_serving_bench)

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
