"""``thesis-lib studies llama-bench``: llama.cpp beside this project on the embedded pair's own GGUF files."""

from __future__ import annotations

from thesis_lib.cli import options
from thesis_lib.errors import ConfigError, at_least


def cmd_llama_bench(args) -> int:
    from thesis_studies.peers import llama as llama_peer, llama_tables
    from thesis_lib.bench.prompts import encode, held_out, load_prompts, select

    llama_peer.check()  # before any model loads
    at_least("--per-category", args.per_category), at_least("--calibration", args.calibration), at_least("-k", args.k)
    at_least("--max-new-tokens", args.max_new_tokens, 2)
    pool = load_prompts("project")
    measured = select(pool, per_category=args.per_category)
    calibration = held_out(pool, measured, args.calibration)
    if not calibration:
        raise ConfigError(f"No calibration prompts are left beside {args.per_category} measured per category.")
    out_path, measured_by, target, draft, _ = options.embedded_pair(args)
    ids, calib = ([encode(target.tokenizer, p.text) for p in ps] for ps in (measured, calibration))
    doc = llama_peer.run(target, draft, ids, calib, k=args.k, max_new_tokens=args.max_new_tokens)
    doc.update(categories=[p.category for p in measured], measured=measured_by, **options.machine_record(),
               command=options.command_line())
    return options.emit(doc, llama_tables.text(doc), out_path)


def add_parsers(sub) -> None:
    p = sub.add_parser("llama-bench", help="llama.cpp at its best beside this project on the embedded pair's GGUF files",
                       description="Builds llama.cpp's server from source on first use (CMake, a C++ compiler; about "
                       "15 minutes on two cores), tunes its speculative decoding with the 0.5B GGUF as the draft "
                       "(--spec-draft-n-max, --spec-draft-p-min) and its n-gram methods on held-out calibration "
                       "prompts, then times its plain, speculative and n-gram decoding beside this project's "
                       "target-only and FlashHead deferred decoding, interleaved per prompt of the default prompt set, "
                       "same threads and new tokens; bytes per step of each; where the texts part. One JSON document "
                       "as the last line.")
    p.add_argument("--per-category", type=int, default=5, help="measured prompts per category (default: %(default)s)")
    p.add_argument("--calibration", type=int, default=1,
                   help="held-out calibration prompts per category for the tuning (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="(default: %(default)s)")
    p.add_argument("-k", type=int, default=4, help="this project's draft tokens per round (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="this project's precision (default: %(default)s)")
    options.out(p)
    p.set_defaults(func=cmd_llama_bench)
