"""``thesis-lib studies llama-bench``: llama.cpp beside this project on the embedded pair's own GGUF files."""

from __future__ import annotations

from thesis_lib.cli import options
from thesis_lib.errors import ConfigError


def cmd_llama_bench(args) -> int:
    from thesis_studies.peers import llama as llama_peer
    from thesis_lib.bench.prompts import demo_prompts, encode

    llama_peer.check()  # before any model loads
    if args.prompts < 1 or args.max_new_tokens < 1 or args.k < 1:
        raise ConfigError("--prompts, --max-new-tokens and -k must be >= 1.")
    out_path, measured, target, draft, _ = options.embedded_pair(args)
    prompts = demo_prompts()[: args.prompts]
    ids = [encode(target.tokenizer, p.text) for p in prompts]
    doc = llama_peer.run(target, draft, ids, k=args.k, max_new_tokens=args.max_new_tokens)

    doc.update(measured=measured, **options.machine_record(),
               command=f"thesis-lib studies llama-bench --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
                       f"-k {args.k} --dtype {args.dtype}")
    return options.emit(doc, llama_peer.text(doc), out_path)


def add_parsers(sub) -> None:
    p = sub.add_parser("llama-bench", help="llama.cpp beside this project on the embedded pair's own GGUF files",
                       description="Times llama.cpp's greedy target-only and speculative decoding (the 0.5B GGUF as "
                       "its draft) beside this project's target-only and FlashHead deferred decoding, interleaved per "
                       "demo prompt, same threads and new tokens; bytes per step of each; where the texts part. Needs "
                       "the optional extra llama (pip install -e '.[llama]'). One JSON document as the last line.")
    p.add_argument("--prompts", type=int, default=5, help="demo prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="(default: %(default)s)")
    p.add_argument("-k", type=int, default=4, help="draft tokens per round, both engines (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="this project's precision (default: %(default)s)")
    options.out(p)
    p.set_defaults(func=cmd_llama_bench)
