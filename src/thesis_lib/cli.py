"""The ``thesis-lib`` command line.

- ``thesis-lib prepare``: assemble and convert the embedded models into the model cache (once).
- ``thesis-lib generate``: one prompt, one mode; prints the text and the stats.
- ``thesis-lib compare``: the first benchmark (``bench``): every mode on the demo prompts, interleaved,
  a table of medians and ratios against target-only decoding; the last line of output is one JSON document.

Errors the user can fix print as one message and exit with status 2, before any heavy work.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

from . import models
from .errors import ConfigError, ThesisLibError


def _add_pair_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=models.DEFAULT_TARGET, help="target model spec (default: %(default)s)")
    p.add_argument("--draft", default=models.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="device for both models, e.g. cpu, cuda:0 (default: %(default)s)")
    p.add_argument("--draft-device", default=None, help="device for the draft if it differs from --device")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    p.add_argument("-k", "--k", type=int, default=4, help="block length K: draft tokens per round (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")
    p.add_argument("--no-pack", action="store_true", help="keep the stock linear kernels on CPU (default: oneDNN-packed)")


def _check_common(args) -> None:
    if args.k < 1:
        raise ConfigError(f"--k must be >= 1 (got {args.k}).")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens}).")


def cmd_prepare(args) -> int:
    for spec in args.models or [models.DEFAULT_TARGET, models.DEFAULT_DRAFT]:
        path = models.local_dir(spec)
        print(f"{spec}: {path}")
    return 0


def cmd_generate(args) -> int:
    from .bench import Runner
    from .prompts import encode

    _check_common(args)
    if args.mode not in ("baseline", "dense_ordinary", "dense_deferred", "hf_greedy", "hf_assisted"):
        raise ConfigError(f"Unknown mode {args.mode!r}.")
    target, draft = models.load_pair(args.target, args.draft, device=args.device, draft_device=args.draft_device,
                                     dtype=args.dtype, pack=False if args.no_pack else None)
    runner = Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens)
    gen = runner.run(args.mode, encode(target.tokenizer, args.prompt, chat=not args.no_chat))
    print(target.tokenizer.decode(gen.tokens))
    print(json.dumps({k: v for k, v in gen.stats.to_dict().items()}, default=str))
    return 0


def cmd_compare(args) -> int:
    from .bench import ALL_MODES, Runner, compare, summarize
    from .prompts import demo_prompts, load_jsonl

    _check_common(args)
    modes = tuple(args.modes.split(",")) if args.modes else ALL_MODES
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {', '.join(unknown)}; known: {', '.join(ALL_MODES)}.")
    prompts = load_jsonl(args.prompt_file) if args.prompt_file else demo_prompts()
    if args.categories:
        wanted = set(args.categories.split(","))
        missing = wanted - {p.category for p in prompts}
        if missing:
            raise ConfigError(f"Unknown categor{'y' if len(missing) == 1 else 'ies'} {sorted(missing)}; "
                              f"available: {sorted({p.category for p in prompts})}.")
        prompts = [p for p in prompts if p.category in wanted]
    prompts = prompts[: args.prompts] if args.prompts else prompts
    if not prompts:
        raise ConfigError("No prompts selected.")
    out_path = Path(args.out) if args.out else None
    if out_path and out_path.exists():
        raise ConfigError(f"{out_path} exists; choose another --out (results are never overwritten).")

    target, draft = models.load_pair(args.target, args.draft, device=args.device, draft_device=args.draft_device,
                                     dtype=args.dtype, pack=False if args.no_pack else None)
    runner = Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens)
    sink = None
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        sink = open(out_path, "x", encoding="utf-8")
    try:
        records = compare(runner, prompts, modes, chat=not args.no_chat, warmup=args.warmup,
                          on_record=(lambda r: (sink.write(json.dumps(r) + "\n"), sink.flush())) if sink else None)
    finally:
        if sink:
            sink.close()
    summary = summarize(records)
    costs = {k: statistics.median(r["component_costs_s"][k] for r in records if r["mode"] == "baseline")
             for k in records[0]["component_costs_s"]}
    _print_table(summary, costs, args)
    doc = {"target": args.target, "draft": args.draft, "k": args.k, "max_new_tokens": args.max_new_tokens,
           "prompts": [p.question_id for p in prompts], "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "threads": _threads(),
           "cpu_kernels": target.info.get("cpu_kernels"), "component_costs_s": costs, "summary": summary}
    print(json.dumps(doc))
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _print_table(summary: dict, costs: dict, args) -> None:
    print(f"\nK = {args.k}, {args.max_new_tokens} new tokens, medians over prompts")
    print("component costs (median over prompts): " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in costs.items()))
    head = f"{'mode':<16}{'decode tok/s':>13}{'x baseline':>11}{'e2e x base':>11}{'TTFT s':>8}{'accepted/drafted':>18}{'emitted/round':>15}{'pred/meas':>10}{'= baseline':>11}"
    print(head)
    print("-" * len(head))
    for mode, s in summary.items():
        print(f"{mode:<16}{_fmt(s['decode_tokens_per_s']):>13}{_fmt(s['speedup_vs_baseline'], '.3f'):>11}"
              f"{_fmt(s['e2e_speedup_vs_baseline'], '.3f'):>11}"
              f"{_fmt(s['ttft_s']):>8}{_fmt(s['acceptance'], '.3f'):>18}{_fmt(s['mean_emitted']):>15}"
              f"{_fmt(s.get('predicted_over_measured'), '.3f'):>10}{s['matches_baseline']:>8}/{s['samples']}")
    print("accepted/drafted: the thesis' acceptance rate; emitted/round: tau, counting the target's own token.")
    print("pred/meas: decode tok/s predicted from the component costs over the measured value.")
    print("e2e: all new tokens over TTFT + decode time (transformers' assisted loop emits its first draft block inside TTFT).\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thesis-lib", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="assemble and convert the embedded models into the cache")
    p.add_argument("models", nargs="*", help="model specs (default: the embedded target and draft)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("generate", help="generate for one prompt with one mode")
    _add_pair_args(p)
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--mode", default="dense_deferred", help="baseline, dense_ordinary, dense_deferred, hf_greedy, hf_assisted")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="benchmark every mode on the demo prompts, interleaved")
    _add_pair_args(p)
    p.add_argument("--modes", default=None, help="comma-separated subset of: baseline, dense_ordinary, "
                   "dense_deferred, hf_greedy, hf_assisted (default: all)")
    p.add_argument("--prompts", type=int, default=None, help="use the first N prompts (default: all 8)")
    p.add_argument("--prompt-file", default=None, help="a Spec-Bench-format JSON-lines question file")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per mode (default: 1)")
    p.add_argument("--out", default=None, help="write one JSON line per sample here (must not exist)")
    p.set_defaults(func=cmd_compare)
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


if __name__ == "__main__":
    sys.exit(main())
