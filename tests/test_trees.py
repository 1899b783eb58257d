"""Token trees (thesis_studies.trees.loop): shapes, the tree drafter's cache, exact tree verification; greedy output equals
target-only output for random shapes, prompts and budgets."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_studies.trees.loop import TreeDrafter, TreeShape, tree_generate
from thesis_lib.errors import ConfigError
from thesis_lib.heads import clustering as cl
from thesis_lib.heads.flashhead import FlashHead

from conftest import TINY_VOCAB, int8_pair

@pytest.fixture(scope="module")
def pair():
    """A tiny target and a close draft in int8-dynamic (rows computed alone), row-exact attention; the draft with
    its dense head and with a FlashHead head (17 clusters, 2 probes)."""
    target, draft, flash = int8_pair()
    return {"target": ModelState(target, vocab_limit=TINY_VOCAB), "draft": draft, "dense": None, "flash": flash}


@st.composite
def shapes(draw, max_nodes: int = 12):
    """Random trees: each node a new child (of a random rank) of the root or of a node already in the tree."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, max_nodes))):
        parent = draw(st.sampled_from([()] + paths))
        taken = {p[-1] for p in paths if p[:-1] == parent}
        rank = draw(st.integers(0, 4).filter(lambda r: r not in taken))
        paths.append(parent + (rank,))
    return TreeShape(tuple(sorted(paths, key=lambda p: (len(p), p))))


HYP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
prompt = st.lists(st.integers(0, TINY_VOCAB - 1), min_size=1, max_size=12)


@HYP
@given(shape=shapes(), ids=prompt, max_new=st.integers(1, 30), name=st.sampled_from(["dense", "flash"]),
       stop=st.integers(0, 40))
def test_tree_decoding_equals_target_only_greedy(pair, shape, ids, max_new, name, stop):
    """Any tree shape, prompt and budget, with an EOS taken from the reference output (``stop`` picks it) or none."""
    target = pair["target"]
    plain = greedy_generate(target, ids, max_new_tokens=max_new).tokens
    eos = [plain[stop % len(plain)]] if stop < 30 else []
    ref = greedy_generate(target, ids, max_new_tokens=max_new, eos_ids=eos).tokens
    drafter = TreeDrafter(pair["draft"], head=pair[name], vocab_limit=TINY_VOCAB, name=name)
    gen = tree_generate(target, drafter, ids, shape=shape, max_new_tokens=max_new, eos_ids=eos)
    assert gen.tokens == ref
    st_ = gen.stats
    assert sum(st_.emitted) + st_.tail_tokens + 1 == len(ref)
    assert all(a <= d <= shape.depth for a, d in zip(st_.accepted, st_.drafted))


@HYP
@given(shape=shapes(max_nodes=9), ids=prompt)
def test_each_node_of_a_verified_tree_computes_what_one_token_steps_over_its_path_compute(pair, shape, ids):
    """The tree forward (tree mask, row-exact attention) against a fresh one-token-at-a-time pass over each node's
    own path: equal final hidden states, bit for bit."""
    target = pair["target"]
    tokens = [(7 * i + 3) % TINY_VOCAB for i in range(shape.size)]
    with torch.inference_mode():
        target.reset()
        target.hidden(ids[:-1] or ids)
        base = target.length
        root = ids[-1] if len(ids) > 1 else ids[0]
        depths = [len(p) for p in shape.paths]
        tree = target.hidden_masked([root] + tokens, [base] + [base + d for d in depths], shape.verify_mask(base))
        for i in range(shape.size):
            path = [j for j in range(shape.size) if shape.ancestry[i, j]]
            target.reset()
            target.hidden(ids[:-1] or ids)
            steps = [target.hidden([t]) for t in [root] + [tokens[j] for j in path]]
            assert torch.equal(tree[1 + i], steps[-1][0]), (shape.paths[i], path)
        assert torch.equal(tree[0], steps[0][0])


@HYP
@given(shape=shapes(max_nodes=9), ids=prompt, name=st.sampled_from(["dense", "flash"]))
def test_every_drafted_node_is_its_paths_ranked_candidate(pair, shape, ids, name):
    """The drafter's cache handles branches: each node's token is the rank its path names among the draft head's
    candidates after the context and the node's ancestors, computed afresh: the context's prefill, then the ancestors
    one token at a time (what the drafter's tree forwards compute row for row; a prefill over the ancestors too can
    round differently and reorder near-tied candidates)."""
    head = pair[name]
    drafter = TreeDrafter(pair["draft"], head=head, vocab_limit=TINY_VOCAB)
    drafter.begin(ids)
    tokens = drafter.propose(shape)
    fresh = ModelState(pair["draft"], head=head, vocab_limit=TINY_VOCAB)
    r = max(p[-1] for p in shape.paths) + 1  # the drafter asks every node for as many candidates
    with torch.inference_mode():
        for i, p in enumerate(shape.paths):
            ancestors = [tokens[j] for j in range(shape.size) if shape.ancestry[i, j] and j != i]
            fresh.reset()
            h = fresh.hidden(list(ids))[-1:]
            for t in ancestors:
                h = fresh.hidden([t])[-1:]
            assert fresh.head.top(h, r)[0][0, p[-1]].item() == tokens[i], p


def test_a_width_one_tree_is_the_deferred_chain(pair):
    """Round by round: the chain of K as a tree drafts, accepts and emits what the deferred chain loop does."""
    target = pair["target"]
    for name in ("dense", "flash"):
        for ids in ([5, 9, 13], [200, 3, 3, 3, 41, 7], list(range(40, 52))):
            chain = speculative_generate(target, ModelDrafter(pair["draft"], head=pair[name], vocab_limit=TINY_VOCAB),
                                         ids, k=4, max_new_tokens=40, schedule="deferred")
            tree = tree_generate(target, TreeDrafter(pair["draft"], head=pair[name], vocab_limit=TINY_VOCAB), ids,
                                 shape=TreeShape.chain(4), max_new_tokens=40)
            assert tree.tokens == chain.tokens
            assert (tree.stats.accepted, tree.stats.emitted) == (chain.stats.accepted, chain.stats.emitted)


def test_the_longest_accepted_path_follows_the_targets_tokens():
    """A constructed tree: the walk takes the matching child at each depth, whatever its rank, and stops where no
    child matches; without a match at the root nothing is accepted."""
    shape = TreeShape(((0,), (1,), (2,), (0, 0), (1, 0), (1, 1), (1, 1, 0)))
    tokens = [10, 11, 12, 20, 21, 22, 30]
    # target after root, then after each node (index 1 + i)
    target = [11, 0, 22, 0, 0, 0, 30, 0]
    assert shape.accept(tokens, target) == [1, 5, 6]
    target[6] = 5  # after node 5 the target wants a token no child has
    assert shape.accept(tokens, target) == [1, 5]
    assert shape.accept(tokens, [99] * 8) == []


def test_shapes_refuse_what_is_not_a_tree():
    for bad in ((), ((0, 0),), ((0,), (0,)), ((0,), (-1,)), ((0, 0), (0,))):
        with pytest.raises(ConfigError):
            TreeShape(bad)
    assert TreeShape.beam(5, 1) == TreeShape.chain(5)
    assert TreeShape.beam(3, 2).widths == (2, 2, 2)


def _all_trees(max_nodes: int, ranks: int, depth: int):
    """Every tree of up to ``max_nodes`` nodes with ranks below ``ranks``, at most ``depth`` deep (brute force)."""
    candidates = [p for d in range(1, depth + 1) for p in itertools.product(range(ranks), repeat=d)]
    for n in range(1, max_nodes + 1):
        for nodes in itertools.combinations(candidates, n):
            s = set(nodes)
            if all(len(p) == 1 or p[:-1] in s for p in nodes):
                yield sorted(nodes, key=lambda p: (len(p), p))


def test_grown_trees_are_the_best_trees_of_their_size():
    """Against every tree of up to 5 nodes (3 ranks, depth 3) under a depth-dependent table: the grown tree's
    expected accepted tokens is the largest of its size."""
    table = [[0.55, 0.2, 0.1], [0.7, 0.12, 0.05], [0.8, 0.1, 0.02]]
    best: dict[int, float] = {}
    for nodes in _all_trees(5, 3, 3):
        e = TreeShape(tuple(nodes)).expected_accepted(table)
        best[len(nodes)] = max(best.get(len(nodes), 0.0), e)
    for n, e in best.items():
        grown = TreeShape.grown(n, table, max_depth=3, max_rank=3)
        assert grown.size == n
        assert grown.expected_accepted(table) == pytest.approx(e)


@pytest.mark.parametrize("path", ["eager", "compiled", "reference"])
def test_a_heads_ranked_candidates_start_with_its_greedy_token_and_fall_in_probability(pair, path):
    """``top``: rank 0 is the head's own greedy token; the rest follow in falling probability; FlashHead's fast paths
    rank what its reference computation ranks; the dense head's log-probabilities are the full softmax's."""
    w = pair["draft"].get_output_embeddings().weight.detach().clone()
    flash = FlashHead(w, cl.spherical_kmeans(w, 17, iterations=10, seed=0, progress=False), n_probes=3,
                      vocab_limit=TINY_VOCAB, path=path)
    h = torch.randn(6, w.shape[1], generator=torch.Generator().manual_seed(4))
    ref = FlashHead(w, cl.spherical_kmeans(w, 17, iterations=10, seed=0, progress=False), n_probes=3,
                    vocab_limit=TINY_VOCAB, path="reference")
    ids, lp = flash.top(h, 5)
    assert torch.equal(ids[:, 0], flash(h))
    assert (lp[:, 1:].diff(dim=1) <= 0).all() and (lp <= 0).all()
    ref_ids, ref_lp = ref.top(h, 5)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-4, atol=1e-4)
    dense = ModelState(pair["draft"], vocab_limit=TINY_VOCAB).head
    d_ids, d_lp = dense.top(h, 4)
    assert torch.equal(d_ids[:, 0], dense(h))
    full = torch.log_softmax(dense.logits(h).float(), dim=-1)
    torch.testing.assert_close(d_lp, full.gather(1, d_ids))


def test_a_shape_reads_back_from_its_text():
    shape = TreeShape.beam(4, 3)
    assert TreeShape.parse(str(shape)) == shape
    assert TreeShape.parse("0.1 0 1 0.0") == TreeShape(((0,), (1,), (0, 0), (0, 1)))
    for bad in ("0 x", "0.0", ""):
        with pytest.raises(ConfigError):
            TreeShape.parse(bad)


def test_calibration_times_the_draft_over_every_width_a_tree_may_expand(tok):
    """A grown tree of N nodes may expand up to N nodes at one depth: the draft's forward is timed over 1..N tokens
    (as the target's verify over 1..N + 1), so every searched shape has a measured cost."""
    from thesis_studies.trees import bench as tree_bench
    from thesis_lib.bench.runner import Runner
    from thesis_lib.models.loading import LoadedModel

    target, draft, flash = int8_pair()
    pair = [LoadedModel(spec=f"tiny:{n}", model=m, tokenizer=tok, path=None, device="cpu", dtype="int8-dynamic")
            for n, m in (("target", target), ("draft", draft))]
    runner = Runner(*pair, k=3, max_new_tokens=8, flash_head=flash)
    doc = tree_bench.calibrate(runner, [list(range(5, 25))], max_new_tokens=10, reps=1, max_nodes=12, progress=False)
    assert set(doc["drafts"]) == {"dense", "flash"}
    for d in doc["drafts"].values():
        assert sorted(int(n) for n in d["draft_s"]) == list(range(1, 13))
        assert len(d["search"]["grown"]) == 12 and d["search"]["best"]["grown"]["round_s"] > 0


@pytest.mark.parametrize("max_new, drafted, nodes, appends", [
    (10, [3, 3], 10, 1),  # two whole trees (5 nodes each), then the one token left: the tail's append
    (8, [3, 2], 9, 0),  # the second tree cut to depth 2 (its 4 nodes of depth <= 2) ends the output
])
def test_a_branching_tree_counts_its_depth_acceptance_and_nodes(pair, max_new, drafted, nodes, appends):
    """The target as its own draft: every round accepts its tree's whole rank-0 path, so the counts follow from
    the shape ((0), (1), (0, 0), (0, 1), (0, 0, 0): depth 3, 5 nodes) and the budget alone."""
    target = pair["target"]
    shape = TreeShape(((0,), (1,), (0, 0), (0, 1), (0, 0, 0)))
    drafter = TreeDrafter(target.model, vocab_limit=TINY_VOCAB, name="dense")
    gen = tree_generate(target, drafter, [3, 1, 4, 1, 5], shape=shape, max_new_tokens=max_new)
    st_ = gen.stats
    assert gen.tokens == greedy_generate(target, [3, 1, 4, 1, 5], max_new_tokens=max_new).tokens
    assert st_.drafted == drafted and st_.accepted == drafted and gen.extra["tree_nodes"] == nodes
    assert (st_.verify_calls, st_.append_calls, st_.tail_tokens) == (len(drafted), appends, appends)


def test_keeping_positions_the_cache_does_not_hold_is_refused(pair):
    """A verified tree keeps positions after ``base``; one past the cache, or a base past it, is an error that
    says what was asked, and the cache is left as it was."""
    state = ModelState(pair["target"].model, vocab_limit=TINY_VOCAB)
    state.greedy([3, 1, 4])
    with pytest.raises(ValueError, match=r"^cannot keep \[0, 2\] after 2 of 3 cached positions$"):
        state.keep(2, [0, 2])
    with pytest.raises(ValueError, match=r"^cannot keep \[\] after 4 of 3 cached positions$"):
        state.keep(4, [])
    assert state.length == 3


def test_a_tree_round_s_verify_waits_for_the_target_alone(pair):
    """The verify phase is timed on the target's device only (the draft's next work may overlap it on a GPU): every
    VERIFY interval the loop opens names the target's device, the other phases what they name."""
    from thesis_lib.decoding.clocks import PhaseClock
    from thesis_lib.decoding.stats import VERIFY

    opened = []

    class Recording(PhaseClock):
        def phase(self, name, *devices):
            opened.append((name, devices))
            return super().phase(name, *devices)

    target = pair["target"]
    gen = tree_generate(target, TreeDrafter(pair["draft"], vocab_limit=TINY_VOCAB), [3, 1, 4, 1, 5],
                        shape=TreeShape(((0,), (1,), (0, 0))), max_new_tokens=8, clock=Recording())
    verifies = [devices for name, devices in opened if name == VERIFY]
    assert len(verifies) == gen.stats.verify_calls > 0 and set(verifies) == {(target.device,)}


def test_the_runner_grows_each_tree_mode_s_own_tree_through_the_study_s_loop(tok):
    """The tree modes reach the study's loop through the runner's hook: a plain mode grows the runner's beam (K deep,
    ``tree_width`` wide, its likeliest paths), a variant its own K and width (the runner's K restored after it), a node-count variant the
    tree grown from its draft's measured rank table (here one whose second candidate wins: the FlashHead draft's tree
    follows it, the dense draft's, without a table, the prior); each equals target-only greedy output."""
    from thesis_lib.bench.runner import Runner
    from thesis_lib.models.loading import LoadedModel

    target, draft, flash = int8_pair()
    pair = [LoadedModel(spec=f"tiny:{n}", model=m, tokenizer=tok, path=None, device="cpu", dtype="int8-dynamic")
            for n, m in (("target", target), ("draft", draft))]
    runner = Runner(*pair, k=3, max_new_tokens=10, flash_head=flash, tree_width=2,
                    tree_tables={"flash": [[0.2, 0.7, 0.1]] * 4})
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = runner.run("baseline", ids).tokens
    trees = {mode: runner.run(mode, ids) for mode in ("flash_tree", "dense_tree@k2w3", "flash_tree@n3", "dense_tree@n3")}
    assert runner.k == 3 and all(g.tokens == ref for g in trees.values())
    assert {m: g.extra["tree"] for m, g in trees.items()} == {
        # a beam keeps each depth's likeliest paths under its draft's table: the FlashHead draft's favours rank 1
        "flash_tree": "0 1 0.1 1.1 0.1.1 1.1.1", "dense_tree@k2w3": "0 1 2 0.0 0.1 1.0",
        "flash_tree@n3": "1 1.1 1.1.1", "dense_tree@n3": "0 0.0 0.0.0"}


def test_a_tree_drafter_needs_a_head_that_ranks_candidates(pair):
    """A head that gives only its greedy token cannot rank a node's children: refused at construction, by name."""
    class OnlyGreedy(torch.nn.Module):
        def forward(self, h):
            return h.argmax(-1)

    with pytest.raises(ConfigError, match=r"^the dense draft's head \(OnlyGreedy\) ranks no candidates, so it cannot "
                                          r"grow a token tree\.$"):
        TreeDrafter(pair["draft"], head=OnlyGreedy(), vocab_limit=TINY_VOCAB)
