"""Which token tree to grow: shapes chosen from measured rank probabilities and measured costs (beyond the thesis).

- :func:`rank_table`: from the rank of each target token among the draft's candidates (on the target's own
  greedy text, so the context is what an accepted path holds), the probability ``p(d, r)`` that the target's token
  at depth d of a round is the draft's rank-r candidate, given that the depths before were covered by the
  candidates kept (every start position of a round counted).
- :func:`round_seconds`: a round of a shape: the draft's forwards (the root's, then one per depth over the nodes
  that have children, each from the draft's measured forward-cost curve by width) plus the target's verify forward
  over the root and every node (its measured curve).
- :func:`search`: per size n, the *grown* tree (:meth:`~thesis_studies.trees.loop.TreeShape.grown`: the n nodes of
  largest path probability, the best tree of that size under the table's model), chains of every K and beams of
  every K and width, each with its expected tokens per round and per second under the model; the best of each
  kind. Greedy growth, not Sequoia's dynamic programme: both optimise the same sum of path probabilities, and at a
  given size the greedy choice is exact (a child is never more probable than its parent); the size is then chosen
  by the cost curve.
- :func:`gate_study`: a shape chosen per round, replayed on the calibration text: the chain where the draft's
  confidence in its first token is high, a cheaper or wider shape where it is low (what a tree chosen per round from
  the draft's own probabilities can gain over the fixed chain, before anyone builds one).
- :func:`independent_nodes`: the closed form of the background texts, where every node of a k-ary tree is accepted
  independently with probability alpha, for comparison: it ignores that siblings hold different tokens (at most one
  can be the target's), and overshoots, past the tree's depth itself.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from thesis_lib.errors import ConfigError
from .loop import TreeShape

#: A rank past the kept candidates (the target's token was not among the draft's ``ranks`` best).
MISS = -1


def rank_table(ranks: Sequence[Sequence[int]], depth: int, kept: int) -> tuple[list[list[float]], list[int]]:
    """``p[d - 1][r]`` for depths 1..``depth`` and ranks below ``kept``, and the number of start positions behind
    each depth. ``ranks``: per generation, the rank of each target token among the draft's candidates (:data:`MISS`
    or a rank >= ``kept``: not covered)."""
    if depth < 1 or kept < 1:
        raise ConfigError(f"need depth >= 1 and kept >= 1, got {depth}, {kept}.")
    hits = [[0] * kept for _ in range(depth)]
    trials = [0] * depth
    for seq in ranks:
        covered = [0 <= r < kept for r in seq]
        for s in range(len(seq)):
            for d in range(depth):
                if s + d >= len(seq):
                    break
                trials[d] += 1
                if covered[s + d]:
                    hits[d][seq[s + d]] += 1
                else:
                    break  # deeper depths of this start are conditioned on this one being covered
    table = [[h / t if t else 0.0 for h in row] for row, t in zip(hits, trials)]
    return table, trials


def round_seconds(shape: TreeShape, draft_s: Callable[[int], float], verify_s: Callable[[int], float]) -> float:
    """Seconds of one round of ``shape`` (module docstring); ``draft_s(e)``: the draft's forward over e tokens,
    ``verify_s(n)``: the target's over n."""
    expanded = [sum(1 for i, p in enumerate(shape.paths) if len(p) == d and shape.children[i])
                for d in range(1, shape.depth)]
    return draft_s(1) + sum(draft_s(e) for e in expanded) + verify_s(1 + shape.size)


def _curve(costs: Mapping[int, float]) -> Callable[[int], float]:
    table = {int(n): float(s) for n, s in costs.items()}

    def cost(n: int) -> float:
        if n not in table:
            raise ConfigError(f"no cost measured for {n} tokens (measured: {sorted(table)[0]}..{max(table)}).")
        return table[n]
    return cost


def evaluate(shape: TreeShape, table, draft_s: Mapping[int, float], verify_s: Mapping[int, float],
             step_s: float) -> dict:
    """A shape under the model: expected accepted and emitted tokens per round, seconds per round, tokens per second,
    and the speedup over target-only decoding (``step_s``: one target step)."""
    e = shape.expected_accepted(table)
    sec = round_seconds(shape, _curve(draft_s), _curve(verify_s))
    return {"shape": str(shape), "label": shape.label, "nodes": shape.size, "depth": shape.depth,
            "widths": list(shape.widths), "expected_accepted": e, "expected_emitted": 1 + e, "round_s": sec,
            "tokens_per_s": (1 + e) / sec, "speedup": (1 + e) / sec * step_s}


def search(table, draft_s: Mapping[int, float], verify_s: Mapping[int, float], step_s: float, *,
           max_nodes: int, max_depth: int = 12, widths: Sequence[int] = (2, 3, 4)) -> dict:
    """Grown trees of 1..``max_nodes`` nodes, chains of K = 1..``max_depth`` and beams (K, width) within the node
    budget, each :func:`evaluate`\\ d; ``best``: the fastest of each kind under the model."""
    kept = len(table[0])
    grown = [evaluate(TreeShape.grown(n, table, max_depth=max_depth, max_rank=kept), table, draft_s, verify_s, step_s)
             for n in range(1, max_nodes + 1)]
    chains = [evaluate(TreeShape.chain(k), table, draft_s, verify_s, step_s)
              for k in range(1, min(max_depth, max_nodes) + 1)]
    beams = [evaluate(TreeShape.beam(k, w, table), table, draft_s, verify_s, step_s)
             for w in widths for k in range(1, max_depth + 1) if k * w <= max_nodes]
    best = {kind: max(rows, key=lambda r: r["tokens_per_s"]) for kind, rows in
            (("grown", grown), ("chain", chains), ("beam", beams)) if rows}
    return {"grown": grown, "chains": chains, "beams": beams, "best": best}


def accepted(shape: TreeShape, ranks: Sequence[int]) -> int:
    """Tokens a round of ``shape`` accepts where the target's next tokens are the draft's ``ranks[0]``-th,
    ``ranks[1]``-th ... candidates along the target's own path (:data:`MISS`: none of the kept ones)."""
    nodes, a = set(shape.paths), 0
    while a < min(len(ranks), shape.depth) and tuple(ranks[:a + 1]) in nodes:
        a += 1
    return a


def gated(ranks: Sequence[Sequence[int]], confidence: Sequence[Sequence[float]], chain: TreeShape, other: TreeShape,
          threshold: float, draft_s: Mapping[int, float], verify_s: Mapping[int, float], step_s: float) -> dict:
    """Rounds replayed on the target's own text as decoding would run them (each starts after the last one's
    accepted tokens and the target's own): ``chain`` where the draft's confidence in the round's first token is at
    least ``threshold``, else ``other``. Tokens per round (one target forward each) and the modelled speedup over
    target-only decoding."""
    d, v = _curve(draft_s), _curve(verify_s)
    cost = {s: round_seconds(s, d, v) for s in (chain, other)}
    tokens = rounds = 0
    seconds = 0.0
    for seq, conf in zip(ranks, confidence):
        i = 0
        while i < len(seq):
            shape = chain if conf[i] >= threshold else other
            a = accepted(shape, seq[i:i + shape.depth])
            emitted = min(a + 1, len(seq) - i)  # the text's last round emits no token past its end
            tokens, rounds, seconds, i = tokens + emitted, rounds + 1, seconds + cost[shape], i + a + 1
    nan = float("nan")
    return {"threshold": threshold, "shape": str(other), "tokens_per_forward": tokens / rounds if rounds else nan,
            "speedup": tokens / seconds * step_s if rounds else nan}


def gate_study(ranks, confidence, k: int, draft_s: Mapping[int, float], verify_s: Mapping[int, float], step_s: float,
               thresholds: Sequence[float] = tuple(t / 20 for t in range(21))) -> dict:
    """The chain of ``k`` in every round, and the best :func:`gated` switch at each threshold (picked on the
    text it is scored on, so optimistic for the rule) to ``stop``: one token (a stop after the first token, cruder
    than chapter 6's confidence stop, which may end a block at any token), or to ``fan``:
    ``k`` candidates for the first token (a tree that spends the chain's verify on the uncertain position)."""
    chain = TreeShape.chain(k)
    out = {"k": k, "chain": gated(ranks, confidence, chain, chain, 0.0, draft_s, verify_s, step_s)}
    for name, other in (("stop", TreeShape.chain(1)), ("fan", TreeShape.beam(1, k))):
        out[name] = max((gated(ranks, confidence, chain, other, t, draft_s, verify_s, step_s) for t in thresholds),
                        key=lambda r: r["speedup"])
    return out


def independent_nodes(alpha: float, width: int, depth: int) -> float:
    """The background texts' expected accepted tokens of a full ``width``-ary tree ``depth`` deep when every node is
    accepted on its own with probability ``alpha``: ``alpha * sum((alpha * width)^i, i < depth)``."""
    return alpha * sum((alpha * width) ** i for i in range(depth))
