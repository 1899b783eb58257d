"""The options the commands share, defined once: the model pair, decoding, FlashHead, prompts, output and the
executor; and the small helpers that turn them into the library's objects."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from .. import extensions
from ..errors import ConfigError, at_least
from ..models import specs
from ..models.cache import write_json

PROMPT_FILE_HELP = "a Spec-Bench-format question file (path or http(s) URL, cached), or a shipped set: {}"


def models(p: argparse.ArgumentParser, *, target: bool = True) -> None:
    """Target and draft specs, devices, dtype and the CPU kernels."""
    g = p.add_argument_group("models")
    if target:
        g.add_argument("--target", default=specs.DEFAULT_TARGET, help="target model spec (default: %(default)s)")
    g.add_argument("--draft", default=specs.DEFAULT_DRAFT, help="draft model spec (default: %(default)s)")
    g.add_argument("--device", default="cpu", help="device for both models, e.g. cpu, cuda:0 (default: %(default)s)")
    if target:
        g.add_argument("--draft-device", default=None, help="device for the draft if it differs from --device")
    g.add_argument("--dtype", default="auto", help="auto (bfloat16 where the CPU or GPU runs it natively, else float32), "
                   "float32, bfloat16, float16 (default: auto)")
    if target:
        g.add_argument("--draft-dtype", default="auto", help="the draft's precision: auto (int4-dynamic, a 4-bit body, "
                       "beside an int8-dynamic target on a CPU; else --dtype), same (--dtype) or any --dtype value")
    g.add_argument("--no-pack", action="store_true", help="keep the stock linear kernels on CPU (default: oneDNN-packed)")


def chat(g) -> None:
    g.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")
    g.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="the chat template's thinking switch (Qwen3's enable_thinking; default: the template's own)")


def decoding(p: argparse.ArgumentParser, max_new_tokens: int = 64) -> None:
    """K, new tokens per prompt and the chat template."""
    g = p.add_argument_group("decoding")
    g.add_argument("-k", "--k", type=int, default=4, help="block length K: draft tokens per round (default: %(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help="tokens to generate per prompt (default: %(default)s)")
    g.add_argument("--tree-width", type=int, default=3, help="*_tree modes: most nodes per depth of a K-deep token "
                   "tree (default: %(default)s)")
    g.add_argument("--tree-shape", default=None, help="*_tree modes: every node's rank path instead, e.g. "
                   "'0 1 0.0 0.1 0.0.0' (thesis-lib studies tree-bench picks them from measured costs)")
    chat(g)


def pair(p: argparse.ArgumentParser, max_new_tokens: int = 64) -> None:
    models(p)
    decoding(p, max_new_tokens)


def flash(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("FlashHead (flash_* modes)")
    g.add_argument("--probes", type=int, default=None, help="clusters probed per step (default: C/16, Embedl's)")
    g.add_argument("--clusters", type=int, default=None, help="clusters C of our clustering (default: V/16)")
    g.add_argument("--assets", default=None, help="a flash_head_assets folder (Embedl's format) instead of our clustering")
    g.add_argument("--flash-path", default="auto", choices=["auto", "kernel", "compiled", "eager", "reference"],
                   help="FlashHead implementation (default: auto = the C++ kernel's greedy head on a CPU, else compiled; "
                   "eager if compilation fails)")
    g.add_argument("--centroid-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="precision of the centroid ranking (default: bf16 where the CPU has fast bf16)")
    g.add_argument("--cluster-seed", type=int, default=0, help="clustering seed (default: 0)")
    g.add_argument("--kmeans-iterations", type=int, default=20, help="k-means iterations (default: 20)")


def prompts(g, default_file: str | None = None) -> None:
    """``--prompt-file``, ``--categories`` and ``--prompts`` (into an argument group, or a group of their own)."""
    if isinstance(g, argparse.ArgumentParser):
        g = g.add_argument_group("prompts")
    shipped = "project (default), demo" if default_file == "project" else "demo (default), project"
    g.add_argument("--prompt-file", default=default_file, help=PROMPT_FILE_HELP.format(shipped))
    g.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    g.add_argument("--prompts", type=int, default=None, help="keep the first N prompts (default: all)")


def out(p, helptext: str = "write the JSON document to this new file") -> None:
    p.add_argument("--out", default=None, help=helptext)


def thinking(args) -> bool | None:
    return None if args.thinking is None else args.thinking == "on"


def pack(args) -> bool | None:
    return False if getattr(args, "no_pack", False) else None


def check_decoding(args) -> None:
    at_least("--k", args.k), at_least("--max-new-tokens", args.max_new_tokens)
    specs.check_context(args.target, args.max_new_tokens + args.k + 1, f"--max-new-tokens {args.max_new_tokens} "
                        f"and a block of {args.k + 1}")
    extensions.runner_options(args, [])  # the study loops' settings (a tree's width and shape), checked


class FlashArgs:
    """The FlashHead fields of a command's namespace under the names ``BenchConfig`` uses."""

    def __init__(self, args, draft: str):
        self.draft, self.probes, self.clusters, self.assets = draft, args.probes, args.clusters, args.assets
        self.flash_path, self.centroid_dtype = args.flash_path, args.centroid_dtype
        self.cluster_seed, self.kmeans_iterations = args.cluster_seed, args.kmeans_iterations
        self.dtype, self.pack = getattr(args, "dtype", "auto"), pack(args)


def check_flash(args, spec: str) -> None:
    """Probe/cluster counts checked against the model's config before any weights load."""
    from ..bench.protocol import check_flash as check

    check(FlashArgs(args, spec))


def flash_head(args, draft):
    from ..bench.drafts import flash_body, flash_head as build

    cfg = FlashArgs(args, draft.spec)
    return build(cfg, draft, flash_body(cfg, draft))


def select_prompts(args) -> list:
    """The prompt source (default: the demo set), filtered by ``--categories`` and cut to ``--prompts``."""
    from ..bench.prompts import demo_prompts, load_prompts, select

    found = load_prompts(args.prompt_file) if args.prompt_file else demo_prompts()
    return select(found, getattr(args, "categories", None), args.prompts)


def new_out_path(args) -> Path | None:
    """``--out`` as a path that does not exist yet (results are never overwritten)."""
    path = Path(args.out) if args.out else None
    if path and path.exists():
        raise ConfigError(f"{path} exists; choose another --out (results are never overwritten).")
    if path and path.parent.exists() and not path.parent.is_dir():
        raise ConfigError(f"{path.parent} is a file, not a folder; choose another --out.")
    return path


def write_new(path: Path | None, doc: dict) -> None:
    """Save ``doc`` to the new file ``path`` (checked by :func:`new_out_path` before the work); where something made
    that file meanwhile, to a new name beside it, said on stderr: a finished measurement is never lost."""
    if not path:
        return
    stamp, asked = time.strftime("%Y%m%d-%H%M%S"), path
    path.parent.mkdir(parents=True, exist_ok=True)  # here, once: in the loop a file existing is a name taken
    for n in itertools.count(1):
        try:
            write_json(path, doc, replace=False)
            break
        except FileExistsError:
            path = asked.with_name(f"{asked.stem}-{stamp}{f'-{n}' if n > 1 else ''}{asked.suffix}")
    if path != asked:
        print(f"--out appeared while this ran; the document goes to {path} instead", file=sys.stderr)


def emit(doc: dict, text: str, path: Path | None) -> int:
    """Print a measurement's table and its document (the last line, printed before a save that could fail), save it
    to the new file ``path``."""
    print(text)
    print(json.dumps(doc), flush=True)
    write_new(path, doc)
    return 0


def command_line(files: tuple[str, ...] = ("--out",)) -> str:
    """This process's ``thesis-lib`` command as typed, without the options in ``files`` and their values (paths of
    this machine, which a committed document must not carry)."""
    import shlex

    argv, kept = sys.argv[1:], []
    for i, a in enumerate(argv):
        if a in files or (i and argv[i - 1] in files) or a.startswith(tuple(f + "=" for f in files)):
            continue
        kept.append(a)
    return "thesis-lib " + " ".join(shlex.quote(a) for a in kept)


def machine_record() -> dict:
    """What a command's document records about the machine it ran on: architecture, processor, threads, torch, and
    the CPU's vector extensions and native bf16 support."""
    import platform

    import torch

    from ..models.cpu import cpu_name, fast_bf16

    return {"machine": platform.machine(), "processor": cpu_name(), "threads": threads(), "torch": torch.__version__,
            "fast_bf16": fast_bf16(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def threads() -> int:
    import torch

    return torch.get_num_threads()


def assignments(items: list[str], what: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` strings as pairs; a malformed one is a :class:`ConfigError` naming ``what``."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} takes KEY=VALUE (got {item!r}).")
        pairs.append((key.strip(), value.strip()))
    return pairs


def executor(p: argparse.ArgumentParser, local_help: str = "local: in order on this machine (default); "
             "slurm: one job each", subprocess: bool = True, poll: bool = True) -> None:
    """Where runs execute, and the Slurm resources of each job."""
    p.add_argument("--executor", default="local", choices=["local", "slurm"], help=local_help)
    if subprocess:
        p.add_argument("--subprocess", action="store_true", help="local: each run in its own process, with a log")
    if poll:
        p.add_argument("--poll", type=float, default=10.0, help="seconds between looks at the queue (default 10)")
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


def make_executor(args, workdir: Path | None = None):
    """The executor the arguments name; a Slurm job starts in ``workdir`` (default: here, like the run folders'
    relative paths)."""
    from ..sweep import local, slurm

    if args.executor == "local":
        return local.LocalExecutor(isolate=getattr(args, "subprocess", False))
    resources = slurm.Resources(partition=args.partition, gpus=args.gpus, cpus=args.cpus, mem=args.mem,
                                time=args.time, account=args.account, extra=list(args.sbatch_arg))
    return slurm.SlurmExecutor(resources, workdir=workdir)


def embedded_pair(args, also=()):
    """The embedded pair in ``--dtype`` after the cheap checks, and the draft again in each precision of ``also``:
    ``(--out's new path, provenance, target, draft, {precision: draft})``."""
    from ..bench.environment import provenance
    from ..models import loading
    for spec in (specs.DEFAULT_TARGET, specs.DEFAULT_DRAFT):
        specs.check_available(spec)
    for d in also:  # an unknown precision fails before any model loads
        loading.resolved_dtype(d)
    out_path, measured = new_out_path(args), provenance()
    target, draft = loading.load_pair(dtype=args.dtype)
    others = {d: loading.load_model(specs.DEFAULT_DRAFT, dtype=d, tokenizer=draft.tokenizer) for d in also}
    return out_path, measured, target, draft, others
