"""Speculative sampling is lossless: the warp, the accept/resample rule, and the distribution of the first
tokens against target-only sampling's exact distribution (tiny models with an 8-token vocabulary)."""

import math

import pytest
import torch

from thesis_studies.sampling import distcheck
from thesis_studies.sampling import loop as sampling
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError

V = distcheck.VOCAB
PROMPT = list(distcheck.PROMPT)
# Default-suite power: an absolute error of DELTA in any sequence's probability is caught with probability
# >= 0.99 at family-wise level 1e-3 (normal approximation); `thesis-lib studies sampling-check` runs the 1 % version.
# At 0.07 (1,915 draws for case 0, 1,439 for case 1; 0.05 took twice the draws) two subtle wrong rules, a
# rejection redrawn from p instead of the residual and a token kept with probability sqrt(p/q), were rejected in
# each of the eight configurations below, at |z| 8.0 to 12.2 against a critical 4.0-4.1.
DELTA, ALPHA = 0.07, 1e-3


@pytest.fixture(scope="module")
def pair():
    return distcheck.tiny_pair(V)


def test_warp_applies_temperature_top_k_and_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, float("-inf")])
    p = sampling.Sampler(1.0).probs(logits)
    assert math.isclose(float(p.sum()), 1.0) and p[4] == 0 and p.dtype == torch.float64
    assert torch.allclose(sampling.Sampler(2.0).probs(logits), torch.softmax(logits.double() / 2, -1))
    k2 = sampling.Sampler(1.0, top_k=2).probs(logits)
    assert (k2[2:] == 0).all() and torch.allclose(k2[:2], torch.softmax(torch.tensor([3.0, 2.0]).double(), -1))
    full = torch.softmax(logits.double(), -1)  # 0.665, 0.245, 0.090, 0.033
    assert (sampling.Sampler(1.0, top_p=0.6).probs(logits) > 0).tolist() == [True, False, False, False, False]
    assert (sampling.Sampler(1.0, top_p=float(full[0]) + 0.01).probs(logits) > 0).sum() == 2
    for bad in (dict(temperature=0), dict(top_k=0), dict(top_p=1.5), dict(top_p=0)):
        with pytest.raises(ConfigError):
            sampling.Sampler(**bad).check()


def test_accept_or_resample_matches_the_rule():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert all(sampling.accept_or_resample(p, q, 0, g) is None for _ in range(200))  # p >= q: always kept
    outs = [sampling.accept_or_resample(p, q, 1, g) for _ in range(4000)]
    kept = sum(o is None for o in outs) / len(outs)
    assert abs(kept - 0.5) < 0.04  # p/q = 0.3/0.6
    assert {o for o in outs if o is not None} == {0}  # the residual max(0, p - q) has mass only on token 0
    with pytest.raises(ValueError):
        sampling.accept_or_resample(p, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), 0, g)


def test_a_token_the_target_gives_no_probability_is_never_kept(monkeypatch):
    """The rule keeps a drafted token with probability min(1, p/q), so never where p is 0, even at the lowest
    uniform draw, 0.0, which torch's float64 draw can return; a token the target gives as much as the draft is kept
    there."""
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.zeros((), dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    assert sampling.accept_or_resample(p, q, 1, g) is None
    assert sampling.accept_or_resample(p, q, 2, g) == 0  # the residual max(0, p - q) has mass on token 0 only

def test_a_seeded_run_is_reproducible(pair):
    target, draft, flash = pair
    s = sampling.Sampler(1.0)
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(7)
        d = sampling.SamplingModelDrafter(draft, s, flash_head=flash)
        runs.append(sampling.speculative_sample(ModelState(target), d, PROMPT, k=3, max_new_tokens=12, sampler=s,
                                                generator=g, schedule="deferred").tokens)
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_bad_input_fails_before_decoding(pair):
    target, draft, _ = pair
    s = sampling.Sampler(1.0)
    d = sampling.SamplingModelDrafter(draft, s)
    with pytest.raises(ConfigError):
        sampling.speculative_sample(ModelState(target), d, PROMPT, k=0, max_new_tokens=4, sampler=s)
    with pytest.raises(ConfigError, match="'pipelined'; use one of ordinary, deferred"):  # the ones it runs, named
        sampling.speculative_sample(ModelState(target), d, PROMPT, k=2, max_new_tokens=4, sampler=s, schedule="pipelined")
    with pytest.raises(ConfigError):  # the draft must warp q as the target warps p
        sampling.speculative_sample(ModelState(target), d, PROMPT, k=2, max_new_tokens=4, sampler=sampling.Sampler(0.5))


CASES = distcheck.CASES


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("draft_kind", ["dense", "flash"])
@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_speculative_sampling_has_the_target_distribution(pair, case, draft_kind, schedule):
    r = distcheck.run_case(pair, case, draft_kind, schedule, delta=DELTA, alpha=ALPHA, power=0.99)
    assert r["power"] >= 0.99 and r["impossible_draws"] == 0
    assert r["ok"], r
    assert 0.2 < r["acceptance"] < 0.95  # the draft is neither ignored nor identical: the rule is exercised


def test_the_check_catches_a_wrong_rule(pair):
    """Negative control: keeping every draft token (no rejection) gives the draft's distribution, which the
    check must reject at the same number of draws."""
    r = distcheck.run_always_accept(pair, delta=DELTA, alpha=ALPHA, power=0.99)
    assert not r["ok"] and r["max_abs_z"] > r["critical_z"]


def test_the_draws_are_the_same_in_one_process_or_several(pair):
    """The check's draws come in seeded chunks spread over processes: the same sequences and counts whichever
    process made which chunk, and other sequences under another seed."""
    kw = dict(case=1, draft_kind="flash", schedule="deferred")
    one = distcheck.draw_sequences(pair, distcheck.CHUNK + 7, seed=3, workers=1, **kw)
    two = distcheck.draw_sequences(pair, distcheck.CHUNK + 7, seed=3, workers=2, **kw)
    assert one == two and len(one[0]) == distcheck.CHUNK + 7 and 0 < one[1] < one[2]
    assert distcheck.draw_sequences(pair, distcheck.CHUNK + 7, seed=4, workers=2, **kw)[0] != one[0]


def test_draws_for_power_is_consistent_with_power_at():
    exact = {(0,): 0.5, (1,): 0.3, (2,): 0.2}
    n = distcheck.draws_for_power(exact, delta=0.01, alpha=1e-3, power=0.99)
    assert 0.99 <= distcheck.power_at(exact, n, delta=0.01, alpha=1e-3, cells=3) < 0.991
    assert distcheck.power_at(exact, n // 4, delta=0.01, alpha=1e-3) < 0.5


def test_no_rest_cell_when_nothing_is_pooled_and_power_holds_at_the_tested_cells():
    exact = {(0,): 0.5, (1,): 0.3, (2,): 0.2}  # 1 - sum(...) is 5.6e-17 in floating point
    r = distcheck.check([(0,)] * 50 + [(1,)] * 30 + [(2,)] * 20, exact)
    assert r["cells"] == 3 and r["pooled_sequences"] == 0
    skewed = {(i,): q for i, q in enumerate([0.6, 0.3, 0.09, 0.005, 0.005])}
    n = distcheck.draws_for_power(skewed, delta=0.01)
    r = distcheck.check([(0,)] * n, skewed)  # the cells the check tests at n draws
    assert distcheck.power_at(skewed, n, delta=0.01, cells=r["cells"]) >= 0.99


def test_a_prompt_is_warped_at_its_last_position_only(pair, monkeypatch):
    """Sampling warps (float64 softmax, top-k/top-p sorts) the distribution it draws from and no other: one row
    for the prompt's prefill however long the prompt, as greedy decoding scores one."""
    target, draft, _ = pair
    rows = []
    real = sampling.Sampler.probs
    monkeypatch.setattr(sampling.Sampler, "probs", lambda self, x: rows.append(x.shape[0] if x.dim() == 2 else 1)
                        or real(self, x))
    s = sampling.Sampler(1.0)
    long_prompt = PROMPT * 6
    sampling.sample_generate(ModelState(target), long_prompt, max_new_tokens=3, sampler=s,
                             generator=torch.Generator().manual_seed(0))
    assert rows == [1, 1, 1]  # the prefill's and two steps'
    # the one row is the last position's: the distribution a full prefill gives after the prompt's last token
    head = sampling.DenseGreedyHead.from_model(target, None)
    one = sampling.target_probs(ModelState(target), head, long_prompt, s, last_only=True)
    every = sampling.target_probs(ModelState(target), head, long_prompt, s)
    assert one.shape[0] == 1 and torch.allclose(one[0], every[-1], rtol=1e-6, atol=1e-9)  # 1-row products round apart
    assert not torch.allclose(one[0], every[0], rtol=1e-3)  # and it is not the first position's
    rows.clear()
    d = sampling.SamplingModelDrafter(draft, s)
    sampling.speculative_sample(ModelState(target), d, long_prompt, k=2, max_new_tokens=2, sampler=s,
                                generator=torch.Generator().manual_seed(0), schedule="deferred")
    assert max(rows) <= 3 and rows[0] == 1  # the target's prefill: one row; later, blocks of at most K + 1


def test_an_empty_block_keeps_what_the_draft_has_not_seen(pair):
    """propose(0) drafts nothing and leaves the prompt pending: the next block is the one a fresh draft proposes
    (before, the pending prompt was dropped, and the next block was drafted from an empty cache)."""
    _, draft, flash = pair
    s = sampling.Sampler(1.0)
    for head in (None, flash):
        fresh = sampling.SamplingModelDrafter(draft, s, flash_head=head)
        fresh.begin(PROMPT)
        want = fresh.propose(3, torch.Generator().manual_seed(3))
        d = sampling.SamplingModelDrafter(draft, s, flash_head=head)
        d.begin(PROMPT)
        assert d.propose(0, torch.Generator().manual_seed(3)) == ([], [])
        got = d.propose(3, torch.Generator().manual_seed(3))
        assert got[0] == want[0] and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("schedule, n, k, rounds, verify, append, tail", [
    # the draft is the target itself, so p = q and every proposal is kept: the counts follow from n and k alone
    ("ordinary", 12, 3, [3, 3, 2], 3, 3, 0),  # appends: the first token, then after every round but the last
    ("deferred", 12, 3, [3, 3, 2], 3, 0, 0),  # the final token rides in the next verify forward instead
    ("ordinary", 7, 4, [4], 1, 2, 1),  # one token left after the round: the target already knows it
    ("deferred", 7, 4, [4], 1, 1, 1),  # ... where the deferred schedule appends it on its own
    ("ordinary", 6, 4, [4], 1, 1, 0),
])
def test_sampling_counts_its_rounds_verifies_appends_and_tail(pair, schedule, n, k, rounds, verify, append, tail):
    target, _, _ = pair
    s = sampling.Sampler(1.0)
    g = torch.Generator().manual_seed(3)
    d = sampling.SamplingModelDrafter(target, s)
    gen = sampling.speculative_sample(ModelState(target), d, PROMPT, k=k, max_new_tokens=n, sampler=s, generator=g,
                                      schedule=schedule)
    st = gen.stats
    assert all(isinstance(t, int) and 0 <= t < V for t in gen.tokens)  # the tail's token too
    assert st.drafted == rounds and st.accepted == rounds and st.emitted == [r + 1 for r in rounds]
    assert (st.verify_calls, st.append_calls, st.skipped, st.tail_tokens, st.new_tokens) == (verify, append, 0, tail, n)
    assert (st.k, st.mode) == (k, f"{d.name}_{schedule}_sample")


def test_each_sampling_mode_runs_the_loop_draft_and_warp_it_names(pair, tok):
    """``sample_baseline`` is target-only sampling, recorded as the sampling baseline (seed-6 survivor: a mode of
    None); ``sample_dense`` and ``sample_flash`` are speculative sampling with that draft, deferred, at the runner's
    K; all draw with the runner's warp: at top_k=1 it leaves only the argmax, so every mode gives target-only greedy's
    tokens. A mode naming no sampling draft, or the FlashHead draft without its head, is refused by name."""
    from thesis_lib.bench.runner import Runner
    from thesis_lib.decoding.greedy import greedy_generate
    from thesis_lib.models.loading import LoadedModel

    target, draft, flash = pair
    t, d = (LoadedModel(spec="tiny", model=m, tokenizer=tok, path=None, device="cpu", dtype="float32")
            for m in (target, draft))
    argmax = sampling.Sampler(1.0, top_k=1)
    runner = Runner(t, d, k=3, max_new_tokens=8, flash_head=flash, sampler=argmax)
    greedy = greedy_generate(ModelState(target), PROMPT, max_new_tokens=8).tokens
    named = {"sample_baseline": ("baseline_sample", 0), "sample_dense": ("dense_deferred_sample", 3),
             "sample_flash": ("flash_deferred_sample", 3)}
    for mode, (recorded, k) in named.items():
        g = runner.run(mode, PROMPT)
        assert (g.stats.mode, g.stats.k, g.tokens) == (recorded, k, greedy), mode
    with pytest.raises(ConfigError, match="Unknown mode 'sample_shared'"):
        runner.run("sample_shared", PROMPT)
    with pytest.raises(ConfigError, match="mode sample_flash needs a FlashHead head"):
        Runner(t, d, k=3, max_new_tokens=8, sampler=argmax).run("sample_flash", PROMPT)


def test_the_sampler_takes_the_edges_of_its_ranges_and_refuses_past_them():
    """top_k = 1 and top_p = 1 are settings (the greedy token only; the whole distribution); temperature must be a
    finite number above 0, top_k a whole number of at least one, top_p in (0, 1]: each refused by its name."""
    logits = torch.tensor([3.0, 2.0, 1.0])
    assert sampling.Sampler(1.0, top_k=1).check().probs(logits).tolist() == [1.0, 0.0, 0.0]
    assert torch.allclose(sampling.Sampler(1.0, top_p=1).check().probs(logits), torch.softmax(logits.double(), -1))
    assert sampling.Sampler(0.01).check().temperature == 0.01
    for bad, message in ((dict(temperature=float("inf")), r"^temperature must be a finite number > 0"),
                         (dict(temperature=-1.0), r"^temperature must be a finite number > 0.*got -1\.0"),
                         (dict(temperature="1"), r"^temperature must be"),
                         (dict(top_k=0), r"^top_k must be an integer >= 1 or None, got 0\.$"),
                         (dict(top_k=2.0), r"^top_k must be an integer >= 1 or None, got 2\.0\.$"),
                         (dict(top_p=1.01), r"^top_p must be in \(0, 1\] or None, got 1\.01\.$"),
                         (dict(top_p=0.0), r"^top_p must be in \(0, 1\] or None, got 0\.0\.$"),
                         (dict(top_p="0.5"), r"^top_p must be in")):
        with pytest.raises(ConfigError, match=message):
            sampling.Sampler(**bad).check()


def test_target_only_sampling_draws_only_below_the_target_s_vocabulary_limit(pair):
    """A target whose head stops at a vocabulary limit (a tokenizer smaller than the embedding) never draws a row past
    it: at temperature 50, close to uniform, 60 draws would hold several of the 4 rows past the limit otherwise."""
    target, _, _ = pair
    got = sampling.sample_generate(ModelState(target, vocab_limit=V - 4), PROMPT, max_new_tokens=60,
                                   sampler=sampling.Sampler(50.0), generator=torch.Generator().manual_seed(0)).tokens
    assert len(got) == 60 and max(got) < V - 4 and len(set(got)) > (V - 4) // 2
