"""Commands that measure and tabulate: ``model-bench`` (Tables 4.1-4.4, and the parts studies add), ``bench`` and
``profile`` (the benchmark protocol into a run folder), ``table`` (the thesis' tables from a run folder) and
``results`` (the thesis' main ratios beside a build's)."""

from __future__ import annotations

import statistics
from functools import partial

from ..errors import ConfigError, at_least
from . import options


def cmd_model_bench(args) -> int:
    from .. import extensions
    from ..analysis import formatting
    from ..bench import modelbench
    from ..models import loading

    try:
        probes = [at_least("--probe-list values", int(x)) for x in args.probe_list.split(",")] if args.probe_list else None
    except ValueError:
        raise ConfigError(f"--probe-list takes whole numbers separated by commas (got {args.probe_list!r}).") from None
    parts = tuple(args.parts.split(","))
    known = modelbench.known_parts()
    bad = [p for p in parts if p not in known]
    if bad:
        raise ConfigError(f"Unknown part(s) {', '.join(bad)}; use some of {', '.join(known)}.")
    for name in parts:
        part = extensions.MODEL_BENCH_PARTS.get(name)
        if part is not None and part.available is not None and not part.available():
            raise ConfigError(part.missing)
    options.check_flash(args, args.draft)
    at_least("--state-tokens", args.state_tokens)
    prompts = options.select_prompts(args)
    out_path = options.new_out_path(args)
    from ..bench.environment import provenance

    measured = provenance()
    loaded = loading.load_model(args.draft, device=args.device, dtype=args.dtype, pack=options.pack(args))
    head = options.flash_head(args, loaded)
    doc = modelbench.run(loaded, head, prompts, parts=parts, probes=probes, state_tokens=args.state_tokens,
                         head_reps=args.head_reps, step_reps=args.step_reps, chat=not args.no_chat,
                         thinking=options.thinking(args), states_file=args.states)
    doc.update(measured=measured, command=options.command_line(files=("--out", "--states")),
               draft=args.draft, device=args.device, dtype=loaded.dtype, cpu_kernels=loaded.info.get("cpu_kernels"),
               prompts_used=[p.question_id for p in prompts], **options.machine_record())
    return options.emit(doc, formatting.model_bench_text(doc), out_path)


def _bench_config(args, profile: bool):
    from ..bench.modes import profile_modes
    from ..bench.protocol import BenchConfig

    modes = profile_modes(args.schedule) if profile else tuple(m for m in args.modes.split(",") if m)
    beyond = {} if profile else dict(  # thesis-lib profile: the thesis' drafts only
        k_max=args.k_max, adaptive_margin=args.adaptive_margin, adaptive_min_probes=args.adaptive_min_probes,
        freq_tokens=args.freq_tokens, freq_calibration=args.freq_calibration, temperature=args.temperature,
        top_k=args.top_k or None, top_p=None if args.top_p == 1 else args.top_p, stop_below=args.stop_below)
    return BenchConfig(
        name=args.name, out=args.out, target=args.target, draft=args.draft, device=args.device,
        draft_device=args.draft_device, dtype=args.dtype, draft_dtype=args.draft_dtype, pack=options.pack(args), k=args.k,
        max_new_tokens=args.max_new_tokens, modes=modes, prompt_file=args.prompt_file, categories=args.categories,
        per_category=args.per_category or None, prompts=args.prompts, turns=args.turns, chat=not args.no_chat,
        thinking=options.thinking(args), warmup=args.warmup, iterations=args.iterations, seed=args.seed,
        costs=not args.no_costs, profile=profile, probes=args.probes, clusters=args.clusters, assets=args.assets,
        flash_path=args.flash_path, centroid_dtype=args.centroid_dtype, cluster_seed=args.cluster_seed,
        kmeans_iterations=args.kmeans_iterations, threads=args.threads, tree_width=args.tree_width,
        tree_shape=args.tree_shape, **beyond)


def run_protocol(args, profile: bool = False) -> int:
    """``thesis-lib bench`` (or, with ``profile``, ``thesis-lib profile``): run the protocol into a run folder and
    print its tables."""
    from ..analysis import formatting, tables
    from ..bench import protocol

    run = protocol.run(_bench_config(args, profile), resume=args.resume, replace=args.replace)
    costs = [r["component_costs_s"] for r in run.samples if r.get("component_costs_s") and r["mode"] == "baseline"]
    costs = {k: statistics.median(c[k] for c in costs) for k in costs[0]} if costs else {}
    print(formatting.summary_text(run.summary, costs, args.k, args.max_new_tokens))
    for name, df in tables.available(run).items():
        print(f"Table {name}" if name[0].isdigit() else f"{name}:")
        print(formatting.to_markdown(df) + "\n")
    print(f"run folder: {run.path}")
    return 0


def print_frame(title: str, df, fmt: str) -> None:
    """One table as text, markdown or CSV (a ``# title`` line above the CSV)."""
    from ..analysis import formatting

    if fmt == "csv":
        print(f"# {title}")
        print(df.to_csv(index=False), end="")
    elif fmt == "markdown":
        print(f"{title}\n\n{formatting.to_markdown(df)}\n")
    else:
        print(f"{title}\n{df.to_string(index=False)}\n")


def cmd_table(args) -> int:
    from ..analysis import diagnostics, tables
    from ..bench.runs import load_run

    run = load_run(args.run)
    names = list(tables.TABLES) if args.table == "all" else args.table.split(",")
    unknown = [n for n in names if n not in tables.TABLES]
    if unknown:
        raise ConfigError(f"Unknown table(s) {', '.join(unknown)}; known: {', '.join(tables.TABLES)}, all.")
    if args.against:
        frames = {"reproducibility": diagnostics.reproducibility(run, load_run(args.against))}
    elif args.table == "all":
        frames = tables.available(run)
    else:
        frames = {n: tables.TABLES[n](run) for n in names}
    for name, df in frames.items():
        print_frame(f"Table {name}" if name[0].isdigit() else name, df, args.format)
    return 0


def cmd_results(args) -> int:
    from ..analysis import headline

    print(headline.markdown(*headline.committed(args.data)) if args.data else headline.markdown_settings())
    return 0


def _add_protocol_parser(sub, name: str, helptext: str, func) -> None:
    from ..bench.modes import THESIS_MODES, all_modes

    p = sub.add_parser(name, help=helptext, description=helptext)
    options.pair(p, max_new_tokens=32)
    if name == "bench":
        p.add_argument("--modes", default=",".join(THESIS_MODES),
                       help=f"comma-separated modes, of: {', '.join(all_modes())}; a greedy mode with the fixed K may "
                            "take its own K and FlashHead probe count, e.g. flash_deferred@k6p148, timed "
                            "beside the same baseline (default: %(default)s)")
    else:
        p.add_argument("--schedule", default="ordinary", choices=["ordinary", "deferred", "pipelined"],
                       help="the schedule profiled (default: %(default)s, as the thesis' Table 4.7)")
    g = p.add_argument_group("prompts")
    options.prompts(g, default_file="project")
    g.add_argument("--per-category", type=int, default=2 if name == "bench" else 1,
                   help="the first N prompts of each category, before --prompts; 0 = all (default: %(default)s)")
    g.add_argument("--turns", default="first", choices=["first", "flatten"],
                   help="multi-turn records: the first turn, or all turns flattened into one (default: first)")
    g = p.add_argument_group("protocol")
    g.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds of every mode (default: 1)")
    g.add_argument("--iterations", type=int, default=1, help="measured iterations over the prompts (default: 1)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    g.add_argument("--no-costs", action="store_true", help="skip the per-prompt component costs (and predictions)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads (default: every core this process may use); recorded")
    g.add_argument("--out", default="runs", help="parent folder of run folders (default: %(default)s)")
    g.add_argument("--name", default=name, help="run folder name (default: %(default)s); never overwritten")
    g.add_argument("--resume", action="store_true", help="finish an interrupted run (same configuration)")
    g.add_argument("--replace", action="store_true", help="move an existing run folder aside (<name>.old-N) and start afresh")
    options.flash(p)
    if name == "bench":
        g = p.add_argument_group("beyond the thesis (modes adaflash_*, freq_*, *_hk, *_ck, *_sk, sample_*)")
        g.add_argument("--k-max", type=int, default=12, help="largest K of the adaptive-K modes (default: 12)")
        g.add_argument("--stop-below", type=float, default=None,
                       help="*_sk: a draft block ends at the first token whose draft probability is below this")
        g.add_argument("--adaptive-margin", type=float, default=None,
                       help="adaflash: probe the clusters within this centroid-score margin (x |h|) of the best")
        g.add_argument("--adaptive-min-probes", type=int, default=1, help="adaflash: at least this many probes")
        g.add_argument("--freq-tokens", type=int, default=None,
                       help="freq: tokens the truncated head scores (default: FlashHead's candidate count)")
        g.add_argument("--freq-calibration", type=int, default=3,
                       help="freq: unmeasured prompts per category its frequencies are counted on (default: 3)")
        g.add_argument("--temperature", type=float, default=0.7, help="sample_*: temperature (default: 0.7)")
        g.add_argument("--top-k", type=int, default=20, help="sample_*: top-k, 0 = off (default: 20)")
        g.add_argument("--top-p", type=float, default=0.8, help="sample_*: top-p, 1 = off (default: 0.8)")
    p.set_defaults(func=func)


def add_parsers(sub) -> None:
    p = sub.add_parser("model-bench", help="FlashHead quality, head latency and draft step latency (Tables 4.1-4.4)")
    options.models(p, target=False)
    options.chat(p)
    p.add_argument("--parts", default="quality,head,step", help="comma-separated: quality, head, step, embedl "
                   "(Embedl's head beside ours; needs the embedl extra), batch (both heads on 1-32 states at once) "
                   "(default: %(default)s)")
    p.add_argument("--probe-list", default=None, help="probe counts for the curves (default: powers of 2, C/16 and C)")
    p.add_argument("--state-tokens", type=int, default=128, help="decode steps per prompt for the hidden states (default: 128)")
    p.add_argument("--head-reps", type=int, default=3, help="passes over all hidden states for Table 4.1 (default: 3)")
    p.add_argument("--step-reps", type=int, default=5, help="passes over all prompts for Table 4.3 (default: 5)")
    options.prompts(p)
    p.add_argument("--states", default=None, help="hidden-state file: read if it exists, else collected and written")
    options.out(p, "write the result document here (JSON; must not exist)")
    options.flash(p)
    p.set_defaults(func=cmd_model_bench)

    _add_protocol_parser(sub, "bench", "the benchmark protocol: every mode on the project's prompts into a run folder",
                         run_protocol)
    _add_protocol_parser(sub, "profile", "the profiled run (Tables 4.7/4.8): dense, dense-shared and FlashHead drafts",
                         partial(run_protocol, profile=True))

    p = sub.add_parser("table", help="the thesis' tables (4.5-4.11) and extra tables from a run folder")
    p.add_argument("run", help="a run folder (from thesis-lib bench or profile)")
    p.add_argument("--table", default="all", help="comma-separated: 4.5, 4.6, 4.7, 4.8, 4.9, 4.10, 4.11, draft-split, "
                   "ratios, peers, pipelined, verification, accepted; or all (default: all the run supports)")
    p.add_argument("--format", default="text", choices=["text", "markdown", "csv"], help="output format (default: text)")
    p.add_argument("--against", default=None, help="a second run folder of the same configuration: print the "
                   "reproducibility table (identical tokens, acceptance, speed spread) instead")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("results", help="the thesis' main ratios beside a build's (the README's results table)")
    p.add_argument("--data", default=None, help="one build's run folder (default: the committed default build's, "
                   "data/reference/book-cpu-embedded, then the thesis' cost regime's)")
    p.set_defaults(func=cmd_results)
