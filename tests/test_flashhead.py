"""FlashHead on tiny models: the clustering, the asset format and cache, the greedy and sampling heads, and
the FlashHead draft in the speculative loops."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ClusteringAssetError, ConfigError
from thesis_lib.heads import assets
from thesis_lib.heads import clustering as cl
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads import flashhead
from thesis_lib.heads.flashhead import FlashHead, check_probes
from thesis_lib.heads.for_model import special_token_ids

from thesis_lib.models import weight_only as wo

from conftest import TINY_VOCAB

HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SPECIALS = [256, 257, 258]  # the tiny tokenizer's <|endoftext|>, <|im_start|>, <|im_end|>
NEEDS_KERNEL = pytest.mark.skipif(not wo.available(), reason="the project's CPU kernel cannot be built here")
#: the path of the project's kernel, as a parameter (skipped where the kernel cannot be built)
KERNEL = pytest.param("kernel", marks=NEEDS_KERNEL)
#: the kernel path where it can run, for loops over paths
KERNEL_HERE = ("kernel",) if wo.available() else ()


def head_weight(model) -> torch.Tensor:
    return model.get_output_embeddings().weight.detach()


@pytest.fixture(scope="module")
def tiny_clusterings(tiny_models):
    """Clusterings of the float64 qwen2 target's head (272 x 64): C = 17 (b = 16) and C = 20 (272 = 20 x 13.6)."""
    w = head_weight(tiny_models[("f64", "qwen2", "target")])
    return {c: cl.spherical_kmeans(w, c, iterations=10, seed=0, progress=False) for c in (17, 20)}


# ----------------------------------------------------------------------------------------------- clustering


@pytest.mark.parametrize("v,c", [(272, 17), (272, 20), (1000, 7), (5, 5), (9, 1)])
def test_capacities_are_equal_sizes_up_to_one(v, c):
    cap = cl.capacities(v, c)
    assert int(cap.sum()) == v and cap.numel() == c
    assert int(cap.max()) - int(cap.min()) <= (0 if v % c == 0 else 1)


@pytest.mark.parametrize("c", [0, -3, 273])
def test_cluster_count_out_of_range(c):
    with pytest.raises(ConfigError, match="does not fit"):
        cl.capacities(272, c)


def test_kmeans_gives_exact_sizes_and_a_sorted_table(tiny_clusterings):
    for c, clus in tiny_clusterings.items():
        assert torch.equal(clus.sizes(), cl.capacities(272, c))
        tokens, real = clus.cluster_table()
        assert tokens.shape == (c, -(-272 // c))
        for j in range(c):
            members = tokens[j][real[j]]
            assert torch.equal(members, torch.nonzero(clus.assignments == j).flatten())  # ascending ids
            assert torch.all(tokens[j][~real[j]] == members[0])  # padding repeats the lowest id
        assert sorted(tokens[real].tolist()) == list(range(272))


def test_kmeans_is_deterministic_and_beats_a_random_partition(tiny_models):
    w = head_weight(tiny_models[("f32", "qwen2", "target")])
    a = cl.spherical_kmeans(w, 17, iterations=8, seed=5, progress=False)
    b = cl.spherical_kmeans(w, 17, iterations=8, seed=5, progress=False)
    assert torch.equal(a.assignments, b.assignments) and torch.equal(a.centroids, b.centroids)
    xn = w / w.norm(dim=1, keepdim=True)

    def cohesion(assign):
        cen = torch.zeros(17, w.shape[1]).index_add_(0, assign, xn)
        cen = cen / cen.norm(dim=1, keepdim=True)
        return float((xn * cen[assign]).sum(1).mean())

    random_assign = torch.randperm(272, generator=torch.Generator().manual_seed(0)) % 17
    assert cohesion(a.assignments) > cohesion(random_assign) + 0.05
    assert a.info["history"][-1]["mean_cosine"] >= a.info["history"][0]["mean_cosine"]


def test_stored_centroids_are_plain_member_means(tiny_clusterings, tiny_models):
    w = head_weight(tiny_models[("f64", "qwen2", "target")]).float()
    clus = tiny_clusterings[17]
    for j in (0, 5, 16):
        assert torch.allclose(clus.centroids[j], w[clus.assignments == j].mean(0), atol=1e-5)


# ----------------------------------------------------------------------------------------------- assets


def test_assets_round_trip_in_embedls_format(tiny_clusterings, tmp_path):
    from safetensors.torch import load_file

    clus = tiny_clusterings[20]
    assets.save_assets(clus, tmp_path / "flash_head_assets")
    tensors = load_file(str(tmp_path / "flash_head_assets" / assets.CACHE_FILE))
    assert set(tensors) == {"centroids", "cluster_assignments"}
    assert tensors["centroids"].shape == (64, 20)  # [hidden, C]: one column per centroid
    assert tensors["cluster_assignments"].shape == (272,)
    config = json.loads((tmp_path / "flash_head_assets" / assets.CONFIG_FILE).read_text())
    assert config == {"format": "safetensors", "vocab_size": 272, "hidden_size": 64}
    back = assets.load_assets(tmp_path, vocab_size=272, hidden_size=64)  # the parent folder works too
    assert torch.equal(back.assignments, clus.assignments) and torch.equal(back.centroids, clus.centroids)


def test_official_style_assets_load(tmp_path):
    """Assets as an official checkpoint ships them: centroids [1, 1, hidden, C], no sidecar of ours."""
    from safetensors.torch import save_file

    folder = tmp_path / "flash_head_assets"
    folder.mkdir()
    save_file({"centroids": torch.randn(1, 1, 64, 17), "cluster_assignments": torch.arange(272) % 17},
              str(folder / assets.CACHE_FILE))
    (folder / assets.CONFIG_FILE).write_text(json.dumps({"format": "safetensors", "vocab_size": 272, "hidden_size": 64}))
    c = assets.load_assets(folder, vocab_size=272, hidden_size=64)
    assert c.n_clusters == 17 and c.hidden_size == 64 and c.vocab_size == 272


def test_assets_that_do_not_fit_are_refused(tiny_clusterings, tmp_path, tiny_models):
    assets.save_assets(tiny_clusterings[17], tmp_path)
    with pytest.raises(ClusteringAssetError, match="vocab_size=272"):
        assets.load_assets(tmp_path, vocab_size=300, hidden_size=64)
    with pytest.raises(ClusteringAssetError, match="hidden_size=64"):
        assets.load_assets(tmp_path, vocab_size=272, hidden_size=32)
    other = tiny_models[("f32", "qwen2", "independent")]  # hidden 32
    with pytest.raises(ClusteringAssetError, match="272 x 64"):
        FlashHead(head_weight(other), tiny_clusterings[17])


def test_corrupt_assets_are_detected(tiny_clusterings, tmp_path):
    assets.save_assets(tiny_clusterings[17], tmp_path)
    f = tmp_path / assets.CACHE_FILE
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ClusteringAssetError, match="corrupt"):
        assets.load_assets(tmp_path, vocab_size=272, hidden_size=64)
    # without our sidecar the bytes still have to parse
    (tmp_path / assets.SIDECAR_FILE).unlink()
    f.write_bytes(b"not a safetensors file")
    with pytest.raises(ClusteringAssetError, match="cannot read"):
        assets.load_assets(tmp_path, vocab_size=272, hidden_size=64)


def test_cache_reuses_and_rebuilds_a_corrupt_entry(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path))
    w = head_weight(tiny_models[("f32", "qwen2", "target")])
    logs = []
    first = assets.cached_clustering(w, 17, iterations=4, progress=False, log=logs.append)
    folder = assets.cache_folder(assets.head_sha256(w), 17, 0, 4, first.info["similarity_dtype"] == "bfloat16")
    assert (folder / assets.CACHE_FILE).is_file()
    again = assets.cached_clustering(w, 17, iterations=4, progress=False, log=logs.append)
    assert torch.equal(again.assignments, first.assignments) and not logs  # read back, not rebuilt
    (folder / assets.CACHE_FILE).write_bytes(b"truncated")
    rebuilt = assets.cached_clustering(w, 17, iterations=4, progress=False, log=logs.append)
    assert logs and "rebuilding" in logs[0]
    assert torch.equal(rebuilt.assignments, first.assignments)
    assert assets.load_assets(folder, vocab_size=272, hidden_size=64).n_clusters == 17  # sound again
    # another head (other bytes) gets another entry
    assert assets.head_sha256(w) != assets.head_sha256(w + 1e-3)


def test_a_shipped_clustering_is_used_for_its_own_head_only(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "SHIPPED_DIR", tmp_path / "shipped")
    w = head_weight(tiny_models[("f32", "qwen2", "target")])
    built = assets.cached_clustering(w, 17, iterations=4, progress=False)
    key, sha = built.info["cache_key"], built.info["head_sha256"]
    path = assets.ship_clustering(built, sha, key)
    with pytest.raises(ClusteringAssetError, match="exists"):
        assets.ship_clustering(built, sha, key)
    shutil.rmtree(tmp_path / "cache")

    def no_kmeans(*a, **k):
        raise AssertionError("k-means ran although a shipped clustering fits")

    monkeypatch.setattr(assets, "spherical_kmeans", no_kmeans)
    got = assets.cached_clustering(w, 17, iterations=4, progress=False)
    assert torch.equal(got.assignments, built.assignments)
    assert torch.equal(got.centroids, built.centroids)  # rebuilt from the head exactly as k-means stores them
    assert got.info["shipped"].endswith(path.name) and got.info["iterations"] == built.info["iterations"]
    assert assets.load_assets(assets.cache_folder(sha, 17, 0, 4, "bf16" in key)).n_clusters == 17  # now cached
    # another head under the same file name is not given this clustering
    assert assets.shipped_clustering(w + 1e-3, assets.head_sha256(w + 1e-3), key, 17) is None
    # a file whose clusters are not the equal sizes is refused, not used
    bad = built.assignments.clone()
    bad[bad == 0] = 1
    from safetensors.torch import save_file
    save_file({"cluster_assignments": bad.to(torch.int16)}, str(path), metadata={"head_sha256": sha})
    with pytest.raises(ClusteringAssetError, match="equal-size"):
        assets.shipped_clustering(w, sha, key, 17)


# ----------------------------------------------------------------------------------------------- greedy head


def _head(model, clus, **kw):
    return FlashHead(head_weight(model), clus, special_ids=SPECIALS, vocab_limit=TINY_VOCAB, **kw)


@HYP
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 6), c=st.sampled_from([17, 20]))
def test_all_probes_reproduce_the_dense_argmax_exactly(tiny_models, tiny_clusterings, seed, rows, c):
    model = tiny_models[("f64", "qwen2", "target")]
    dense = DenseGreedyHead.from_model(model, TINY_VOCAB)
    h = torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    for path in ("reference", "eager"):
        head = _head(model, tiny_clusterings[c], n_probes=c, path=path, centroid_dtype="float64")
        assert torch.equal(head(h), dense(h)), path


@pytest.mark.parametrize("n_probes", [1, 2, 4, 17])
@pytest.mark.parametrize("path", ["eager", "compiled", KERNEL])
def test_fast_paths_equal_the_reference(tiny_models, tiny_clusterings, n_probes, path):
    model = tiny_models[("f32", "qwen2", "target")]
    fast = _head(model, tiny_clusterings[17], n_probes=n_probes, path=path, centroid_dtype="float32")
    ref = _head(model, tiny_clusterings[17], n_probes=n_probes, path="reference")
    h = torch.randn(64, 64, generator=torch.Generator().manual_seed(n_probes)) * 3
    got = torch.cat([fast(h[i : i + 1]) for i in range(64)])
    assert fast.active_path == path
    assert torch.equal(got, ref(h))
    assert torch.equal(fast(h), got)  # a batch of positions gives the same as one at a time


@pytest.mark.parametrize("n_probes", [2, 17])
@pytest.mark.parametrize("path", ["eager", "compiled", "reference", KERNEL])
def test_greedy_confidence_is_the_candidate_softmax_of_the_greedy_token(tiny_models, tiny_clusterings, n_probes, path):
    """Whatever the path, the confidence call takes the greedy call's path (the kernel's: compiled) and picks its
    token."""
    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=n_probes, path=path, centroid_dtype="float32")
    h = torch.randn(16, 64, generator=torch.Generator().manual_seed(3)) * 3
    tokens, probs = head.greedy_confidence(h)
    assert head.active_path == ("compiled" if path == "kernel" else path)
    assert torch.equal(tokens, head(h))
    for i in range(16):  # the softmax over this position's candidates (probed clusters + specials), by hand
        scores, ids = head._candidate_scores(h[i], head.top_clusters(h[i : i + 1], reference=path == "reference")[0])
        p = torch.softmax(scores.double(), -1)
        assert ids[p.argmax()] == tokens[i]
        assert probs[i].item() == pytest.approx(p.max().item(), rel=1e-4)
    if n_probes == 17:  # every cluster probed: the dense head's softmax
        dense = DenseGreedyHead.from_model(model, TINY_VOCAB)
        d_tok, d_prob = dense.greedy_confidence(h)
        assert torch.equal(d_tok, tokens)
        torch.testing.assert_close(d_prob, probs, rtol=1e-4, atol=1e-6)
        assert torch.allclose(d_prob, torch.softmax(dense.logits(h).double(), -1).amax(-1).float(), rtol=1e-5)


def test_ties_go_to_the_lowest_token_id(tiny_clusterings):
    w = torch.randn(272, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w[200] = w[37]  # two identical rows: always tied
    h = w[37].clone() * 10  # makes row 37 (and 200) the best by far
    for p in (17,):  # all clusters probed, so both rows are candidates whatever the clustering
        for path in ("reference", "eager", "compiled", *KERNEL_HERE):
            dtype = torch.float32 if path == "kernel" else torch.float64  # the kernel reads bf16 or float32
            head = FlashHead(w.to(dtype), tiny_clusterings[17], n_probes=p, vocab_limit=TINY_VOCAB, path=path,
                             centroid_dtype=dtype)
            if int(head(h[None].to(dtype))[0]) != 37:
                pytest.fail(f"path {path}, p={p}: tie not broken towards the lowest id")


def test_special_tokens_are_always_candidates_and_padding_never_wins(tiny_models, tiny_clusterings):
    model = tiny_models[("f64", "qwen2", "target")]
    clus = tiny_clusterings[17]
    probe = _head(model, clus, n_probes=1, path="reference")
    # a hidden state whose single probed cluster is not <|im_end|>'s own
    g = torch.Generator().manual_seed(0)
    while True:
        h = torch.randn(64, generator=g, dtype=torch.float64)
        if int(probe.top_clusters(h[None])[0, 0]) != int(clus.assignments[258]):
            break
    w = head_weight(model).clone()
    w[258] = h * 10  # <|im_end|> now wins by far; the clustering (built before) is unchanged
    for path in ("reference", "eager", "compiled", *KERNEL_HERE):
        dtype = torch.float32 if path == "kernel" else torch.float64  # the kernel reads bf16 or float32
        head = FlashHead(w.to(dtype), clus, n_probes=1, special_ids=SPECIALS, vocab_limit=TINY_VOCAB, path=path,
                         centroid_dtype=dtype)
        assert 258 not in head.candidate_ids(h[None].to(dtype), reference=True)[0].tolist()
        assert int(head(h[None].to(dtype))[0]) == 258, path
        no_special = FlashHead(w.to(dtype), clus, n_probes=1, vocab_limit=TINY_VOCAB, path=path, centroid_dtype=dtype)
        assert int(no_special(h[None].to(dtype))[0]) != 258  # without the special list it would be missed
    # a padding row (id >= vocab_limit) with a huge logit is never chosen, even when its cluster is probed
    w[265] = h * 100
    full = FlashHead(w, clus, n_probes=17, special_ids=SPECIALS, vocab_limit=TINY_VOCAB, path="eager",
                     centroid_dtype="float64")
    assert int(full(h[None])[0]) == int(DenseGreedyHead(w, TINY_VOCAB)(h[None])[0]) == 258


@pytest.mark.parametrize("p", [0, -1, 18])
def test_probes_out_of_range(tiny_models, tiny_clusterings, p):
    with pytest.raises(ConfigError, match="out of range"):
        _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=p)
    with pytest.raises(ConfigError, match="out of range"):
        check_probes(p, 17)


def test_special_token_ids_from_the_tokenizer(tok):
    assert special_token_ids(tok, limit=TINY_VOCAB) == SPECIALS


# ----------------------------------------------------------------------------------------------- sampling


def test_sampling_returns_the_exact_candidate_distribution(tiny_models, tiny_clusterings):
    model = tiny_models[("f64", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=4, path="reference")
    h = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = torch.Generator().manual_seed(7)
    s = head.sample(h, temperature=0.8, generator=g)
    assert abs(float(s.probs.sum()) - 1) < 1e-6
    assert float(s.probs[s.candidates == s.token].sum()) > 0
    # tokens outside the drawn clusters (and not special) have probability zero
    q = s.dense(272)
    inside = torch.zeros(272, dtype=torch.bool)
    inside[head.tokens[s.clusters].reshape(-1)] = True
    inside[SPECIALS] = True
    assert float(q[~inside].sum()) == 0.0 and float(q[TINY_VOCAB:].sum()) == 0.0
    # within the candidates it is the softmax of the exact logits at temperature T
    logits = (head_weight(model).float() @ h.float()) / 0.8
    cand = torch.nonzero(q > 0).flatten()
    assert torch.allclose(q[cand], torch.softmax(logits[cand], 0), atol=1e-5)
    # seeded: reproducible
    again = head.sample(h, temperature=0.8, generator=torch.Generator().manual_seed(7))
    assert int(again.token) == int(s.token) and torch.equal(again.clusters, s.clusters)


def test_sampling_with_all_clusters_is_the_full_softmax(tiny_models, tiny_clusterings):
    model = tiny_models[("f64", "qwen2", "target")]
    head = _head(model, tiny_clusterings[20], n_probes=20, path="reference")
    h = torch.randn(64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    q = head.sample(h, generator=torch.Generator().manual_seed(0)).dense(272)
    p = torch.softmax(head_weight(model).float()[:TINY_VOCAB] @ h.float(), 0)
    assert torch.allclose(q[:TINY_VOCAB], p, atol=1e-5)
    # and the draws follow it: 3000 draws, the most likely token's frequency within 4 standard errors
    g = torch.Generator().manual_seed(3)
    draws = torch.tensor([int(head.sample(h, generator=g).token) for _ in range(3000)])
    top = int(p.argmax())
    freq = float((draws == top).float().mean())
    se = (float(p[top]) * (1 - float(p[top])) / 3000) ** 0.5
    assert abs(freq - float(p[top])) < 4 * se + 1e-9


def test_sampling_rejects_zero_temperature(tiny_models, tiny_clusterings):
    head = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17])
    with pytest.raises(ConfigError, match="temperature"):
        head.sample(torch.randn(64), temperature=0)


# ----------------------------------------------------------------------------------------------- the FlashHead draft


@HYP
@given(k=st.integers(1, 6), p=st.sampled_from([1, 3, 17]), prompt_len=st.integers(1, 12),
       max_new=st.integers(1, 30), deferred=st.booleans(), draft=st.sampled_from(["same", "close", "loose"]),
       seed=st.integers(0, 999))
def test_flashhead_draft_is_lossless(tiny_models, tiny_clusterings, k, p, prompt_len, max_new, deferred, draft, seed):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    dmodel = tiny_models[("f64", "qwen2", draft)]
    head = _head(dmodel, tiny_clusterings[17], n_probes=p, path="eager", centroid_dtype="float64")
    drafter = ModelDrafter(dmodel, head=head, vocab_limit=TINY_VOCAB, name="flashhead")
    prompt = torch.randint(0, 256, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    ref = greedy_generate(target, prompt, max_new_tokens=max_new, eos_ids=[258])
    spec = speculative_generate(target, drafter, prompt, k=k, max_new_tokens=max_new, eos_ids=[258], schedule="deferred" if deferred else "ordinary")
    assert spec.tokens == ref.tokens
    assert spec.stats.mode.startswith("flashhead_")


def test_flashhead_draft_with_all_probes_accepts_like_the_dense_draft(tiny_models, tiny_clusterings):
    target = ModelState(tiny_models[("f64", "qwen2", "target")], vocab_limit=TINY_VOCAB)
    dmodel = tiny_models[("f64", "qwen2", "close")]
    head = _head(dmodel, tiny_clusterings[17], n_probes=17, path="eager", centroid_dtype="float64")
    dense = ModelDrafter(dmodel, vocab_limit=TINY_VOCAB)
    flash = ModelDrafter(dmodel, head=head, vocab_limit=TINY_VOCAB, name="flashhead")
    prompt = list(b"speculative")
    a = speculative_generate(target, dense, prompt, k=4, max_new_tokens=40, eos_ids=[258])
    b = speculative_generate(target, flash, prompt, k=4, max_new_tokens=40, eos_ids=[258])
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


# ----------------------------------------------------------------------------------------------- quality


def test_quality_curve_agreement_equals_recall(tiny_models, tiny_clusterings):
    from thesis_lib.bench.modelbench import quality_curve

    model = tiny_models[("f64", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], path="eager", centroid_dtype="float64")
    h = torch.randn(200, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3
    rows = quality_curve(head, head_weight(model), h, [1, 2, 4, 8, 17], progress=False)
    assert [r["n_probes"] for r in rows] == [1, 2, 4, 8, 17]
    for r in rows:
        assert r["agreement"] == r["recall_top1_reference"] == r["recall_top1_fast"]
        assert r["recall_top5_fast"] <= 1
    recalls = [r["recall_top1_reference"] for r in rows]
    assert recalls == sorted(recalls) and recalls[-1] == 1.0 and recalls[0] < 1.0
    assert rows[-1]["recall_top5_fast"] == 1.0


def test_hidden_states_file_is_reused_only_for_the_same_inputs(tmp_path, tok):
    from types import SimpleNamespace

    from thesis_lib.bench.modelbench import cached_hidden_states
    from thesis_lib.bench.prompts import Prompt
    from thesis_lib.models import tiny

    lm = SimpleNamespace(model=tiny.tiny_model(seed=0), tokenizer=tok, vocab_limit=TINY_VOCAB, eos_ids=[258],
                         info={}, spec="tiny")
    prompts = [Prompt("a", "x", "hello"), Prompt("b", "y", "world")]
    path = tmp_path / "states.pt"
    first, reused = cached_hidden_states(lm, prompts, str(path), max_new_tokens=5, progress=False)
    assert not reused and path.is_file()
    assert first.states.shape[1] == 64 and 2 <= first.states.shape[0] <= 10
    assert first.question_ids[0] == "a" and first.question_ids[-1] == "b"
    again, reused = cached_hidden_states(lm, prompts, str(path), max_new_tokens=5, progress=False)
    assert reused and torch.equal(again.states, first.states) and again.categories == first.categories
    with pytest.raises(ConfigError, match="another model, prompt set or length"):
        cached_hidden_states(lm, prompts[:1], str(path), max_new_tokens=5, progress=False)


def test_only_a_compile_failure_demotes_the_auto_path(tiny_models, tiny_clusterings, monkeypatch, caplog):
    """A caller's error (here a hidden state of the wrong width) is raised and leaves the compiled path in
    place; a failing compiler demotes an "auto" head to eager once, loudly, and the head says why. (The kernel's
    greedy head off, as on a CPU where the kernel module does not build.)"""
    from thesis_lib.heads import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "ENABLED", False)
    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=3, path="auto", centroid_dtype="float32")
    h = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    want = head(h)
    assert head.active_path == "compiled"
    with pytest.raises(RuntimeError):
        head(torch.randn(2, 63))
    assert head.path == "auto" and head.compile_error is None
    assert torch.equal(head(h), want) and head.active_path == "compiled"

    def broken_compiler(fn, **kw):
        def call(*a):
            raise RuntimeError("CppCompileError: no C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken_compiler)
    fresh = _head(model, tiny_clusterings[17], n_probes=3, path="auto", centroid_dtype="float32")
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        assert torch.equal(fresh(h), want)
    assert fresh.path == "eager" and fresh.active_path == "eager" and "no C++ compiler" in fresh.compile_error

    def silent_compiler(fn, **kw):  # a failure without a message: the head records its type and nothing invented
        def call(*a):
            raise MemoryError()
        return call

    monkeypatch.setattr(torch, "compile", silent_compiler)
    quiet = _head(model, tiny_clusterings[17], n_probes=3, path="auto", centroid_dtype="float32")
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        assert torch.equal(quiet(h), want)
    assert quiet.compile_error == "MemoryError: "
    monkeypatch.setattr(torch, "compile", broken_compiler)
    said = _head(model, tiny_clusterings[17], n_probes=3, path="auto", centroid_dtype="float32")
    caplog.clear()
    with caplog.at_level("WARNING", logger="thesis_lib"), pytest.warns(RuntimeWarning, match="compile failed") as warned:
        said.greedy_confidence(h)
    assert [w.filename for w in warned] == [__file__]  # the warning points at the caller's line, not the head's
    assert [r.name for r in caplog.records if "torch.compile failed" in r.getMessage()] == ["thesis_lib"]
    strict = _head(model, tiny_clusterings[17], n_probes=3, path="compiled", centroid_dtype="float32")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        strict(h)


def test_a_sweep_past_the_recompile_limit_stays_compiled(tiny_models, tiny_clusterings):
    """Each probe count compiles once; past dynamo's recompile limit the head recompiles instead of running
    uncompiled code behind the compiled path's name."""
    from torch._dynamo.utils import counters

    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=1, path="compiled", centroid_dtype="float32")
    ref = _head(model, tiny_clusterings[17], n_probes=1, path="reference")
    flashhead.compile_settings()  # what the head's first compile applies; then a lower limit for this test
    cfg = torch._dynamo.config
    assert cfg.fail_on_recompile_limit_hit
    limit = cfg.recompile_limit  # set and restored by hand: monkeypatch's undo deletes a config entry
    cfg.recompile_limit = 2
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    counters.clear()
    try:
        for p in (1, 2, 3, 4, 5):
            head.with_probes(p)
            ref.with_probes(p)
            assert torch.equal(head(h), ref(h)) and head.active_path == "compiled"
    finally:
        cfg.recompile_limit = limit
    assert head.recompile_resets >= 1
    assert counters["stats"]["unique_graphs"] >= 5  # every probe count ran a compiled graph


@pytest.mark.skipif(importlib.util.find_spec("flash_head") is None,
                    reason="Embedl's flash-head is not installed (optional extra `embedl`; never installed by default)")
def test_embedl_s_head_picks_our_tokens_on_the_same_assets(tiny_models, tiny_clusterings):
    """Embedl's FlashHead built from our clustering: with the same (float32) cluster ranking it picks our token
    on every state but exact ties and rows past the tokenizer (the tiny model's padding rows are random; Embedl's
    head scores them, ours never does), and the comparison classifies every difference."""
    from thesis_studies.peers import embedl as embedl_peer

    model = tiny_models[("f32", "qwen2", "target")]
    w = model.get_output_embeddings().weight.detach()
    head = FlashHead(w, tiny_clusterings[17], n_probes=3, special_ids=[258], vocab_limit=TINY_VOCAB, path="eager",
                     centroid_dtype="float32")
    states = torch.randn(48, 64, generator=torch.Generator().manual_seed(4)) * 3
    doc = embedl_peer.compare(head, w, states, reps=1, progress=False)
    assert doc["installed"] and doc["states"] == 48
    assert doc["other"] == 0 and doc["ranking"] == 0 and doc["padding"] > 0
    assert doc["same"] + doc["ties"] + doc["padding"] == 48
    assert all(d["embedl"] >= TINY_VOCAB for d in doc["differences"] if d["kind"] == "padding")
    assert doc["latency"]["ours"]["n"] == doc["latency"]["embedl"]["n"] == 48


def test_the_bf16_cluster_ranking_differs_from_float32_only_at_bf16_ties(tiny_models, tiny_clusterings):
    """The default fast path ranks clusters in bfloat16 (on CPUs with native bf16, and on GPUs). Against the
    float32 reference: a cluster that one ranking probes and the other does not scores, in float32, within
    bfloat16's rounding of the p-th best cluster; and given its clusters, the fast head's token is the exact
    float32 argmax over their candidates (the second stage is exact)."""
    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=4, path="eager", centroid_dtype="bfloat16")
    h = torch.randn(400, 64, generator=torch.Generator().manual_seed(9)) * 4
    fast = head(h)
    ranked_fast = head.top_clusters(h, reference=False)
    ranked_ref = head.top_clusters(h, reference=True)
    scores = h.float() @ head.unit_centroids.T  # float32 cluster scores
    differ = 0
    for i in range(h.shape[0]):
        a, b = set(ranked_fast[i].tolist()), set(ranked_ref[i].tolist())
        if a != b:
            differ += 1
            pth = float(torch.sort(scores[i], descending=True).values[3])
            for c in a ^ b:  # bf16 keeps about 3 significant digits: 2^-8 relative, twice for product and sum
                assert abs(float(scores[i, c]) - pth) <= 2 ** -7 * max(1.0, abs(pth)) * 4, (i, c)
        exact, ids = head._candidate_scores(h[i], ranked_fast[i])
        best = exact.max()
        assert int(fast[i]) == int(ids[exact == best].min()), i
    assert 0 < differ < 0.1 * h.shape[0]  # exercised (seeded), and a precision effect, not another ranking


def test_the_triton_path_is_refused_where_it_cannot_run():
    """Asking for the GPU kernel on a CPU is a clear error at construction, not a crash at the first token."""
    import torch

    from thesis_lib.errors import ConfigError
    from thesis_lib.heads.clustering import Clustering
    from thesis_lib.heads.flashhead import FlashHead

    w = torch.randn(64, 32)
    clustering = Clustering(centroids=torch.randn(4, 32), assignments=torch.arange(64) % 4, info={})
    with pytest.raises(ConfigError, match="triton"):
        FlashHead(w, clustering, n_probes=2, path="triton")
    assert FlashHead(w, clustering, n_probes=2, path="auto")(torch.randn(1, 32)).shape == (1,)  # auto: CPU path


# ----------------------------------------------------------------------------------------- 16-bit heads


def _two_near_tokens(d: int = 64):
    """A bfloat16 head of 8 tokens in 2 clusters where tokens 1 (cluster 0) and 3 (cluster 1) have logits that
    round to the same bf16 value, 3's larger by 2^-7 unrounded (bf16's spacing at 20 is 1/8)."""
    from thesis_lib.heads.clustering import Clustering

    w = torch.zeros(8, d)
    w[:, 2] = torch.linspace(-1, 1, 8)  # the other tokens well below
    w[1, 0], w[3, 0], w[3, 1] = 20.0, 20.0, 2.0 ** -7
    w = w.to(torch.bfloat16)
    h = torch.zeros(1, d, dtype=torch.bfloat16)
    h[0, 0], h[0, 1] = 1.0, 1.0
    assign = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    centroids = torch.zeros(2, d).index_add_(0, assign, w.float()) / 4
    return w, h, Clustering(centroids=centroids, assignments=assign, info={})


@pytest.mark.parametrize("path", ["eager", "compiled", "reference", KERNEL])
def test_a_bf16_flashhead_scores_its_candidates_unrounded(path):
    """Two candidates whose bf16 logits tie: every FlashHead path picks the larger unrounded one, as the refined
    dense head does; the rounded logits would give the lower id (checked here, so the case is a real tie)."""
    w, h, clus = _two_near_tokens()
    rounded = torch.nn.functional.linear(h, w)
    assert float(rounded[0, 1]) == float(rounded[0, 3]) and int(DenseGreedyHead(w, refine=False)(h)) == 1
    assert int(DenseGreedyHead(w)(h)) == 3
    head = FlashHead(w, clus, n_probes=2, path=path)
    assert int(head(h)) == 3 and head.active_path == path
    assert int(head.greedy_confidence(h)[0]) == 3  # the fast path's (reference: eager)


def test_bf16_adaptive_and_truncated_heads_score_their_candidates_unrounded():
    from thesis_studies.beyond.adaptive import AdaptiveFlashHead
    from thesis_studies.beyond.truncated import TruncatedHead

    w, h, clus = _two_near_tokens()
    flash = FlashHead(w, clus, n_probes=2, path="eager")
    assert int(AdaptiveFlashHead(flash, margin=100.0, min_probes=2)(h)) == 3
    assert int(TruncatedHead(w, [1, 3, 5])(h)) == 3
    assert int(TruncatedHead(w, [1, 5])(h)) == 1  # without token 3 the refinement must not invent it


def test_a_bf16_flashhead_with_every_probe_is_the_refined_dense_head(tiny_models, tiny_clusterings):
    """The tiny target's head in bf16, 600 bf16 hidden states: with all 17 clusters probed, the fast head
    (compiled) and the reference give the refined dense head's token on every state, and at 4 probes the fast
    head gives the reference's. The states include near ties of the rounded logits (counted: the check would
    pass vacuously without them)."""
    w = head_weight(tiny_models[("f32", "qwen2", "target")]).to(torch.bfloat16)
    h = (torch.randn(600, 64, generator=torch.Generator().manual_seed(11)) * 3).to(torch.bfloat16)
    dense = DenseGreedyHead(w, TINY_VOCAB)
    want = dense(h)
    rounded = torch.nn.functional.linear(h, w)[:, :TINY_VOCAB]
    top2 = rounded.float().topk(2, dim=-1).values
    assert int((top2[:, 0] == top2[:, 1]).sum()) >= 3  # rounded ties are present in this sample
    assert not torch.equal(rounded.argmax(dim=-1), want)  # and the refinement decides some of them
    for path in ("compiled", "reference", *KERNEL_HERE):
        head = FlashHead(w, tiny_clusterings[17], n_probes=17, special_ids=SPECIALS, vocab_limit=TINY_VOCAB,
                         path=path)
        assert torch.equal(head(h), want), path
    fast = FlashHead(w, tiny_clusterings[17], n_probes=4, special_ids=SPECIALS, vocab_limit=TINY_VOCAB,
                     path="compiled", centroid_dtype="float32")
    assert torch.equal(fast(h), fast.reference(h))


def _rankings_that_bf16_reverses() -> tuple[torch.Tensor, torch.Tensor]:
    """Two unit centroids and a hidden state whose float32 ranking puts cluster 0 first and whose bf16 ranking puts
    cluster 1 first, on every machine (the reversal is made by rounding the centroids, not by the product). Where
    ``h`` is +1 (32 slots) cluster 0 sits just below a bf16 midpoint in every slot (each rounds down by about half a
    step) and cluster 1 half a step above the grid in half its slots (those round up) and on the grid in the rest:
    in float32 cluster 0 leads by about 8 steps, in bf16 cluster 1 leads by 16. Where ``h`` is -1 (32 slots, 1/16 in
    both) the sums come back near 0, so the product's own rounding is far finer than the gap; one slot where
    ``h`` is 0 makes each centroid unit length."""
    g, step, eps = 2.0 ** -4, 2.0 ** -11, 2.0 ** -18  # on [1/16, 1/8) bf16 steps by 2^-11
    ahead = torch.full((32,), g + step / 2 - eps, dtype=torch.float64)
    behind = torch.tensor([g + step / 2 + eps, g] * 16, dtype=torch.float64)
    rows = [torch.cat([half, torch.full((32,), g, dtype=torch.float64)]) for half in (ahead, behind)]
    rows = [torch.cat([r, (1 - r.square().sum()).sqrt()[None]]) for r in rows]
    h = torch.cat([torch.ones(32), -torch.ones(32), torch.zeros(1)])
    return torch.stack(rows).float(), h


def test_candidate_ids_are_the_clusters_the_fast_head_probes():
    """The candidates are those of the fast path's (bf16) cluster ranking, so every token the fast head picks is
    among them, also where the float32 ranking probes another cluster and misses it; on constructed centroids whose
    two rankings differ, with the bf16 ranking forced (``auto`` ranks in float32 where the CPU has no fast bf16)."""
    from thesis_lib.heads.clustering import Clustering

    centroids, h = _rankings_that_bf16_reverses()
    exact = centroids.double() @ h.double()
    fast = (centroids.bfloat16().double() @ h.double())
    assert exact[0] > exact[1] and fast[1] > fast[0]  # the construction does what its docstring says
    vocab = 16
    g = torch.Generator().manual_seed(0)
    head = FlashHead(torch.randn(vocab, h.numel(), generator=g).bfloat16(),
                     Clustering(centroids=torch.cat([centroids, -centroids]), assignments=torch.arange(vocab) % 4,
                                info={}), n_probes=1, path="eager", centroid_dtype=torch.bfloat16)
    hidden = h[None].bfloat16()
    assert head.top_clusters(hidden, reference=False).tolist() == [[1]]
    assert head.top_clusters(hidden, reference=True).tolist() == [[0]]
    token = head(hidden).tolist()[0]
    assert token % 4 == 1 and token in head.candidate_ids(hidden)[0].tolist()
    assert token not in head.candidate_ids(hidden, reference=True)[0].tolist()


@pytest.mark.parametrize("path", ["eager", KERNEL])
def test_a_special_token_is_scored_as_exactly_as_the_clusters_rows(path):
    """Special tokens are scored in float32 like every candidate: a special whose exact logit (1 + 2^-9) beats a
    regular token's (1 + 2^-10) by less than a bf16 rounding step wins, though rounded to bf16 it would lose (rows
    of two values: shorter than the kernel's lanes)."""
    from thesis_lib.heads.clustering import Clustering

    vocab, clusters = 64, 8
    w = torch.full((vocab, 2), -1.0)
    w[10] = torch.tensor([1.0, 2.0 ** -10])  # a regular token: 1.0009765625
    w[20] = torch.tensor([1.0, 2.0 ** -9])  # the special token: 1.001953125, which bf16 rounds to 1.0
    head = FlashHead(w.bfloat16(), Clustering(centroids=torch.ones(clusters, 2), assignments=torch.arange(vocab) % clusters,
                                              info={}), n_probes=clusters, special_ids=(20,), path=path)
    h = torch.tensor([[1.0, 1.0]]).bfloat16()
    assert torch.tensor(1.001953125).bfloat16().item() == 1.0  # the rounding the head must not do
    assert head(h).tolist() == [20] and head.active_path == path
    assert head.greedy_confidence(h)[0].tolist() == [20]


@pytest.mark.parametrize("path", ["reference", "eager", KERNEL])  # compiled: held to these by the tests above
def test_partial_probes_rank_clusters_as_a_brute_force_cosine_search_does(tiny_models, tiny_clusterings, path):
    """An independent reference, written here without the head's code: the cosine of the hidden state to every
    cluster's mean (numpy, float64), the ``p`` largest probed, and the greedy token the argmax of ``w . h`` over the
    tokens assigned to those clusters and the special tokens. At 1, 2, 4 and 8 of 17 clusters, on 40 random
    hidden states, every path's token is that one; a head that ranked by the raw means' dot product, or probed
    the wrong end of the ranking, would differ."""
    import numpy as np

    model = tiny_models[("f64", "qwen2", "target")]
    clus = tiny_clusterings[17]
    w = head_weight(model).double().numpy()[:TINY_VOCAB]
    means = clus.centroids.double().numpy()
    assign = clus.assignments.numpy()[:TINY_VOCAB]
    g = torch.Generator().manual_seed(7)
    hs = torch.randn(40, w.shape[1], generator=g, dtype=torch.float64)
    dtype = torch.float32 if path == "kernel" else torch.float64  # the kernel reads bf16 or float32
    for p in (1, 2, 4, 8):
        head = FlashHead(head_weight(model).to(dtype), clus, n_probes=p, special_ids=SPECIALS, vocab_limit=TINY_VOCAB,
                         path=path, centroid_dtype=dtype)
        got = head(hs.to(dtype)).tolist()
        for h, token in zip(hs.numpy(), got):
            cosine = means @ h / (np.linalg.norm(means, axis=1) * np.linalg.norm(h))
            probed = set(np.argsort(-cosine)[:p].tolist())
            candidates = [t for t in range(TINY_VOCAB) if assign[t] in probed or t in SPECIALS]
            want = candidates[int(np.argmax(w[candidates] @ h))]
            assert token == want, (path, p)


def test_embedl_s_default_probe_count_is_a_sixteenth_of_the_clusters_in_whole_probes():
    assert [flashhead.default_probes(c) for c in (100, 9496, 17, 15)] == [6, 593, 1, 1]
    assert all(type(flashhead.default_probes(c)) is int for c in (100, 15))


def test_a_head_s_bias_is_added_to_its_rows_scores(tiny_models, tiny_clusterings):
    """With every cluster probed FlashHead is the dense head, bias included: a bias that lifts one token above the
    rest makes it the answer of both (and without it neither picks it)."""
    model = tiny_models[("f64", "qwen2", "target")]
    w = head_weight(model)
    h = torch.randn(8, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 3
    bias = torch.zeros(w.shape[0], dtype=torch.float64)
    bias[200] = 1e3
    plain = FlashHead(w, tiny_clusterings[17], n_probes=17, path="reference", centroid_dtype="float64")
    biased = FlashHead(w, tiny_clusterings[17], n_probes=17, path="reference", centroid_dtype="float64", bias=bias)
    dense = DenseGreedyHead(w, bias=bias)
    assert (biased(h) == 200).all() and torch.equal(biased(h), dense(h)) and not (plain(h) == 200).any()


def test_the_probed_clusters_at_a_count_asked_for(tiny_models, tiny_clusterings):
    """top_clusters with an explicit count ranks that many, the same as a head set to that count; a count past
    the clusters is refused."""
    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=2, path="eager", centroid_dtype="float32")
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    three = head.top_clusters(h, 3)
    assert three.shape == (3, 3) and torch.equal(three[:, :2], head.top_clusters(h))
    with pytest.raises(ConfigError):
        head.top_clusters(h, 18)


@NEEDS_KERNEL
def test_the_kernel_ranks_clusters_in_bfloat16_and_breaks_their_ties_to_the_lower_index(tiny_models, tiny_clusterings):
    """The CPU kernel's bfloat16 ranking, checked against one written here: each cluster's score the float64 sum of
    bf16(h) times its bf16 unit centroid, rounded to bf16; the p best, equal scores to the lower cluster index; the
    token the exact float32 argmax over those clusters' rows and the specials. On 400 states (seeded) the two agree
    on every one, and on some of them the opposite tie rule would have given another token (counted)."""
    model = tiny_models[("f32", "qwen2", "target")]
    w = head_weight(model).to(torch.bfloat16)
    head = FlashHead(w, tiny_clusterings[17], n_probes=4, special_ids=SPECIALS, vocab_limit=TINY_VOCAB, path="kernel",
                     centroid_dtype="bfloat16")
    h = torch.randn(400, 64, generator=torch.Generator().manual_seed(12)) * 4
    got = head(h)
    assert head.active_path == "kernel"
    cen = head.fast_centroids.double()
    scores = (h.to(torch.bfloat16).double() @ cen.T).to(torch.bfloat16).double()  # [400, 17]
    def token(i, order):
        exact, ids = head._candidate_scores(h[i], torch.tensor(order[:4]))
        return int(ids[exact == exact.max()].min())

    decided_by_index = 0
    for i in range(h.shape[0]):
        lower_first = sorted(range(17), key=lambda c: (-float(scores[i, c]), c))
        assert int(got[i]) == token(i, lower_first), i
        decided_by_index += token(i, sorted(range(17), key=lambda c: (-float(scores[i, c]), -c))) != int(got[i])
    assert decided_by_index >= 1  # states whose token the other tie rule would change (the rule is exercised)


def test_the_kernel_path_is_refused_where_it_cannot_run(tiny_models, tiny_clusterings):
    """float64 rows (or a head off the CPU) are no kernel's: a clear error at construction."""
    with pytest.raises(ConfigError, match="kernel"):
        _head(tiny_models[("f64", "qwen2", "target")], tiny_clusterings[17], n_probes=4, path="kernel",
              centroid_dtype="float64")


@NEEDS_KERNEL
def test_auto_takes_the_kernel_for_greedy_calls_on_a_cpu_and_compiles_the_rest(tiny_models, tiny_clusterings):
    """On a CPU where the kernel module builds, an "auto" head's greedy call runs in the kernel and its confidence
    call compiled, both giving the same tokens; with the kernel switched off the greedy call compiles too."""
    from thesis_lib.heads import cpu_kernels

    head = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=4, path="auto",
                 centroid_dtype="float32")
    h = torch.randn(32, 64, generator=torch.Generator().manual_seed(4)) * 3
    tokens = head(h)
    assert head.active_path == "kernel"
    assert torch.equal(head.greedy_confidence(h)[0], tokens) and head.active_path == "compiled"
    with cpu_kernels.enabled(False):
        assert torch.equal(head(h), tokens) and head.active_path == "compiled"
    assert torch.equal(tokens, head.reference(h))


@pytest.mark.skipif(not wo.available() or not wo.kernel().avx512_path(),
                    reason="a CPU without AVX-512 runs the FlashHead kernel's AVX2 path only: nothing to compare it with")
def test_the_kernel_computes_alike_on_its_two_paths(tiny_models, tiny_clusterings, monkeypatch):
    """The AVX2 path (forced) sums each dot product in the same 16 lanes as the AVX-512 path: the same tokens."""
    head = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=3, path="kernel")
    h = torch.randn(200, 64, generator=torch.Generator().manual_seed(5)) * 3
    wide = head(h)
    monkeypatch.setenv(wo.FORCED_PATH_ENV, "avx2")
    assert torch.equal(head(h), wide)


@NEEDS_KERNEL
def test_the_kernel_refuses_bad_input(tiny_models, tiny_clusterings):
    """A NaN hidden state gives the sentinel, as the compiled path's argmax does; special rows that do not match the
    special ids are refused, not read past."""
    from thesis_lib.heads import cpu_kernels

    head = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=3, path="kernel")
    h = torch.randn(200, 64, generator=torch.Generator().manual_seed(5)) * 3
    wide = head(h)
    bad = h[:2].clone()
    bad[0, 5] = float("nan")
    compiled = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=3, path="compiled")
    assert head(bad).tolist() == compiled(bad).tolist() == [head.vocab_size, int(wide[1])]
    args = list(head.fast_arguments())
    args[4] = args[4][:1]  # one special row for three special ids
    with pytest.raises(RuntimeError, match="shapes"):
        cpu_kernels.greedy(h[:1], *args)


@NEEDS_KERNEL
def test_a_failing_compiler_leaves_the_greedy_call_on_the_kernel(tiny_models, tiny_clusterings, monkeypatch):
    """The kernel is no product of torch.compile: when compiling the confidence call fails, an "auto" head demotes
    that call to eager, and its greedy calls stay on the kernel."""
    def broken_compiler(fn, **kw):
        def call(*a):
            raise RuntimeError("CppCompileError: no C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken_compiler)
    head = _head(tiny_models[("f32", "qwen2", "target")], tiny_clusterings[17], n_probes=3, path="auto",
                 centroid_dtype="float32")
    h = torch.randn(8, 64, generator=torch.Generator().manual_seed(6)) * 3
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        tokens = head.greedy_confidence(h)[0]
    assert head.path == "eager" and head.active_path == "eager"
    assert torch.equal(head(h), tokens) and head.active_path == "kernel"


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_a_ranking_s_first_token_is_the_greedy_head_s(tiny_models, tiny_clusterings, path):
    """``top`` ranks the fast path's own candidates: with bfloat16 cluster ranking, whose probed clusters differ
    from float32's on some states, its first token is the greedy call's and its probability the confidence call's
    on every state (seed-6 survivor: the reference's float32 ranking taken for every path)."""
    model = tiny_models[("f32", "qwen2", "target")]
    head = _head(model, tiny_clusterings[17], n_probes=4, path=path, centroid_dtype="bfloat16")
    h = torch.randn(400, 64, generator=torch.Generator().manual_seed(9)) * 4
    ids, logp = head.top(h, 2)
    assert torch.equal(ids[:, 0], head(h))
    # and its probabilities are the softmax over those same candidates, the confidence call's
    torch.testing.assert_close(logp[:, 0].exp(), head.greedy_confidence(h)[1], rtol=1e-5, atol=0)
    assert not torch.equal(head.top_clusters(h, reference=False).sort(-1).values,
                           head.top_clusters(h, reference=True).sort(-1).values)  # the rankings do differ here


def test_a_sample_with_probability_past_the_vocabulary_is_refused():
    """A sampled distribution that puts probability on a padding row cannot be spread over the vocabulary: the
    error names the vocabulary size (seed-6 survivor: an error without its message)."""
    sample = flashhead.FlashHeadSample(token=torch.tensor(1), candidates=torch.tensor([1, 300]),
                                       probs=torch.tensor([0.5, 0.5]), clusters=torch.tensor([0]))
    with pytest.raises(ValueError, match="vocab_size=272 has probability > 0"):
        sample.dense(272)
    assert sample.dense(400)[[1, 300]].tolist() == [0.5, 0.5]


@NEEDS_KERNEL
@pytest.mark.parametrize("hidden", [24, 100])
@pytest.mark.parametrize("rows", ["bfloat16", "float32"])
def test_the_kernel_sums_the_tail_past_its_sixteen_lanes_on_both_paths(hidden, rows, monkeypatch):
    """Hidden sizes that are no multiple of the kernel's 16 lanes (one block and 8 over; six and 4 over): its tokens
    equal the plain float32 computation's on every state, on the CPU's path and on the AVX2 path forced. A kernel
    that dropped the tail, or read past it, would score other tokens on many of the 300 states."""
    from thesis_lib.heads.clustering import random_clustering

    g = torch.Generator().manual_seed(hidden)
    weight = torch.randn(320, hidden, generator=g).to(getattr(torch, rows))
    head = FlashHead(weight, random_clustering(320, hidden, 20, seed=1), n_probes=4, special_ids=[317, 318, 319],
                     vocab_limit=320, path="kernel", centroid_dtype="float32")
    h = torch.randn(300, hidden, generator=g) * 2
    want = head.reference(h)
    assert torch.equal(head(h), want)
    monkeypatch.setenv(wo.FORCED_PATH_ENV, "avx2")
    assert torch.equal(head(h), want)


@pytest.mark.parametrize("native", [True, False])
def test_auto_centroids_are_bfloat16_where_the_cpu_multiplies_it_natively(tiny_models, tiny_clusterings, monkeypatch,
                                                                         native):
    """``centroid_dtype="auto"`` ranks clusters in bfloat16 on a CPU with native bf16 dot products and in float32
    elsewhere (a bf16 product emulated in software is slower than float32); the head saves no state of its own (all
    of it is derived from the clustering and the head's rows)."""
    monkeypatch.setattr(flashhead, "fast_bf16", lambda: native)
    head = FlashHead(head_weight(tiny_models[("f32", "qwen2", "target")]), tiny_clusterings[17], vocab_limit=TINY_VOCAB)
    want = torch.bfloat16 if native else torch.float32
    assert head.centroid_dtype == want and head.fast_centroids.dtype == want
    assert not head.state_dict()


def test_the_refinement_rescores_every_row_within_two_rounding_steps_of_the_top():
    """Constructed 16-bit logits: the top row at 1.0, another at 0.988 (between one and two bfloat16 steps below,
    2^-7 and 2^-6 relative), a third at 0.5. The second's unrounded score (1.01) is the larger, so it wins; the
    third, far below, is not re-scored even where its unrounded score would be the largest."""
    from thesis_lib.heads.dense import refined_argmax

    weight = torch.eye(4)
    logits = torch.tensor([[1.0, 0.988, 0.5, 0.0]], dtype=torch.bfloat16)
    assert refined_argmax(weight, None, torch.tensor([1.0, 1.01, 0.0, 0.0]), logits).tolist() == [1]
    assert refined_argmax(weight, None, torch.tensor([1.0, 0.99, 0.0, 0.0]), logits).tolist() == [0]
    assert refined_argmax(weight, None, torch.tensor([1.0, 0.99, 5.0, 0.0]), logits).tolist() == [0]
    bias = torch.tensor([0.0, 0.02, 0.0, 0.0])  # a bias joins the unrounded score
    assert refined_argmax(weight, bias, torch.tensor([1.0, 0.99, 0.0, 0.0]), logits).tolist() == [1]


def test_a_dense_head_adds_its_output_layer_s_bias_before_the_argmax():
    """An output layer with a bias: the bias joins every logit, so the row it lifts wins, taken from the layer by
    ``from_model`` and cut with the rows at the vocabulary limit; a head given no bias adds none."""
    layer = torch.nn.Linear(3, 4, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(4, 3))
        layer.bias.copy_(torch.tensor([0.0, 2.0, 0.0, 9.0]))

    class Model:
        def get_output_embeddings(self):
            return layer

    h = torch.tensor([[1.0, 0.0, 0.5]])
    assert DenseGreedyHead.from_model(Model())(h).tolist() == [3]
    assert DenseGreedyHead.from_model(Model(), vocab_limit=3)(h).tolist() == [1]  # row 3 and its bias cut off
    assert DenseGreedyHead(layer.weight.detach(), 3)(h).tolist() == [0]
