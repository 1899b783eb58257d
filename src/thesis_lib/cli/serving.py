"""``serving-bench``: the thesis' open questions of section 5.3 on any pair and device: greedy decoding of B prompts
at once (``decode``), longer generations (``lengths``) and the memory each mode holds (``memory``)."""

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


def _mixed(args) -> list:
    """``--per-category`` prompts of each category, taken in turn across the categories (a served batch mixes
    requests), then the first ``--prompts``."""
    from ..bench.prompts import demo_prompts, load_prompts, select

    if args.per_category < 1:
        raise ConfigError(f"--per-category must be >= 1 (got {args.per_category}).")
    kept = select(load_prompts(args.prompt_file) if args.prompt_file else demo_prompts(), args.categories, None,
                  args.per_category)
    order = {c: i for i, c in enumerate(dict.fromkeys(p.category for p in kept))}
    rank: dict[str, int] = {}
    turns = []
    for p in kept:
        rank[p.category] = rank.get(p.category, 0) + 1
        turns.append((rank[p.category], order[p.category], p))
    mixed = [p for *_, p in sorted(turns, key=lambda t: t[:2])]
    return select(mixed, None, args.prompts)


def cmd_serving_bench(args) -> int:
    from ..analysis import formatting
    from ..bench import batched
    from ..bench.environment import provenance
    from ..bench.prompts import encode
    from ..decoding.state import ModelState
    from ..models import loading
    from ..models.cpu import cpu_name

    parts = [p for p in args.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        raise ConfigError(f"--parts takes some of {', '.join(PARTS)} (got {args.parts!r}).")
    options.check_decoding(args)
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1 (got {args.reps}).")
    batches = _ints(args.batches, "--batches")
    modes = [m for m in args.modes.split(",") if m]
    found = _mixed(args)
    if "decode" in parts:
        batched.check_decode(modes, batches, len(found))
    options.check_flash(args, args.draft)
    out_path = options.new_out_path(args)
    measured = provenance()
    target, draft = loading.load_pair(args.target, args.draft, device=args.device, dtype=args.dtype,
                                      pack=options.pack(args))
    head = options.flash_head(args, draft)
    body = head.body.model if head.body is not None else draft.model
    t = ModelState(target.model, vocab_limit=target.vocab_limit)
    drafts = {"dense": ModelState(draft.model, vocab_limit=draft.vocab_limit),
              "flash": ModelState(body, head=head, vocab_limit=draft.vocab_limit)}
    ids = [encode(target.tokenizer, p.text, chat=not args.no_chat, thinking=options.thinking(args)) for p in found]
    doc = {"parts": parts, "target": args.target, "draft": args.draft, "device": args.device,
           "dtype": target.dtype, "precision": target.info.get("dtype_requested"),
           "cpu_kernels": target.info.get("cpu_kernels"), "attention": target.info.get("attention"),
           "flashhead": {"clusters": head.n_clusters, "probes": head.n_probes, "path": head.active_path},
           "prompts_used": [p.question_id for p in found]}
    if "decode" in parts:
        doc["decode"] = batched.decode_by_batch(t, drafts, ids, k=args.k, max_new_tokens=args.max_new_tokens,
                                                eos_ids=target.eos_ids, batch_sizes=batches, modes=modes,
                                                reps=args.reps)
    doc.update(measured=measured, command=options.command_line(), machine=platform.machine(), processor=cpu_name(),
               threads=options.threads())
    return options.emit(doc, formatting.serving_text(doc), out_path)


def add_parsers(sub) -> None:
    from ..bench.batched import DECODE_BATCHES, DECODE_MODES

    p = sub.add_parser("serving-bench", help="batches, longer generations and memory (the thesis' open questions)",
                       description="decode: the prompts in groups of B decoded at once, batched target-only "
                       "against batched speculative decoding (each row accepts its own tokens per round; every row "
                       "checked against target-only), modes interleaved. One JSON document as the last line.")
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
    options.out(p)
    p.set_defaults(func=cmd_serving_bench)
