"""FlashHead's Triton kernels (``thesis_lib.heads.gpu_kernels``) run by Triton's interpreter on the CPU.

Run by ``tests/test_gpu_kernels.py`` in a process of its own with ``TRITON_INTERPRET=1`` set from the start:
Triton's standard library (``tl.sum``, ``tl.cumsum``...) is compiled or interpreted by the switch's value when
Triton is first imported, and in the main test process other code may import it first.

The kernels are what the head runs on a GPU; here ``TRITON_INTERPRET=1`` executes the same kernel code with
NumPy, so a change that breaks the probe selection, the tie rules or the packed argmax fails without a GPU.
The reference is written out plainly in this file: rank the clusters by the bfloat16 centroid score (ties to
the lower cluster index), score every candidate row in float32, take the highest score, ties to the lowest
token id. Speed is not tested here (``thesis-lib studies gpu-check`` measures it on a GPU).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported
pytest.importorskip("triton")

from thesis_lib.heads.clustering import random_clustering  # noqa: E402
from thesis_lib.heads import gpu_kernels  # noqa: E402
from thesis_lib.heads.clustering import Clustering  # noqa: E402
from thesis_lib.heads.flashhead import FlashHead  # noqa: E402


@pytest.fixture(autouse=True, params=["score-count-kernel", "matrix-product"])
def design(request, monkeypatch):
    """Every check runs with one row's centroid scores from ``score_count_kernel`` (the default) and from the
    matrix product that several rows take; each leaves the shared histograms and counters zeroed."""
    monkeypatch.setattr(gpu_kernels, "SCORE_IN_TRITON", request.param == "score-count-kernel")
    yield request.param
    for ws in gpu_kernels._workspaces.values():
        assert int(ws["hist16"].abs().sum() + ws["hist8"].abs().sum() + ws["counters"].abs().sum()) == 0


def reference(h: torch.Tensor, head: FlashHead) -> list[int]:
    """The semantics the kernels implement, one row at a time, in plain torch."""
    out = []
    for row in h:
        cs = (row[None].to(head.fast_centroids.dtype) @ head.fast_centroids.T)[0].float()
        order = sorted(range(cs.numel()), key=lambda i: (-cs[i].item(), i))[:head.n_probes]
        w = head.weight_perm[order].reshape(-1, head.weight_perm.shape[-1]).float()
        x = row.to(head.weight_perm.dtype).float()
        scores = torch.cat([w @ x + head.slot_bias[order].reshape(-1), head.special_weight.float() @ x
                            + head.special_bias])
        ids = torch.cat([head.tokens[order].reshape(-1), head.special_ids])
        out.append(int(ids[scores == scores.max()].min()))
    return out


def probes_of(scores: torch.Tensor, n: int) -> list[list[int]]:
    return [sorted(sorted(range(r.numel()), key=lambda i: (-r[i].item(), i))[:n]) for r in scores.float()]


def make_head(vocab=2048, hidden=64, clusters=128, probes=8, specials=(), seed=0, **kw) -> FlashHead:
    """A random head; its centroids in bfloat16 unless ``kw`` names others: what ``auto`` gives on CUDA, where these
    kernels run (on a CPU ``auto`` gives float32 where bf16 is not native, and the kernels would take another path)."""
    kw.setdefault("centroid_dtype", torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(vocab, hidden, generator=g) * 0.1).bfloat16()
    return FlashHead(w, random_clustering(vocab, hidden, clusters, seed=seed), n_probes=probes,
                     special_ids=specials, path="eager", **kw)


@pytest.mark.parametrize("probes", [1, 7, 64, 128])
@pytest.mark.parametrize("specials", [(), (3, 900, 2047)])
def test_greedy_matches_the_plain_reference(probes, specials):
    head = make_head(probes=probes, specials=specials, seed=probes)
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    got = gpu_kernels.greedy(h, *head.fast_arguments())
    assert got.dtype == torch.int64 and got.tolist() == reference(h, head)
    # several rows in one call give what each row gives alone
    assert got.tolist() == [int(gpu_kernels.greedy(h[i:i + 1], *head.fast_arguments())) for i in range(3)]


def test_float32_centroids_take_the_one_program_select():
    head = make_head(probes=9, specials=(5,), centroid_dtype="float32")
    h = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert gpu_kernels.greedy(h, *head.fast_arguments()).tolist() == reference(h, head)


def test_ties_at_the_threshold_go_to_the_lowest_cluster_index():
    """Centroid scores with many exact ties: few ties (the tie list), and every score equal (more ties than the
    list holds: the scan). The probed set decides the token, so each case is built for the tie rule to show."""
    vocab, hidden, clusters = 1024, 32, 128
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(vocab, hidden, generator=g) * 0.1).bfloat16()
    assignments = torch.arange(vocab) % clusters
    levels = torch.randint(0, 4, (clusters,), generator=g).float()  # 4 distinct scores: ties everywhere
    centroids = torch.zeros(clusters, hidden)
    centroids[:, 0] = 1.0 + levels
    centroids[:, 1] = 1.0
    head = FlashHead(w, Clustering(centroids=centroids, assignments=assignments, info={}), n_probes=21,
                     path="eager")
    h = torch.zeros(3, hidden)
    h[:, 0] = 1.0
    h[:, 2:] = torch.randn(3, hidden - 2, generator=g)
    h = h.bfloat16()
    assert gpu_kernels.greedy(h, *head.fast_arguments()).tolist() == reference(h, head)
    assert head.n_probes < clusters and len(set(levels.tolist())) == 4  # the threshold level is shared
    equal = FlashHead(w, Clustering(centroids=torch.ones(clusters, hidden), assignments=assignments, info={}),
                      n_probes=5, path="eager")
    assert clusters > gpu_kernels.TIE_CAP
    got = gpu_kernels.greedy(h, *equal.fast_arguments()).tolist()
    assert got == reference(h, equal)
    # with every centroid alike the probes are clusters 0..4: the answer is the best token of those
    first = equal.tokens[:5].reshape(-1)
    scores = w[first].float() @ h.float().T
    assert got == first[scores.argmax(0)].tolist()


def test_the_one_program_select_keeps_the_set_topk_keeps():
    for c, n in [(9496, 593), (1000, 1), (1000, 1000), (300, 37)]:
        for dtype in (torch.bfloat16, torch.float32):
            scores = (torch.randint(-40, 40, (2, c), generator=torch.Generator().manual_seed(c)).float() / 8).to(dtype)
            top, _ = gpu_kernels.probe(scores, n, chunk=256)
            assert [sorted(r) for r in top.tolist()] == probes_of(scores, n), (c, n, dtype)
            assert all(r == sorted(r) for r in top.tolist())


@pytest.mark.parametrize("block", [1024, 8])
def test_the_tied_cluster_just_past_the_probes_stays_unprobed(monkeypatch, block):
    """Every centroid scores alike, so the probes are the lowest-index clusters; the best token of the whole
    vocabulary sits in the first cluster past them (counted and picked by one program, or by several). Probing one
    tied cluster too many, or too few, changes the token."""
    monkeypatch.setattr(gpu_kernels, "PICK_BLOCK", block)
    vocab, hidden, clusters, probes = 512, 16, 32, 6
    g = torch.Generator().manual_seed(12)
    w = torch.randn(vocab, hidden, generator=g) * 0.01
    assignments = torch.arange(vocab) % clusters  # cluster c holds tokens c, c + 32, ...
    h = torch.zeros(1, hidden)
    h[0, 0] = 1.0
    w[probes + clusters, 0] = 3.0  # the best token: cluster `probes`, the first one not probed
    w[probes - 1, 0] = 2.0  # the best probed token: the last probed cluster
    head = FlashHead(w.bfloat16(), Clustering(centroids=torch.ones(clusters, hidden), assignments=assignments,
                                              info={}), n_probes=probes, path="eager")
    assert gpu_kernels.greedy(h.bfloat16(), *head.fast_arguments()).tolist() == [probes - 1] == reference(
        h.bfloat16(), head)


def test_equal_token_scores_go_to_the_lowest_id_also_across_clusters_and_specials():
    vocab, hidden, clusters = 512, 16, 32
    g = torch.Generator().manual_seed(5)
    w = torch.randn(vocab, hidden, generator=g) * 0.01
    h = torch.zeros(1, hidden)
    h[0, 0] = 1.0
    w[[300, 40, 77], 0] = 5.0  # three tokens share the best score; 40 is also a special token
    w[[300, 40, 77], 1:] = 0.0
    assignments = torch.arange(vocab) % clusters
    head = FlashHead(w.bfloat16(), Clustering(centroids=torch.ones(clusters, hidden), assignments=assignments,
                                              info={}), n_probes=clusters, special_ids=(40,), path="eager")
    assert gpu_kernels.greedy(h.bfloat16(), *head.fast_arguments()).tolist() == [40]
    head = FlashHead(w.bfloat16(), Clustering(centroids=torch.ones(clusters, hidden), assignments=assignments,
                                              info={}), n_probes=clusters, path="eager")
    assert gpu_kernels.greedy(h.bfloat16(), *head.fast_arguments()).tolist() == [40]


def test_the_kept_histograms_are_zero_again_after_each_call():
    """The bfloat16 path keeps its histograms between calls and relies on each call leaving them zeroed."""
    head = make_head(vocab=4096, clusters=256, probes=16)
    h = torch.randn(2, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    first = gpu_kernels.greedy(h, *head.fast_arguments()).tolist()
    ws = gpu_kernels._workspaces[("cpu", 2)]
    assert int(ws["hist16"].abs().sum() + ws["hist8"].abs().sum() + ws["counters"].abs().sum()) == 0
    assert gpu_kernels.greedy(h, *head.fast_arguments()).tolist() == first == reference(h, head)


def test_many_counting_programs_per_row_agree(monkeypatch):
    """Rows split over several counting and picking programs (their slot counters, a tie list filled by several
    programs, zeroing by several programs): the same tokens as the plain reference, histograms zero after."""
    monkeypatch.setattr(gpu_kernels, "PICK_BLOCK", 64)
    head = make_head(vocab=4096, clusters=256, probes=40, specials=(1, 2))
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    assert gpu_kernels.greedy(h, *head.fast_arguments()).tolist() == reference(h, head)
    vocab, hidden, clusters = 2048, 32, 256  # coarse centroid scores: ties at the threshold across programs
    g = torch.Generator().manual_seed(6)
    centroids = torch.zeros(clusters, hidden)
    centroids[:, 0] = 1.0 + torch.randint(0, 6, (clusters,), generator=g).float()
    tied = FlashHead((torch.randn(vocab, hidden, generator=g) * 0.1).bfloat16(),
                     Clustering(centroids=centroids, assignments=torch.arange(vocab) % clusters, info={}),
                     n_probes=70, path="eager")
    x = torch.zeros(2, hidden)
    x[:, 0] = 1.0
    x[:, 1:] = torch.randn(2, hidden - 1, generator=g)
    assert gpu_kernels.greedy(x.bfloat16(), *tied.fast_arguments()).tolist() == reference(x.bfloat16(), tied)
    ws = gpu_kernels._workspaces[("cpu", 2)]
    assert int(ws["hist16"].abs().sum() + ws["hist8"].abs().sum() + ws["counters"].abs().sum()) == 0


def test_minus_zero_and_plus_zero_are_one_score():
    """Scores -0.0 and +0.0 are equal: a tie, so the lower cluster index is probed first."""
    scores = torch.tensor([[-0.0, 0.0, -1.0]], dtype=torch.bfloat16)
    assert gpu_kernels.probe(scores.float(), 1)[0].tolist() == [[0]]
    assert gpu_kernels.probe(scores, 1)[0].tolist() == [[0]]


def test_the_triton_path_scores_the_confidence_head_in_the_kernel(monkeypatch):
    """A "triton" head's confidence call scores the probed clusters with the Triton kernel (a head that fell back
    to torch's scoring would be timed by gpu-check under the kernel's name) and agrees with the eager head."""
    head = make_head(probes=6, specials=(11,), seed=4)
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(8)).bfloat16()
    want = head.greedy_confidence(h)
    calls = []
    kernel = gpu_kernels.cluster_scores
    monkeypatch.setattr(gpu_kernels, "cluster_scores", lambda *a: calls.append(1) or kernel(*a))
    head.path = "triton"
    got = head.greedy_confidence(h)
    assert head.active_path == "triton" and len(calls) == 1
    assert got[0].tolist() == want[0].tolist() == reference(h, head)
    torch.testing.assert_close(got[1], want[1])


def test_auto_takes_the_kernels_where_they_serve_the_head(monkeypatch):
    """On a device the kernels serve (this interpreter stands in for a GPU), an "auto" head of a shape the kernels
    support runs them; a cluster size they do not support (not a power of two) stays on torch's path."""
    from thesis_lib.heads import cpu_kernels

    monkeypatch.setattr(gpu_kernels, "available", lambda device: True)
    monkeypatch.setattr(cpu_kernels, "ENABLED", False)  # the CPU's own kernel aside: this CPU stands in for a GPU
    head = make_head(probes=5, seed=5)
    head.path = "auto"
    h = torch.randn(2, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
    assert head(h).tolist() == reference(h, head) and head.active_path == "triton"
    odd = make_head(vocab=2040, clusters=170, probes=5, seed=5)  # 12 rows a cluster
    assert odd.cluster_size == 12
    odd.path = "auto"

    def no_compiler(attr, args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(odd, "_compiled_call", no_compiler)  # torch's path without compiling: eager, with a warning
    with pytest.warns(RuntimeWarning):
        assert odd(h).tolist() == reference(h, odd)
    assert odd.active_path == "eager"


def test_a_surplus_tie_before_a_cluster_above_the_threshold_stays_unprobed(monkeypatch):
    """Clusters 0-4 tie at the threshold, cluster 5 is above it and 4 probes are asked for: the probes are 5 and
    the lowest three ties (0, 1, 2). With four keys a program, tie 4 (surplus) is counted and picked with cluster 5;
    a pick that took it, in place of cluster 5 or of a lower tie, would score cluster 4, whose best token (4.0)
    beats cluster 5's (3.0)."""
    monkeypatch.setattr(gpu_kernels, "PICK_BLOCK", 4)
    vocab, hidden, clusters = 64, 16, 16
    g = torch.Generator().manual_seed(21)
    w = torch.randn(vocab, hidden, generator=g) * 0.01
    w[:, :2] = 0.0
    w[5 + clusters, 1], w[4 + 2 * clusters, 1] = 3.0, 4.0  # the best tokens of clusters 5 and 4
    centroids = torch.zeros(clusters, hidden)
    centroids[:6, 0], centroids[5, 1] = 1.0, 1.0  # (unit norm: cluster 5 scores 1.41, the ties 1)
    head = FlashHead(w.bfloat16(), Clustering(centroids=centroids, assignments=torch.arange(vocab) % clusters,
                                              info={}), n_probes=4, path="eager")
    h = torch.zeros(1, hidden)
    h[0, :2] = 1.0
    assert gpu_kernels.greedy(h.bfloat16(), *head.fast_arguments()).tolist() == [5 + clusters] == reference(
        h.bfloat16(), head)


def test_the_centroid_score_kernel_rounds_to_the_nearest_even_bfloat16():
    """``score_count_kernel``'s scores are float32 sums rounded to the nearest bfloat16, ties to even, as a GPU's
    conversion and torch's product round (Triton's interpreter would truncate): sums built exact in float32,
    halfway between two bfloat16 values and just past halfway, of both signs; and its histograms count them."""
    fractions = [0.0, 2.0 ** -8, 3 * 2.0 ** -8, 2.0 ** -8 + 2.0 ** -12, 5 * 2.0 ** -8, 2.0 ** -9]
    centroids = torch.zeros(2 * len(fractions), 16)
    for i, f in enumerate(fractions):  # 1 + f and -(1 + f): exact in float32, each f a bfloat16 value
        centroids[2 * i, :2] = torch.tensor([1.0, f])
        centroids[2 * i + 1, :2] = torch.tensor([-1.0, -f])
    centroids = centroids.bfloat16()
    h = torch.ones(1, 16, dtype=torch.bfloat16)
    exact = h.float() @ centroids.float().T
    c = centroids.shape[0]
    keys = torch.zeros(1, c, dtype=torch.int16)
    hist16, hist8 = torch.zeros(1, 65536, dtype=torch.int32), torch.zeros(1, 256, dtype=torch.int32)
    gpu_kernels._kernels().score_count_kernel[(3, 1)](h, centroids, keys, hist16, hist8, torch.empty(1, dtype=torch.int64),
                                                      C=c, D=16, CB=4, BLOCK_D=16, PDL=False)
    got = keys.view(torch.bfloat16).float()
    assert got.tolist() == exact.bfloat16().float().tolist()
    truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32)
    assert got.tolist() != truncated.tolist()  # the sums straddle bfloat16 values: the rounding rule shows
    assert int(hist16.sum()) == int(hist8.sum()) == c
    one = int(torch.tensor([1.0]).bfloat16().view(torch.int16)) | 0x8000  # a positive score's key: its bits, top bit set
    assert int(hist16[0, one]) == 3 and int(hist8[0, one >> 8]) == int(hist16[0, one & 0xFF00:(one | 0xFF) + 1].sum())


def test_one_row_is_scored_by_the_counting_kernel_and_several_by_the_matrix_product(design, monkeypatch):
    """By default a single row's centroids are scored in ``score_count_kernel`` (no matrix product, no
    ``count_kernel``); rows of a batch share one matrix product, which reads the centroids once for all."""
    kernels, launched = gpu_kernels._kernels(), []

    class Spy:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(kernels, name)

        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append(self.name) or self.kernel[grid](*a, **kw)

    for name in ("score_count_kernel", "count_kernel"):
        monkeypatch.setattr(kernels, name, Spy(name))
    head = make_head(probes=9, seed=3)
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    assert gpu_kernels.greedy(h[:1], *head.fast_arguments()).tolist() == reference(h[:1], head)
    assert gpu_kernels.greedy(h, *head.fast_arguments()).tolist() == reference(h, head)
    one = "score_count_kernel" if design == "score-count-kernel" else "count_kernel"
    assert launched == [one, "count_kernel"]


def test_a_cluster_count_the_scoring_blocks_do_not_divide():
    """170 clusters: the last scoring and counting programs hold a partial block (10 of 16 centroids), whose lanes
    past the end are neither scored, counted nor probed; the tokens are the reference's on every row."""
    head = make_head(vocab=170 * 16, clusters=170, probes=23, seed=8)
    assert head.n_clusters % gpu_kernels.CENTROID_BLOCK and head.n_clusters % gpu_kernels.PICK_BLOCK
    h = torch.randn(4, 64, generator=torch.Generator().manual_seed(10)).bfloat16()
    assert [int(gpu_kernels.greedy(h[i:i + 1], *head.fast_arguments())) for i in range(4)] == reference(h, head)
