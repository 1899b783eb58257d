"""Commands that measure and tabulate: ``model-bench`` (Tables 4.1-4.4), ``bench`` and ``profile`` (the benchmark
protocol into a run folder), ``table`` (the thesis' tables from a run folder), ``precision-bench`` (the precisions
side by side on the CPU), ``step-profile`` (where a step's time goes), ``llama-bench`` (llama.cpp beside this
project) and ``sampling-check`` (speculative sampling proved lossless)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from ..errors import ConfigError
from ..models import specs
from . import options


def cmd_model_bench(args) -> int:
    from ..analysis import formatting
    from ..bench import embedl_peer, modelbench
    import torch

    from ..models import loading
    from ..models.cpu import cpu_name, fast_bf16

    parts = tuple(args.parts.split(","))
    known = modelbench.PARTS + modelbench.OPTIONAL_PARTS
    bad = [p for p in parts if p not in known]
    if bad:
        raise ConfigError(f"Unknown part(s) {', '.join(bad)}; use some of {', '.join(known)}.")
    if "embedl" in parts and not embedl_peer.available():
        raise ConfigError("--parts embedl compares with Embedl's own head, which needs its PyPI package: "
                          "pip install -e '.[embedl]' (flash-head 0.1.10).")
    options.check_flash(args, args.draft)
    probes = [int(x) for x in args.probe_list.split(",")] if args.probe_list else None
    if probes and min(probes) < 1:
        raise ConfigError("--probe-list values must be >= 1.")
    if args.state_tokens < 1:
        raise ConfigError(f"--state-tokens must be >= 1 (got {args.state_tokens}).")
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
               machine=platform.machine(), processor=cpu_name(), threads=options.threads(),
               prompts_used=[p.question_id for p in prompts], torch=torch.__version__, fast_bf16=fast_bf16(),
               cpu_capability=torch.backends.cpu.get_cpu_capability())
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


def _run_protocol(args, profile: bool) -> int:
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


def cmd_bench(args) -> int:
    return _run_protocol(args, profile=False)


def cmd_profile(args) -> int:
    return _run_protocol(args, profile=True)


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

    print(headline.markdown(*headline.committed(args.data)))
    return 0


def cmd_precision_bench(args) -> int:
    from ..bench import precision

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
    from ..models.weight_only import FORCED_PATH_ENV

    forced = os.environ.get(FORCED_PATH_ENV)
    doc["command"] = ((f"{FORCED_PATH_ENV}={forced} " if forced else "") + f"thesis-lib precision-bench --target {args.target} --draft {args.draft} --precisions "
                      f"{','.join(precisions)} --max-block {args.max_block} --reps {args.reps} --e2e-prompts "
                      f"{args.e2e_prompts} --max-new-tokens {args.max_new_tokens} -k {args.k}"
                      + (f" --int4-group {args.int4_group}" if "int4" in precisions else "")
                      + (" --emulated" if args.emulated else ""))
    return options.emit(doc, precision.text(doc), out_path)


def _embedded_pair(args, also=()):
    """The embedded pair in ``--dtype`` after the cheap checks, and the draft again in each precision of ``also``:
    ``(--out's new path, provenance, target, draft, {precision: draft})``."""
    from ..bench.environment import provenance
    from ..models import loading
    for spec in (specs.DEFAULT_TARGET, specs.DEFAULT_DRAFT):
        specs.check_available(spec)
    for d in also:  # an unknown precision fails before any model loads
        loading.resolved_dtype(d)
    out_path, measured = options.new_out_path(args), provenance()
    target, draft = loading.load_pair(dtype=args.dtype)
    others = {d: loading.load_model(specs.DEFAULT_DRAFT, dtype=d, tokenizer=draft.tokenizer) for d in also}
    return out_path, measured, target, draft, others


def cmd_llama_bench(args) -> int:
    from ..bench import llama_peer
    from ..bench.prompts import demo_prompts, encode

    llama_peer.check()  # before any model loads
    if args.prompts < 1 or args.max_new_tokens < 1 or args.k < 1:
        raise ConfigError("--prompts, --max-new-tokens and -k must be >= 1.")
    out_path, measured, target, draft, _ = _embedded_pair(args)
    prompts = demo_prompts()[: args.prompts]
    ids = [encode(target.tokenizer, p.text) for p in prompts]
    doc = llama_peer.run(target, draft, ids, k=args.k, max_new_tokens=args.max_new_tokens)
    import torch

    from ..models.cpu import cpu_name, fast_bf16

    doc.update(measured=measured, processor=cpu_name(), torch=torch.__version__, fast_bf16=fast_bf16(),
               cpu_capability=torch.backends.cpu.get_cpu_capability(),
               command=f"thesis-lib llama-bench --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
                       f"-k {args.k} --dtype {args.dtype}")
    return options.emit(doc, llama_peer.text(doc), out_path)


def cmd_step_profile(args) -> int:
    from ..bench import stepprofile
    from ..bench.prompts import demo_prompts, encode
    from ..heads.for_model import flashhead_for

    if args.reps < 3 or args.max_block < 1 or args.new_tokens < 2:
        raise ConfigError("--reps must be >= 3, --max-block >= 1 and --new-tokens >= 2.")
    out_path, measured, target, draft, others = _embedded_pair(args, args.also_draft)
    doc = stepprofile.run(target, draft, flashhead_for(draft), encode(target.tokenizer, demo_prompts()[0].text),
                          blocks=tuple(range(1, args.max_block + 1)), reps=args.reps, new_tokens=args.new_tokens,
                          compare=tuple(args.compare), other_drafts={d: (m, flashhead_for(m)) for d, m in others.items()})
    doc.update(measured=measured, command=f"thesis-lib step-profile --dtype {args.dtype} --max-block {args.max_block} "
               f"--reps {args.reps} --new-tokens {args.new_tokens}" + "".join(f" --compare {c}" for c in args.compare)
               + "".join(f" --also-draft {d}" for d in args.also_draft))
    return options.emit(doc, stepprofile.text(doc), out_path)


def cmd_sampling_check(args) -> int:
    from ..analysis import distcheck
    from ..bench.environment import provenance
    from ..bench.protocol import available_cores

    if not 0 < args.delta < 1 or not 0 < args.alpha < 1 or not 0 < args.power < 1:
        raise ConfigError("--delta, --alpha and --power must lie strictly between 0 and 1.")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {args.workers}).")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; choose a new file (nothing was overwritten).")
    measured = provenance()  # taken before the hour of draws: the code and revision that make them
    pair, t0 = distcheck.tiny_pair(), time.perf_counter()

    def report(r):
        print(f"case {r['case']} {r['draft']:5s} {r['schedule']:8s}: {r['draws']} draws, {r['cells']} cells, "
              f"max |z| {r['max_abs_z']:.2f} vs {r['critical_z']:.2f}, power {r['power']:.4f}, "
              f"acceptance {r['acceptance']:.3f} -> {'ok' if r['ok'] else 'FAIL'}", flush=True)

    result = distcheck.run_all(pair, delta=args.delta, alpha=args.alpha, power=args.power, workers=args.workers,
                               progress=True, on_row=report)
    control, ok = result["negative_control"], result["ok"]
    print(f"negative control (always accept): max |z| {control['max_abs_z']:.1f} vs {control['critical_z']:.2f} "
          f"-> {'rejected, as it must be' if not control['ok'] else 'NOT REJECTED: the check is too weak'}")
    doc = {"delta": args.delta, "alpha": args.alpha, "power": args.power, "chunk": distcheck.CHUNK,
           "workers": args.workers or available_cores(), "configurations": result["configurations"],
           "negative_control": control, "ok": ok, "seconds": round(time.perf_counter() - t0, 1),
           "environment": {"python": platform.python_version(), "machine": platform.machine(),
                           "processor": platform.processor()}, "measured": measured}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("configurations", "negative_control")}))
    return 0 if ok else 1


def _add_protocol_parser(sub, name: str, helptext: str, func) -> None:
    from ..bench.modes import ALL_MODES, THESIS_MODES

    p = sub.add_parser(name, help=helptext, description=helptext)
    options.pair(p, max_new_tokens=32)
    if name == "bench":
        p.add_argument("--modes", default=",".join(THESIS_MODES),
                       help=f"comma-separated modes, of: {', '.join(ALL_MODES)}; a greedy mode with the fixed K may "
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
                         cmd_bench)
    _add_protocol_parser(sub, "profile", "the profiled run (Tables 4.7/4.8): dense, dense-shared and FlashHead drafts",
                         cmd_profile)

    p = sub.add_parser("table", help="the thesis' tables (4.5-4.11) and extra tables from a run folder")
    p.add_argument("run", help="a run folder (from thesis-lib bench or profile)")
    p.add_argument("--table", default="all", help="comma-separated: 4.5, 4.6, 4.7, 4.8, 4.9, 4.10, 4.11, draft-split, "
                   "ratios, peers, pipelined, verification, accepted; or all (default: all the run supports)")
    p.add_argument("--format", default="text", choices=["text", "markdown", "csv"], help="output format (default: text)")
    p.add_argument("--against", default=None, help="a second run folder of the same configuration: print the "
                   "reproducibility table (identical tokens, acceptance, speed spread) instead")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("results", help="the thesis' main ratios beside a build's (the README's results table)")
    p.add_argument("--data", default=None, help="a build's run folder (default: the committed default build's, "
                   "data/reference/book-cpu-embedded)")
    p.set_defaults(func=cmd_results)

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

    p = sub.add_parser("sampling-check", help="prove speculative sampling lossless on tiny models (exact test)",
                       description="Speculative sampling (dense and FlashHead drafts, ordinary and deferred) against "
                       "target-only sampling's exact distribution of the first tokens (tiny models, 8 tokens), draws "
                       "enough to catch an error of --delta with probability --power; a wrong rule must fail.")
    p.add_argument("--delta", type=float, default=0.01, help="absolute error to catch (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=1e-3, help="family-wise level per configuration (default: %(default)s)")
    p.add_argument("--power", type=float, default=0.99, help="power against --delta (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes making the draws (default: one per core; any number: the same draws)")
    options.out(p, "write the results as JSON to this new file")
    p.set_defaults(func=cmd_sampling_check)
