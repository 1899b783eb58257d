"""``thesis-lib studies precision-bench`` (float32, bfloat16, int8 and int4 side by side) and ``step-profile``
(where a decode step's time goes, beside its byte floor)."""

from __future__ import annotations

import os

from thesis_lib.models import specs
from thesis_lib.cli import options
from thesis_lib.errors import ConfigError


def cmd_precision_bench(args) -> int:
    from thesis_studies.precision import bench as precision

    precisions = tuple(x.strip() for x in args.precisions.split(",") if x.strip())
    precision.check(precisions, args.max_block, args.reps, args.int4_group, emulated=args.emulated)
    if args.k < 1 or args.max_new_tokens < 1 or args.e2e_prompts < 0:
        raise ConfigError("-k and --max-new-tokens must be >= 1 and --e2e-prompts >= 0.")
    specs.check_available(args.target)
    specs.check_available(args.draft)
    out_path = options.new_out_path(args)
    doc = precision.run(args.target, args.draft, precisions=precisions, max_block=args.max_block, reps=args.reps,
                        e2e_prompts=args.e2e_prompts, max_new_tokens=args.max_new_tokens, k=args.k,
                        int4_group=args.int4_group, emulated=args.emulated)
    from thesis_lib.models.weight_only import FORCED_PATH_ENV

    forced = os.environ.get(FORCED_PATH_ENV)
    doc["command"] = ((f"{FORCED_PATH_ENV}={forced} " if forced else "") + f"thesis-lib studies precision-bench --target {args.target} --draft {args.draft} --precisions "
                      f"{','.join(precisions)} --max-block {args.max_block} --reps {args.reps} --e2e-prompts "
                      f"{args.e2e_prompts} --max-new-tokens {args.max_new_tokens} -k {args.k}"
                      + (f" --int4-group {args.int4_group}" if "int4" in precisions else "")
                      + (" --emulated" if args.emulated else ""))
    return options.emit(doc, precision.text(doc), out_path)


def cmd_step_profile(args) -> int:
    from thesis_studies.precision import stepprofile
    from thesis_lib.bench.prompts import demo_prompts, encode
    from thesis_lib.heads.for_model import flashhead_for

    if args.reps < 3 or args.max_block < 1 or args.new_tokens < 2:
        raise ConfigError("--reps must be >= 3, --max-block >= 1 and --new-tokens >= 2.")
    out_path, measured, target, draft, others = options.embedded_pair(args, args.also_draft)
    doc = stepprofile.run(target, draft, flashhead_for(draft), encode(target.tokenizer, demo_prompts()[0].text),
                          blocks=tuple(range(1, args.max_block + 1)), reps=args.reps, new_tokens=args.new_tokens,
                          compare=tuple(args.compare), other_drafts={d: (m, flashhead_for(m)) for d, m in others.items()})
    doc.update(measured=measured, command=f"thesis-lib studies step-profile --dtype {args.dtype} --max-block {args.max_block} "
               f"--reps {args.reps} --new-tokens {args.new_tokens}" + "".join(f" --compare {c}" for c in args.compare)
               + "".join(f" --also-draft {d}" for d in args.also_draft))
    return options.emit(doc, stepprofile.text(doc), out_path)


def add_parsers(sub) -> None:
    p = sub.add_parser("precision-bench", help="float32, bfloat16 and int4 on the CPU side by side: step and verify "
                       "cost, end-to-end speedup",
                       description="Per precision: target's and draft's forwards over 1..--max-block tokens after a "
                       "prompt, precisions interleaved; --e2e-prompts prompts decoded target-only, by transformers' "
                       "generate() and FlashHead deferred. One JSON document as the last line.")
    p.add_argument("--target", default=specs.DEFAULT_TARGET, help="target model spec (default: %(default)s)")
    p.add_argument("--draft", default=specs.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    p.add_argument("--precisions", default="float32,bfloat16", help="comma-separated, of float32, bfloat16, "
                   "bfloat16-weights and int8-weights (float32 products over bf16 or int8 weights: the project's "
                   "kernel), int8-dynamic (int8 weights by int8 activations rounded per block of 32), int4 (the target's body 4-bit, head and draft bf16) (default: %(default)s)")
    p.add_argument("--int4-group", type=int, default=128, help="int4 weights per scale (default: %(default)s)")
    p.add_argument("--max-block", type=int, default=13, help="largest block timed (default: %(default)s)")
    p.add_argument("--reps", type=int, default=15, help="timed repetitions per block (default: %(default)s)")
    p.add_argument("--e2e-prompts", type=int, default=3, help="demo prompts decoded end to end (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="(default: %(default)s)")
    p.add_argument("-k", type=int, default=4, help="block length of the speculative run (default: %(default)s)")
    p.add_argument("--emulated", action="store_true", help="on a CPU without native bf16 dot products, time "
                   "bfloat16 and int4 anyway (stock bf16 layers): the precisions DTYPE auto declines there")
    options.out(p)
    p.set_defaults(func=cmd_precision_bench)

    p = sub.add_parser("step-profile", help="where a decode step's time goes: each part beside its byte floor",
                       description="Each step of the draft (dense head, FlashHead) and of the target (blocks of "
                       "1..--max-block) split by hooks into parts beside their bytes at the stream rate; the target-only "
                       "loop's time per token. One JSON document as the last line.")
    p.add_argument("--dtype", default="auto", help="the pair's precision (default: %(default)s)")
    p.add_argument("--max-block", type=int, default=8, help="the target's largest block (default: %(default)s)")
    p.add_argument("--reps", type=int, default=15, help="timed repetitions of each step (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per timed target-only generation (default: %(default)s)")
    p.add_argument("--compare", action="append", default=[], choices=("fused", "compact", "native", "head-kernel"),
                   help="every step also with this off: fused operations, compact step, its layers in one call, FlashHead's kernel")
    p.add_argument("--also-draft", action="append", default=[], help="the draft also in this --dtype (e.g. int8-dynamic)")
    options.out(p)
    p.set_defaults(func=cmd_step_profile)
