"""Heads and whole decoding at batch B: the dense head against FlashHead on B hidden states at once,
and greedy decoding of B prompts at once, target-only against speculative.

At batch B the dense head is one matrix product that reads the vocabulary's rows once for all B rows, so its cost
per row falls as B grows. FlashHead probes its clusters row by row (each row's candidates are its own, exactly as
at B = 1), so B rows read the union of the clusters their rows probe: one row's worth where the rows agree, B times
that where they share nothing. :func:`candidate_union` counts that union on real states; :func:`heads_by_batch`
times both heads on the same states grouped B at a time, interleaved, keeping every timing for the intervals
(:mod:`thesis_studies.serving.batch_tables` reads them).

:func:`decode_by_batch` decodes the same prompts in groups of B with :mod:`thesis_studies.serving.loops`: batched
target-only decoding and batched speculative decoding with each draft and schedule, modes interleaved per group,
every row checked against its prompt's one-row target-only output. It keeps every run's decode seconds (the target's per-row prefills
left out: they are the same in every mode) and each row's latency.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from thesis_lib.errors import ConfigError
from thesis_lib.bench.disturbance import Watch
from thesis_lib.bench.timing import interleaved, stats_ms
from thesis_lib.decoding.clocks import alternating

#: the batch sizes measured by default: heads, and whole decoding
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DECODE_BATCHES = (1, 2, 4, 8)
#: batched decoding's modes: target-only, and each draft (``dense``, ``flash``) with each schedule
DECODE_MODES = ("baseline", "dense_ordinary", "dense_deferred", "flash_ordinary", "flash_deferred")


def candidate_union(head, states: torch.Tensor, batch: int) -> dict:
    """Over groups of ``batch`` consecutive ``states``, the mean number of distinct clusters the group's rows
    probe (``clusters``), the candidate rows that means (``rows``: clusters x cluster size, plus the special
    tokens scored on every row), and the clusters over one row's probes (``over_one_row``: 1 where every row
    probes the same clusters, ``batch`` where no two rows share one)."""
    groups = states.shape[0] // batch
    if groups < 1:
        raise ConfigError(f"{states.shape[0]} states make no group of {batch}.")
    top = head.top_clusters(states[: groups * batch], reference=False)
    distinct = [torch.unique(top[g * batch:(g + 1) * batch]).numel() for g in range(groups)]
    mean = statistics.fmean(distinct)
    return {"groups": groups, "clusters": mean, "rows": mean * head.cluster_size + head.special_ids.numel(),
            "over_one_row": mean / head.n_probes}


def serving_order(states: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``states`` in a seeded random order: the rows of a served batch come from different requests at different
    positions, while consecutive states of one generation probe nearly the same clusters."""
    return states[torch.randperm(states.shape[0], generator=torch.Generator().manual_seed(seed))]


def heads_by_batch(heads: dict[str, object], states: torch.Tensor, flash: str = "flashhead",
                   batch_sizes: Sequence[int] = BATCH_SIZES, *, base: str = "dense", reps: int = 3,
                   warmup: int = 3, progress: bool = True, order_seed: int | None = 0) -> dict:
    """For each batch size B: every head's greedy call (a module or a function of ``[B, D]`` states; the first
    must be a module, whose device the clocks use) on ``[B, D]`` groups of the same ``states`` (as many whole
    groups as the states make), interleaved; the median per call and per row; every timing (repetition-major over
    the groups); and the union of ``flash``'s candidate rows (:func:`candidate_union`) beside the dense head's
    whole vocabulary. With ``order_seed`` the states are first put in :func:`serving_order` (None: as given, each
    group then holds consecutive states of one generation)."""
    if order_seed is not None:
        states = serving_order(states, order_seed)
    if base not in heads or flash not in heads:
        raise ConfigError(f"heads_by_batch needs the {base!r} and {flash!r} heads, got {', '.join(heads)}.")
    device = next(iter(heads.values())).device
    vocab = getattr(heads[base], "vocab_limit", None)
    out = {}
    for b in batch_sizes:
        n = states.shape[0] // b
        if n < 2:
            raise ConfigError(f"batch {b} needs at least {2 * b} states (two groups), got {states.shape[0]}.")
        groups = [states[i * b:(i + 1) * b].contiguous().to(device) for i in range(n)]
        fns = {name: (lambda i, h=h: h(groups[i])) for name, h in heads.items()}
        with Watch() as machine:
            times = interleaved(fns, n, reps=reps, warmup=warmup, desc=f"heads at batch {b}", progress=progress,
                                device=device)
        stats = {name: stats_ms(ts) for name, ts in times.items()}
        out[str(b)] = {
            "groups": n, "stats": stats, "per_row_ms": {k: s["p50_ms"] / b for k, s in stats.items()},
            "union": candidate_union(heads[flash], states, b), "dense_rows": vocab,
            "times_ms": {k: [round(1e3 * t, 6) for t in ts] for k, ts in times.items()}, "machine": machine.record}
    return {"batch_sizes": list(batch_sizes), "base": base, "flash": flash, "order_seed": order_seed, "by_batch": out}


def check_decode(modes: Sequence[str], batch_sizes: Sequence[int], prompts: int) -> None:
    """Refuse unknown modes, and batch sizes the prompts cannot fill (before any model loads)."""
    bad = [m for m in modes if m not in DECODE_MODES]
    if bad or "baseline" not in modes:
        raise ConfigError(f"Batched decoding runs baseline and some of {', '.join(DECODE_MODES[1:])}; got "
                          f"{', '.join(modes)}.")
    if not batch_sizes or min(batch_sizes) < 1 or max(batch_sizes) > prompts:
        raise ConfigError(f"Batch sizes must lie in 1..{prompts} (the prompts); got {list(batch_sizes)}.")


def decode_by_batch(pair, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    batch_sizes: Sequence[int] = DECODE_BATCHES, modes: Sequence[str] = DECODE_MODES, reps: int = 2,
                    progress: bool = True) -> dict:
    """For each batch size B, ``prompts`` in ``len(prompts) // B`` groups of B; every mode on every group
    (``pair.batched(mode, group, n)``: :class:`thesis_studies.serving.modes.Pair`), modes interleaved with their order
    alternating, ``reps`` times, after one untimed short run of each mode at that B.
    Per B: the decode seconds of every run (index ``rep * groups + group``), the new tokens, each row's latency,
    acceptance, the rows equal to their prompt's one-row target-only output (``pair.one_row``), and the step
    costs of :func:`step_costs` on the first group."""
    from thesis_lib.progress import tqdm

    check_decode(modes, batch_sizes, len(prompts))
    run = pair.batched
    # each prompt's one-row target-only output: what every row of every mode must equal
    refs = [pair.one_row("baseline", ids, max_new_tokens).tokens
            for ids in tqdm(prompts, desc="one-row target-only references", unit="prompt", disable=not progress)]
    out = {}
    for b in batch_sizes:
        groups = [prompts[i * b:(i + 1) * b] for i in range(len(prompts) // b)]
        for mode in modes:  # untimed: first calls at this batch's shapes (compilation of a FlashHead head)
            run(mode, groups[0], min(4, max_new_tokens))
        part = {"groups": len(groups), "decode_s": {m: [] for m in modes}, "tokens": {m: [] for m in modes},
                "latency_s": {m: [] for m in modes}, "acceptance": {m: [] for m in modes},
                "rows_equal": {m: 0 for m in modes}, "rows": 0}
        with Watch() as machine, tqdm(total=reps * len(groups), desc=f"decoding at batch {b}", unit="group",
                                      disable=not progress) as bar:
            for r in range(reps):
                for g, group in enumerate(groups):
                    order = alternating(modes, r * len(groups) + g)
                    got = {m: run(m, group, max_new_tokens) for m in order}
                    ref = refs[g * b:(g + 1) * b]
                    part["rows"] += len(group)
                    for m in modes:
                        x = got[m]
                        part["decode_s"][m].append(round(x.seconds - x.phase_s.get("prefill", 0.0), 6))
                        part["tokens"][m].append(x.new_tokens)
                        part["latency_s"][m].extend(round(s.stats.ttft_s + s.stats.decode_s, 6)
                                                    for s in x.generations)
                        drafted = sum(sum(s.stats.drafted) for s in x.generations)
                        if drafted:
                            part["acceptance"][m].append(sum(sum(s.stats.accepted) for s in x.generations) / drafted)
                        part["rows_equal"][m] += sum(s.tokens == t for s, t in zip(x.generations, ref))
                    bar.update()
        part["machine"] = machine.record
        part["costs_ms"] = step_costs(pair.state, {d: s for d, s in pair.drafts.items()
                                                   if any(m.startswith(d) for m in modes)}, groups[0], pair.k)
        out[str(b)] = part
    return {"batch_sizes": list(batch_sizes), "modes": list(modes), "k": pair.k, "max_new_tokens": max_new_tokens,
            "prompts": len(prompts), "reps": reps, "by_batch": out}


class _BatchProbe:
    """A batch as :func:`~thesis_lib.decoding.costs.forward_curves` times a model state: ``greedy`` prefills every
    prompt (room for ``most`` more tokens), ``timed_forward`` feeds every row the last n tokens of its own prompt
    (n: as many as it is given), times the batched greedy forward (tokens read back) and crops them again."""

    def __init__(self, state, prompts: Sequence[Sequence[int]], most: int):
        self.state, self.prompts, self.most = state, prompts, most

    def reset(self) -> None:
        self.batch = None

    def greedy(self, ids, last_only: bool = True) -> None:
        from thesis_studies.serving.loops import BatchState

        self.batch = BatchState(self.state)
        self.batch.prefill(self.prompts, max(map(len, self.prompts)) + self.most)

    def timed_forward(self, ids: Sequence[int], head: bool = True) -> float:
        n = len(ids)
        feed = [list(p[-n:]) + [p[-1]] * (n - len(p[-n:])) for p in self.prompts]
        t0 = time.perf_counter()
        self.batch.greedy(feed)
        dt = time.perf_counter() - t0
        self.batch.cache.crop([n] * len(self.prompts))
        return dt


@torch.inference_mode()
def step_costs(target, drafts: dict, prompts: Sequence[Sequence[int]], k: int, reps: int = 5) -> dict:
    """Median milliseconds of one batched forward (the greedy tokens read back) after ``prompts``' caches, every row
    feeding the same number of tokens: the target over 1, ``k`` and ``k + 1`` tokens (a step, the ordinary and the
    deferred verify), each draft over 1 (a draft step), by the one forward-cost timer after a warm-up forward. The
    inputs of the round's cost model at this batch; ``times_ms`` keeps every timing."""
    from thesis_lib.decoding.costs import forward_curves

    curves = forward_curves({"target": _BatchProbe(target, prompts, k + 1)}, prompts[0], sorted({1, k, k + 1}),
                            reps=reps, warmup=1, raw=True)
    curves.update(forward_curves({name: _BatchProbe(state, prompts, 1) for name, state in drafts.items()}, prompts[0],
                                 [1], reps=reps, warmup=1, raw=True))
    times = {f"{name}_{n}": ts for name, by_size in curves.items() for n, ts in by_size.items()}
    out: dict = {key: round(1e3 * statistics.median(ts), 3) for key, ts in times.items()}
    out["times_ms"] = {key: [round(1e3 * t, 4) for t in ts] for key, ts in times.items()}
    return out


def random_heads_by_batch(device: str, *, quick: bool = False, progress: bool = True, n_probes: int = 593) -> dict:
    """:func:`heads_by_batch` at the thesis' draft-head shape (Qwen3-0.6B: 151,936 x 1,024, C = 9,496 clusters of
    16) with RANDOM weights, a random equal-size partition and random states (``gpu-check``'s batch part): latency
    only. Random states share few probed clusters, so the union is near its largest (B times one row's): the
    heads' costs where rows do not help each other. Where FlashHead runs its Triton kernels, the heads captured in
    CUDA graphs too (``captured``: :func:`captured_heads_by_batch`). ``quick``: a small vocabulary and few states,
    for a CPU."""
    from thesis_lib.heads.dense import DenseGreedyHead
    from thesis_lib.heads.flashhead import FlashHead
    from thesis_lib.models.specs import QWEN3_CONFIGS
    from thesis_lib.heads.clustering import random_clustering

    shape = QWEN3_CONFIGS["Qwen3-0.6B"]
    vocab, hidden = (4096, 256) if quick else (shape["vocab_size"], shape["hidden_size"])
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    states = torch.randn(64, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
    clustering = random_clustering(vocab, hidden, vocab // 16)
    heads = {"dense": DenseGreedyHead(weight),
             "flashhead": FlashHead(weight, clustering, n_probes=min(n_probes, clustering.n_clusters))}
    sizes = (1, 4, 32) if quick else BATCH_SIZES
    doc = heads_by_batch(heads, states, batch_sizes=sizes, reps=2 if quick else 10, warmup=2 if quick else 5,
                         progress=progress, order_seed=None)
    doc["note"] = "random weights and states: latency only; random rows share few clusters"
    doc["flashhead_path"] = heads["flashhead"].active_path
    if heads["flashhead"].active_path == "triton":
        doc["captured"] = captured_heads_by_batch(heads, states, sizes, reps=2 if quick else 10, device=device)
    return doc


def captured_heads_by_batch(heads: dict, states: torch.Tensor, batch_sizes: Sequence[int], *, reps: int,
                            device: str) -> dict:
    """Each head at batch B captured in a CUDA graph over a static ``[B, D]`` input and timed on the device alone
    (:func:`~thesis_studies.gpucheck.graphs.queued_times`), as at B = 1: the dense head, FlashHead's Triton kernels on
    the B rows in one call (``batched``) and one row at a time (``per_row``: B calls in the graph). The two
    FlashHead calls' tokens are compared on every group."""
    from thesis_studies.gpucheck.graphs import capture_head, queued_times

    flash = heads["flashhead"]
    out = {"how": "each head captured in a CUDA graph, each replay's device time alone (queued)", "by_batch": {}}
    for b in batch_sizes:
        n = states.shape[0] // b
        calls = {"dense": heads["dense"], "batched": flash,
                 "per_row": lambda x: torch.cat([flash(x[r:r + 1]) for r in range(x.shape[0])])}
        graphs = {name: capture_head(fn, states, rows=b) for name, fn in calls.items()}
        same = sum(int(torch.equal(graphs["batched"](i), graphs["per_row"](i))) for i in range(n))
        times = queued_times(graphs, n, reps=reps, device=device)
        ms = {name: stats_ms(ts)["p50_ms"] for name, ts in times.items()}
        out["by_batch"][str(b)] = {"groups": n, "ms": ms, "speedup_batched": ms["dense"] / ms["batched"],
                                   "speedup_per_row": ms["dense"] / ms["per_row"], "same_tokens_groups": same}
    return out


def model_bench_part(flash_head, states: torch.Tensor, *, dense, weight=None, reps: int = 3,
                     progress: bool = True) -> dict:
    """``model-bench``'s ``batch`` part: the dense head, FlashHead and FlashHead's shared-cluster form timed at each
    batch size of :data:`BATCH_SIZES` that leaves two groups of states (:func:`heads_by_batch`)."""
    from thesis_lib.bench.modelbench import say_if_disturbed

    heads = {"dense": dense, "flashhead": flash_head, "flashhead_shared": flash_head.greedy_shared}
    sizes = [b for b in BATCH_SIZES if 2 * b <= states.shape[0]]  # two groups of states at least
    doc = heads_by_batch(heads, states, batch_sizes=sizes, reps=reps, progress=progress)
    doc["flashhead_path"] = flash_head.active_path
    for b, part in doc["by_batch"].items():
        say_if_disturbed(part, f"the heads at batch {b}")
    return doc
