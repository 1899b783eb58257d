"""Token trees' loop: a draft proposes several candidates per position, and the target verifies the whole tree in one
forward (beyond the thesis; SpecInfer's token-tree verification, Medusa's and EAGLE's candidate trees).

**Shape.** A :class:`TreeShape` is a fixed set of *rank paths*: the node ``(0, 2)`` is the draft's third-best
candidate after its best one at depth 1. Nodes are kept breadth first, a parent before its children; a chain of K
is the shape ``(0,), (0, 0), ...``. Which nodes to keep comes from a table of the probability that the target's
token is the draft's rank-r candidate at depth d (:mod:`thesis_studies.trees.shapes` measures it and grows
shapes from it).

**Drafting** (:class:`TreeDrafter`). The draft's cache holds the tree as it grows: the tokens it has not seen (the
target's last token, the root) are fed first; then, depth by depth, one forward over the nodes that have children,
each attending to the committed context and its own ancestors' cache entries (a tree mask). Every node is
computed once, so shared prefixes are never re-run; one forward per depth, as a chain of the same depth drafts.
A node's children are its head's ``top(h, r)`` candidates: the greedy token first, then the next best, which a
FlashHead head has already scored (its probed clusters' tokens). After verification the draft keeps the cache
entries of the accepted path only (moved to follow the context), as a chain keeps its accepted prefix.

**Verification** (:func:`tree_generate`, the deferred schedule: the carried final token is the root). One target
forward over ``[root, nodes...]``, node i at position ``length + depth(i)``, attending to the cached prefix, the
root, its ancestors and itself. Walking from the root, the child whose token equals the target's argmax after
its parent is accepted, until none does; the target's argmax after the last accepted node is emitted after the
path. The target's cache then keeps the root and the path's entries, nothing else. With the row-exact attention
(:func:`thesis_lib.models.attention.exact_attention` gathers each node's keys: the prefix and its ancestors, in
order) and row-exact linear layers, each node computes bit for bit what a one-token step over its path computes,
so the output is target-only greedy output, token for token.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import torch

from thesis_lib import extensions
from thesis_lib.bench.modes import Mode
from thesis_lib.decoding.clocks import PhaseClock
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.state import ModelState
from thesis_lib.decoding.rounds import check_request, emit_round, finish, prefill
from thesis_lib.decoding.stats import FINALIZE, PROPOSE, VERIFY, DecodeStats, Generation
from thesis_lib.errors import ConfigError

#: Rank probabilities assumed where no table was measured (the r-th best candidate a quarter as likely as the
#: one before it): only their order matters to which nodes a shape keeps, and that is rank-sum order.
PRIOR = (0.75, 0.1875, 0.046875, 0.01171875, 0.0029296875, 0.000732421875, 0.00018310546875, 4.57763671875e-05)


def rank_p(table: Sequence[Sequence[float]] | None, depth: int, rank: int) -> float:
    """The table's probability for the rank-``rank`` candidate at ``depth`` (1-based); deeper than the table: its
    last row; ranks past a row: 0."""
    rows = table or (PRIOR,)
    row = rows[min(depth, len(rows)) - 1]
    return float(row[rank]) if rank < len(row) else 0.0


@dataclass(frozen=True)
class TreeShape:
    """A token tree's shape: its nodes' rank paths, breadth first (module docstring)."""

    paths: tuple[tuple[int, ...], ...]
    label: str = field(default="", compare=False)

    def __post_init__(self):
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        object.__setattr__(self, "paths", paths)
        if not paths:
            raise ConfigError("A token tree needs at least one node.")
        seen = set()
        for p in paths:
            if not p or min(p) < 0:
                raise ConfigError(f"tree node {p}: a rank path is a non-empty tuple of ranks >= 0.")
            if p in seen:
                raise ConfigError(f"tree node {p} is listed twice.")
            if len(p) > 1 and p[:-1] not in seen:
                raise ConfigError(f"tree node {p} comes before (or without) its parent {p[:-1]}.")
            seen.add(p)
        if [len(p) for p in paths] != sorted(len(p) for p in paths):
            raise ConfigError("a tree's nodes are listed breadth first (every depth before the next).")

    def __str__(self) -> str:
        """The nodes' rank paths, ranks joined by dots: ``"0 1 0.0 0.1"`` (what :meth:`parse` reads)."""
        return " ".join(".".join(map(str, p)) for p in self.paths)

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        """A shape from its :meth:`str` form (nodes in any order; a node needs its parent)."""
        try:
            paths = [tuple(int(r) for r in node.split(".")) for node in str(text).split()]
        except ValueError:
            raise ConfigError(f"A tree shape is rank paths like '0 1 0.0 0.1' (got {text!r}).") from None
        return cls(tuple(sorted(paths, key=lambda p: (len(p), p))), f"n{len(paths)}")

    # ---------------------------------------------------------------- structure
    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per depth, from depth 1."""
        return tuple(sum(len(p) == d for p in self.paths) for d in range(1, self.depth + 1))

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """Each node's parent's index (-1: the root)."""
        at = {p: i for i, p in enumerate(self.paths)}
        return tuple(at[p[:-1]] if len(p) > 1 else -1 for p in self.paths)

    @cached_property
    def children(self) -> dict[int, list[int]]:
        """Each node's (and the root's, -1) children, by rank."""
        out: dict[int, list[int]] = {-1: []}
        for i in range(self.size):
            out[i] = []
        for i, par in enumerate(self.parents):
            out[par].append(i)
        for v in out.values():
            v.sort(key=lambda i: self.paths[i][-1])
        return out

    @cached_property
    def ancestry(self) -> torch.Tensor:
        """``[n, n]`` booleans: node i's path holds node j (itself included)."""
        a = torch.eye(self.size, dtype=torch.bool)
        for i, par in enumerate(self.parents):
            if par >= 0:
                a[i] |= a[par]
        return a

    def upto(self, depth: int) -> "TreeShape":
        """The nodes at most ``depth`` deep (a round near the token budget)."""
        if depth >= self.depth:
            return self
        return TreeShape(tuple(p for p in self.paths if len(p) <= depth), f"{self.label}|{depth}")

    def verify_mask(self, length: int) -> torch.Tensor:
        """What ``[root, nodes...]`` fed after ``length`` cached positions attend to: ``[1 + n, length + 1 + n]``."""
        n = self.size
        m = torch.zeros(1 + n, length + 1 + n, dtype=torch.bool)
        m[:, :length + 1] = True
        m[1:, length + 1:] = self.ancestry
        return m

    def accept(self, tokens: Sequence[int], target: Sequence[int]) -> list[int]:
        """The longest accepted path (node indices from depth 1): ``tokens`` the nodes' tokens, ``target[0]`` the
        target's argmax after the root and ``target[1 + i]`` after node i."""
        path, at, want = [], -1, target[0]
        while True:
            nxt = next((c for c in self.children[at] if tokens[c] == want), None)
            if nxt is None:
                return path
            path.append(nxt)
            at, want = nxt, target[1 + nxt]

    def expected_accepted(self, table: Sequence[Sequence[float]] | None) -> float:
        """Accepted tokens per round if the target's token is the rank-r candidate at depth d with the table's
        probability, independently of the depths before: the sum over nodes of their paths' products."""
        total = 0.0
        for p in self.paths:
            v = 1.0
            for d, r in enumerate(p, 1):
                v *= rank_p(table, d, r)
            total += v
        return total

    # ---------------------------------------------------------------- constructors
    @classmethod
    def chain(cls, k: int) -> "TreeShape":
        """The chain of ``k`` greedy proposals."""
        if k < 1:
            raise ConfigError(f"a chain needs K >= 1, got {k}.")
        return cls(tuple((0,) * d for d in range(1, k + 1)), f"k{k}")

    @classmethod
    def beam(cls, depth: int, width: int, table: Sequence[Sequence[float]] | None = None) -> "TreeShape":
        """At most ``width`` nodes per depth, ``depth`` deep: depth 1 the ``width`` best candidates, each later depth
        the ``width`` most probable children (by the table, else :data:`PRIOR`) of the depth before. Width 1 is
        the chain."""
        if depth < 1 or width < 1:
            raise ConfigError(f"a tree needs depth >= 1 and width >= 1, got {depth}, {width}.")
        level: list[tuple[float, tuple[int, ...]]] = [(1.0, ())]
        paths: list[tuple[int, ...]] = []
        for d in range(1, depth + 1):
            kids = [(v * rank_p(table, d, r), p + (r,)) for v, p in level for r in range(width)]
            kids = sorted(kids, key=lambda k: (-k[0], k[1]))[:width]
            level = sorted(kids, key=lambda k: k[1])
            paths += [p for _, p in level]
        return cls(tuple(paths), f"k{depth}w{width}")

    @classmethod
    def grown(cls, nodes: int, table: Sequence[Sequence[float]], max_depth: int = 12,
              max_rank: int = 8) -> "TreeShape":
        """The ``nodes`` nodes of largest path probability (the tree that maximises :meth:`expected_accepted` at
        that size: a child is never more probable than its parent, so taking the most probable available node,
        one at a time, is optimal), at most ``max_depth`` deep and ``max_rank`` children per node."""
        if nodes < 1:
            raise ConfigError(f"a tree needs at least one node, got {nodes}.")
        heap = [(-rank_p(table, 1, r), (r,)) for r in range(max_rank)]
        heapq.heapify(heap)
        chosen: list[tuple[int, ...]] = []
        while heap and len(chosen) < nodes:  # nodes of probability 0 come last, in rank order
            v, p = heapq.heappop(heap)
            chosen.append(p)
            if len(p) < max_depth:
                for r in range(max_rank):
                    heapq.heappush(heap, (v * rank_p(table, len(p) + 1, r), p + (r,)))
        chosen.sort(key=lambda p: (len(p), p))
        return cls(tuple(chosen), f"n{len(chosen)}")


class TreeDrafter(ModelDrafter):
    """A draft model growing token trees with its body, KV cache and a head with ``top`` (dense or FlashHead): the
    chain's :class:`~thesis_lib.decoding.drafters.ModelDrafter` (its cache, ``begin``, ``prefill`` and pending tokens),
    asked for a tree's nodes instead of a block (``propose(shape)``) and told the accepted path (``observe(path,
    final_token)``)."""

    def __init__(self, model, head: torch.nn.Module | None = None, vocab_limit: int | None = None,
                 name: str = "dense"):
        super().__init__(model, head=head, vocab_limit=vocab_limit, name=name)
        if not hasattr(self.state.head, "top"):
            raise ConfigError(f"the {name} draft's head ({type(self.state.head).__name__}) ranks no candidates, "
                              "so it cannot grow a token tree.")
        self._base = 0
        self._slots: dict[int, int] = {}
        self._tokens: list[int] = []

    def propose(self, shape: TreeShape) -> list[int]:
        """The tree's tokens, one per node (breadth first)."""
        with torch.inference_mode():
            state, head = self.state, self.state.head
            h = self._hidden(self.pending)
            self.pending = []
            base = self._base = state.length  # the root (the last fed token) sits at base - 1
            tokens: list[int | None] = [None] * shape.size
            slots: dict[int, int] = {}
            fed = [-1]
            r = max(p[-1] for p in shape.paths) + 1  # one count for every depth: fewer shapes for a compiled head
            for d in range(1, shape.depth + 1):
                kids = [shape.children[i] for i in fed]
                ids = head.top(h, r)[0].tolist()
                for row, ks in zip(ids, kids):
                    for c in ks:
                        tokens[c] = row[shape.paths[c][-1]]
                fed = [i for ks in kids for i in ks if shape.children[i]]
                if not fed or d == shape.depth:
                    break
                at = state.length
                visible = torch.zeros(len(fed), at + len(fed), dtype=torch.bool)
                visible[:, :base] = True
                for j, i in enumerate(fed):
                    a = i
                    while a >= 0:
                        if a in slots:
                            visible[j, slots[a]] = True
                        a = shape.parents[a]
                    visible[j, at + j] = True
                h = state.hidden_masked([tokens[i] for i in fed], [base - 1 + d] * len(fed), visible)
                slots.update({i: at + j for j, i in enumerate(fed)})
            self._slots, self._tokens = slots, tokens
            return tokens

    def observe(self, path: Sequence[int], final_token: int) -> None:
        """The target accepted the nodes of ``path`` and emitted ``final_token`` after them."""
        kept = [self._slots[i] - self._base for i in path if i in self._slots]
        self.state.keep(self._base, kept)
        if path and path[-1] not in self._slots:  # accepted but never fed
            self.pending.append(self._tokens[path[-1]])
        self.pending.append(int(final_token))


def tree_generate(target: ModelState, drafter: TreeDrafter, prompt_ids: Sequence[int], *, shape: TreeShape,
                  max_new_tokens: int, eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> Generation:
    """Greedy speculative decoding with token trees, deferred schedule (module docstring). Each round's
    ``drafted`` is its tree's depth (the most it can accept), ``extra["tree_nodes"]`` the nodes verified."""
    with torch.inference_mode():
        check_request(max_new_tokens, prompt_ids, shape.depth)
        clock = clock or PhaseClock([target.device, drafter.state.device])
        eos = frozenset(eos_ids)
        stats = DecodeStats(mode=f"{drafter.name}_tree", k=shape.depth)
        nodes = 0
        t0, t1, out, done = prefill(target, drafter, prompt_ids, clock, eos, max_new_tokens,
                                    lambda ids: int(target.greedy(ids, last_only=True)))
        final = out[0]
        while not done:
            kk = min(shape.depth, max_new_tokens - len(out) - 1)
            if kk == 0:  # one token left: the target's token after the carried final one
                with clock.phase(FINALIZE):
                    out.append(int(target.greedy([final], last_only=True)))
                stats.append_calls += 1
                stats.tail_tokens += 1
                break
            tree = shape.upto(kk)
            with clock.phase(PROPOSE, drafter.state.device):
                tokens = drafter.propose(tree)
            with clock.phase(VERIFY, target.device):
                base = target.length
                depths = [len(p) for p in tree.paths]
                h = target.hidden_masked([final] + tokens, [base] + [base + d for d in depths], tree.verify_mask(base))
                t = target.head(h).tolist()
                path = tree.accept(tokens, t)
                correction = t[1 + path[-1]] if path else t[0]
                stats.verify_calls += 1
                nodes += tree.size
            done = emit_round(stats, out, [tokens[i] for i in path], len(path), correction, kk, eos, max_new_tokens)
            with clock.phase(FINALIZE):
                target.keep(base, [0] + [1 + i for i in path])
                if done:
                    break
                drafter.observe(path, correction)
                final = correction
        gen = finish(stats, out, eos, clock, t0, t1)
        gen.extra["tree_nodes"] = nodes
        return gen


def shape_for(runner, mode: Mode) -> TreeShape:
    """The tree a tree mode (or a variant) grows on ``runner``: a variant's node count grown from its draft's measured
    rank table (``runner.tree_tables``; none: :data:`PRIOR`), at most its K (else ``k_max``) deep; a variant's K and
    width as a beam; else ``runner.tree_shape``, else a beam K deep and ``tree_width`` wide."""
    draft, k, width, nodes = mode.draft, mode.k, mode.width, mode.nodes
    table = (runner.tree_tables or {}).get(draft)
    if nodes is not None:
        table = table or [PRIOR]
        return TreeShape.grown(nodes, table, max_depth=k or runner.k_max, max_rank=len(table[0]))
    if k is None and width is None and runner.tree_shape is not None:
        return runner.tree_shape
    return TreeShape.beam(runner.k, width or runner.tree_width, table)


def drafters(runner) -> dict:
    """The runner's tree drafters: dense, and FlashHead where it has the head."""
    return {name: TreeDrafter(model, head=head, vocab_limit=runner.draft.vocab_limit, name=name)
            for name, (model, head) in runner.bodies().items()}


def run(runner, mode: Mode, ids: Sequence[int], clock: PhaseClock | None = None) -> Generation:
    """One generation of a tree mode on ``runner`` (:func:`shape_for`'s tree)."""
    drafter = runner.loop_drafters["tree"].get(mode.draft)
    if drafter is None:
        raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
    shape = shape_for(runner, mode)
    gen = tree_generate(runner.t_state, drafter, ids, shape=shape, max_new_tokens=runner.max_new_tokens,
                        eos_ids=runner.eos, clock=clock)
    gen.extra.update(tree=str(shape), tree_size=shape.size)
    return gen


def options(settings, modes) -> dict:
    """The runner's tree settings from a run's (``tree_width``; ``tree_shape``, a shape's text), checked."""
    width, text = getattr(settings, "tree_width", 3), getattr(settings, "tree_shape", None)
    if not isinstance(width, int) or width < 1:
        raise ConfigError(f"tree_width must be an integer >= 1 (got {width!r}).")
    return {"tree_width": width, "tree_shape": TreeShape.parse(text) if text else None}


LOOP = extensions.Loop(claims=lambda draft, schedule: schedule == "tree", drafters=drafters, run=run, options=options)
