"""``thesis-lib studies serving-bench``: the thesis' open questions of section 5.3 on any pair and device: greedy
decoding of B prompts at once (``decode``), longer generations (``lengths``) and the memory each mode holds
(``memory``)."""

from __future__ import annotations


from thesis_lib.errors import ConfigError
from thesis_lib.cli import options

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
    from thesis_studies.serving import heads as batched, lengths
    from thesis_lib.bench.environment import provenance
    from thesis_lib.bench.prompts import demo_prompts, encode, load_prompts, select
    from thesis_studies.serving.modes import Pair, measure, mixed
    from thesis_lib.models import loading

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
    doc.update(measured=measured, command=options.command_line(), **options.machine_record())
    return options.emit(doc, serving_text(doc), out_path)


def serving_text(doc: dict) -> str:
    """``serving-bench``'s report: batched decoding (speed: over batched target-only decoding at the
    same B, 95 % interval over the groups of prompts), longer generations and memory."""
    lines = [f"\n{doc['target']} with {doc['draft']} ({doc.get('precision') or doc['dtype']}), "
             f"{len(doc['prompts_used'])} prompts"]
    if "decode" in doc:
        from thesis_studies.serving.batch_tables import decode_rows, decode_shown, speculation_gone

        d = doc["decode"]
        rows = decode_rows(d)
        lines.append(f"\nbatched greedy decoding, K = {d['k']}, {d['max_new_tokens']} new tokens, {d['reps']} repetitions")
        lines.append(decode_shown(rows).round(3).to_string(index=False))
        lines.append(speculation_gone(rows))
    if "lengths" in doc:
        from thesis_studies.serving.tables import head_share_rows, length_rows, position_rows

        rows = length_rows(doc["lengths"])
        lines.append("\nlonger generations (speed: over target-only, 95 % interval over the prompts)")
        lines.append(rows[[c for c in rows if c not in ("value", "lo", "hi")]].round(3).to_string(index=False))
        lines.append("\nacceptance by output position")
        lines.append(position_rows(doc["lengths"]).round(3).to_string(index=False))
        lines.append("\nthe draft head's share of a step by context length")
        lines.append(head_share_rows(doc["lengths"]).round(3).to_string(index=False))
    if "memory" in doc:
        from thesis_studies.serving.tables import memory_rows

        lines.append("\nmemory")
        lines.append(memory_rows(doc["memory"]).round(1).to_string(index=False))
    lines.append("")
    return "\n".join(lines)


def add_parsers(sub) -> None:
    from thesis_studies.serving.heads import DECODE_BATCHES, DECODE_MODES
    from thesis_studies.serving.lengths import LENGTHS

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
