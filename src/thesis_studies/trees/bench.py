"""``tree-bench``: token trees measured on a pair (beyond the thesis; :mod:`.loop`).

1. **Calibration** (held-out prompts): the target's greedy continuations; the rank of each of its tokens among each
   draft head's candidates on that text, and the head's confidence there (:func:`ranks`); the rank table; the
   cost curves of this machine (the target's forward over 1..N tokens, each draft's over 1..W); the model's best
   grown tree, chain and beam per draft (:func:`thesis_studies.trees.shapes.search`).
2. **Shapes** (the measured prompts, untimed): tokens per target forward of a set of shapes, beside the model's.
3. **Timed** (the measured prompts, interleaved as the benchmark protocol runs modes): target-only decoding, the best
   chains, trees at the chain's depth with twice its nodes (and the model's best tree where it branches), and
   transformers' assisted generation at the chain's K and at its own defaults.

Everything lands in one JSON document; the book and ``thesis-lib studies tree-bench`` read it through
:mod:`thesis_studies.trees.tables`.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from thesis_lib.decoding.costs import forward_curves
from thesis_lib.decoding.greedy import greedy_generate
from thesis_lib.decoding.state import ModelState
from thesis_studies.trees.shapes import MISS, independent_nodes, rank_table, search
from .loop import TreeShape, tree_generate
from thesis_lib.bench.execute import execute

#: Ranks kept per node, depths of the table, the largest tree searched (draft and target timed up to its size).
KEPT, DEPTH, MAX_NODES = 8, 12, 32


@torch.inference_mode()
def ranks(state: ModelState, prompt: Sequence[int], output: Sequence[int], kept: int = KEPT
          ) -> tuple[list[int], list[float]]:
    """The rank of each output token after the first among the draft head's ``kept`` best candidates after the prompt
    and the output before it (:data:`MISS` past them), and the head's probability of its best candidate there (its
    confidence); one prefill, then the head one row at a time (the shape a decoding step gives it)."""
    state.reset()
    h = state.hidden(list(prompt) + list(output[:-1]))[len(prompt):]
    out, confidence = [], []
    for row, token in zip(h, output[1:]):
        ids, logp = state.head.top(row[None], kept)
        ids = ids[0].tolist()
        out.append(ids.index(token) if token in ids else MISS)
        confidence.append(round(float(logp[0, 0].exp()), 4))
    state.reset()
    return out, confidence


def calibrate(runner, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, reps: int = 3,
              max_nodes: int = MAX_NODES, progress: bool = True) -> dict:
    """Step 1 of the module docstring, for the dense and (where the runner has one) FlashHead drafts."""
    from thesis_lib.progress import tqdm

    drafts = {name: d.state for name, d in runner.loop_drafters["tree"].items()}
    outputs = []
    rank_lists: dict[str, list[list[int]]] = {name: [] for name in drafts}
    confidence: dict[str, list[list[float]]] = {name: [] for name in drafts}
    for ids in tqdm(prompts, desc="tree calibration", unit="prompt", disable=not progress):
        out = greedy_generate(runner.t_state, ids, max_new_tokens=max_new_tokens, eos_ids=runner.eos).tokens
        outputs.append(len(out))
        for name, state in drafts.items():
            r, c = ranks(state, ids, out)
            rank_lists[name].append(r)
            confidence[name].append(c)
    context = list(prompts[0])
    verify = forward_curves({"target": runner.t_state}, context, range(1, max_nodes + 2), reps=reps)["target"]
    draft_s = forward_curves(drafts, context, range(1, max_nodes + 1), reps=reps)  # a level may expand every node
    doc = {"prompts": len(prompts), "tokens": outputs, "kept": KEPT, "verify_s": verify, "drafts": {}}
    for name, state in drafts.items():
        table, trials = rank_table(rank_lists[name], DEPTH, KEPT)
        curve = draft_s[name]
        shapes = search(table, curve, verify, verify[1], max_nodes=max_nodes, max_depth=DEPTH)
        alpha = table[0][0]  # the chain's first-position acceptance, for the closed form
        doc["drafts"][name] = {
            "ranks": rank_lists[name], "confidence": confidence[name], "table": table, "trials": trials,
            "draft_s": curve, "search": shapes,
            "independent_nodes": {f"w{w}d{d}": independent_nodes(alpha, w, d) for w in (2, 3) for d in (2, 3, 4)}}
    return doc


def at_depth(table, k: int, nodes: int) -> TreeShape:
    """The best tree of ``nodes`` nodes at most ``k`` deep (a chain's depth, with branches where they are worth
    most): how much branching adds at a fixed number of draft forwards."""
    return TreeShape.grown(nodes, table, max_depth=k, max_rank=len(table[0]))


def shape_modes(doc: dict) -> dict[str, list[TreeShape]]:
    """The shapes step 2 runs per draft: each draft's best chain and its best trees of 2K and 3K nodes at the chain's
    depth K; for FlashHead also the model's best grown tree, grown trees of 8, 16 and 24 nodes (deeper) and beams of
    width 2 and 3 at depth K."""
    out = {}
    for name, d in doc["drafts"].items():
        best = d["search"]["best"]
        k = best["chain"]["depth"]
        shapes = [TreeShape.chain(k)] + [at_depth(d["table"], k, m * k) for m in (2, 3)]
        if name == "flash":
            sizes = {best["grown"]["nodes"], 8, 16, 24}
            shapes += [TreeShape.parse(r["shape"]) for r in d["search"]["grown"] if r["nodes"] in sizes]
            shapes += [TreeShape.beam(k, w, d["table"]) for w in (2, 3)]
        out[name] = list(dict.fromkeys(shapes))
    return out


@torch.inference_mode()
def shape_runs(runner, doc: dict, prompts: Sequence[Sequence[int]], progress: bool = True) -> list[dict]:
    """Step 2: per draft and shape, rounds and tokens emitted per round on each measured prompt (greedy output
    checked against target-only output)."""
    from thesis_lib.progress import tqdm

    refs = [greedy_generate(runner.t_state, ids, max_new_tokens=runner.max_new_tokens, eos_ids=runner.eos).tokens
            for ids in prompts]
    plan = [(name, s) for name, shapes in shape_modes(doc).items() for s in shapes]
    rows = []
    for name, shape in tqdm(plan, desc="tree shapes", unit="shape", disable=not progress):
        rounds = emitted = equal = 0
        for ids, ref in zip(prompts, refs):
            g = tree_generate(runner.t_state, runner.loop_drafters["tree"][name], ids, shape=shape,
                              max_new_tokens=runner.max_new_tokens, eos_ids=runner.eos)
            rounds += g.stats.rounds
            emitted += sum(g.stats.emitted)
            equal += g.tokens == ref
        rows.append({"draft": name, "shape": str(shape), "label": shape.label, "nodes": shape.size,
                     "depth": shape.depth, "rounds": rounds, "emitted_per_round": emitted / rounds if rounds else None,
                     "model_emitted": 1 + shape.expected_accepted(doc["drafts"][name]["table"]),
                     "equal": equal, "prompts": len(prompts)})
    return rows


def timed_modes(doc: dict) -> tuple[list[str], dict[str, int]]:
    """Step 3's modes and the chain K the peers use: target-only; each draft's best chain K (FlashHead's also K - 1
    and K + 1), its best tree of 2K nodes at depth K (branching where the rank table says it is worth most), and the
    model's best grown tree where that one branches; assisted generation at the dense chain's K and at its defaults."""
    best = {name: d["search"]["best"] for name, d in doc["drafts"].items()}
    modes = ["baseline"]
    for name, b in best.items():
        k = b["chain"]["depth"]
        ks = [k - 1, k, k + 1] if name == "flash" else [k]
        modes += [f"{name}_deferred@k{x}" for x in ks if x >= 1]
        modes.append(f"{name}_tree@k{k}n{2 * k}")
        if max(b["grown"]["widths"]) > 1:
            modes.append(f"{name}_tree@n{b['grown']['nodes']}")
    modes += ["hf_assisted", "hf_assisted_defaults"]
    return modes, {"k": best["dense"]["chain"]["depth"]}


def measure(runner, calibration: Sequence[Sequence[int]], prompts, *, calibration_tokens: int = 64,
            iterations: int = 2, warmup_tokens: int = 12, thinking: bool | None = None, progress: bool = True) -> dict:
    """Steps 1-3 (module docstring) on ``runner``'s pair: ``calibration`` token ids, ``prompts`` the measured
    :class:`~thesis_lib.bench.prompts.Prompt` s (chat-formatted as the benchmark sends them)."""
    from thesis_lib.bench.prompts import encode, prompt_text

    t0 = time.perf_counter()
    doc = {"calibration": calibrate(runner, calibration, max_new_tokens=calibration_tokens, progress=progress)}
    runner.tree_tables = {name: d["table"] for name, d in doc["calibration"]["drafts"].items()}
    ids = [encode(runner.target.tokenizer, prompt_text(p, "first"), chat=True, thinking=thinking) for p in prompts]
    doc["shapes"] = shape_runs(runner, doc["calibration"], ids, progress=progress)
    modes, peer = timed_modes(doc["calibration"])
    k0 = runner.k
    runner.k = peer["k"]
    try:
        doc["records"] = execute(runner, prompts, modes, iterations=iterations, warmup_tokens=warmup_tokens,
                                 costs=False, thinking=thinking, desc="tree bench", progress=progress)
    finally:
        runner.k = k0
    doc.update(modes=modes, peer_k=peer["k"], max_new_tokens=runner.max_new_tokens, iterations=iterations,
               seconds=time.perf_counter() - t0)
    return doc
