"""Issue 6's building blocks on small inputs: the frequency-truncated head, adaptive probing, teacher-forced
acceptance, the cost model's choice of K, the Pareto front, the sampling-check command's fail-fast, and the count
verdict of chapter 6's walk check."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter

import pytest
import torch

from thesis_lib import cli
from thesis_lib.errors import ConfigError
from thesis_lib.heads import clustering
from thesis_lib.models import tiny
from thesis_studies.beyond import adaptive, codesign, truncated
from thesis_lib.decoding.state import ModelState
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.flashhead import FlashHead
from thesis_studies.beyond import verdicts as beyond_verdicts


def test_truncated_head_scores_only_its_tokens_and_breaks_ties_low():
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    head = truncated.TruncatedHead(w, [3, 2, 1], vocab_limit=5)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert head(h).tolist() == [2, 1]  # 2 and 3 tie: the lower id; token 4 would win row 2 but is not scored
    assert head.candidates_per_step() == 3
    with pytest.raises(ConfigError):
        truncated.TruncatedHead(w, [7, 9], vocab_limit=5)


def test_ranked_tokens_put_counted_tokens_first_then_ids():
    assert truncated.ranked_tokens(Counter({5: 3, 2: 3, 7: 9, 99: 1}), 8) == [7, 2, 5, 0, 1, 3, 4, 6]


@pytest.fixture(scope="module")
def head_and_states():
    torch.manual_seed(0)
    w = torch.randn(512, 32)
    fh = FlashHead(w, clustering.spherical_kmeans(w, 32, progress=False), n_probes=8, path="eager")
    return w, fh, torch.randn(200, 32)


def test_adaptive_probes_follow_the_margin(head_and_states):
    w, fh, h = head_and_states
    full = FlashHead(w, clustering.spherical_kmeans(w, 32, progress=False), n_probes=32, path="eager")
    wide = adaptive.AdaptiveFlashHead(full, margin=1e9, min_probes=1, max_probes=32)  # every cluster: exact
    assert torch.equal(wide(h), DenseGreedyHead(w)(h))
    assert wide.mean_probes == 32
    narrow = adaptive.AdaptiveFlashHead(fh, margin=0.0, min_probes=2, max_probes=8)
    out = narrow(h)
    assert narrow.mean_probes == 2 and set(narrow.last_probes) == {2}
    two = FlashHead(w, clustering.spherical_kmeans(w, 32, progress=False), n_probes=2, path="eager")
    fixed = two(h)  # the same two clusters, scored by the fixed head: equal up to float near-ties of the logits
    for i in torch.nonzero(out != fixed).flatten().tolist():
        a, b = float(w[out[i]] @ h[i]), float(w[fixed[i]] @ h[i])
        assert abs(a - b) <= 1e-5 * max(abs(a), abs(b)), (i, a, b)
    mid = adaptive.AdaptiveFlashHead(fh, margin=0.05, min_probes=1, max_probes=8)
    mid(h)
    assert 1 <= min(mid.last_probes) and max(mid.last_probes) <= 8 and len(set(mid.last_probes)) > 1
    with pytest.raises(ConfigError):
        adaptive.AdaptiveFlashHead(fh, margin=-1.0)
    with pytest.raises(ConfigError):
        adaptive.AdaptiveFlashHead(fh, margin=0.1, min_probes=5, max_probes=3)


def test_teacher_forced_states_give_the_loop_s_acceptance():
    """Teacher forcing on the target's greedy output gives the draft's own greedy proposals: the states at
    each position equal those of a step-by-step draft fed the same tokens."""
    model = tiny.tiny_model(seed=0, dtype=torch.float64)
    draft = tiny.noisy_copy(model, 0.1, seed=4)
    prompt, out = [3, 8, 1, 4], [9, 2, 7, 7, 5]
    states, targets, owner = codesign.teacher_forced(draft, [(prompt, out)], progress=False)
    assert states.shape[0] == len(out) and targets.tolist() == out and owner == [0] * 5
    s = ModelState(draft)
    feed, ref = prompt, []
    for t in out:
        ref.append(s.hidden(feed)[-1])
        feed = [t]
    assert torch.allclose(states, torch.stack(ref).float(), atol=1e-5)
    head = DenseGreedyHead.from_model(draft)
    q = codesign.head_quality(head, states, targets, head(states.double()))
    assert q["agreement"] == 1.0 and 0 <= q["alpha"] <= 1 and q["n"] == 5


def _round_ms(k: int, step: float, verify: dict, deferred: bool) -> float:
    """k draft steps and the target's forward over k + 1 tokens (deferred) or over k tokens plus a one-token append."""
    return k * step + (verify[k + 1] if deferred else verify[k] + verify[1])


def _simulated_tokens_per_s(alpha: float, k: int, round_ms: float, rounds: int, seed: int) -> tuple[float, float]:
    """Tokens/s of rounds whose k proposals each pass with probability alpha, in order, until the first failure (the
    target's own token always follows), and the standard error of that mean."""
    rng = random.Random(seed)
    emitted = []
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        emitted.append(n + 1)
    scale = 1000 / round_ms
    return scale * statistics.fmean(emitted), scale * statistics.stdev(emitted) / rounds ** 0.5


@pytest.mark.parametrize("deferred", [True, False])
def test_predict_picks_the_k_that_maximises_tokens_per_second(deferred):
    """Each K's tokens/s is expected tokens (the i-th proposal emitted when the first i pass, summed term by term)
    over K steps of body + head and the verify; the predicted K is the brute-force best, its tokens/s agrees with a
    simulated i.i.d. acceptance process, and K never shrinks with a more accurate head nor grows with a slower one."""
    costs = {"body_ms": 10.0, "verify_ms": {n: 50.0 + 2 * n for n in range(1, 14)}, "target_step_ms": 52.0}
    alphas, heads = (0.3, 0.6, 0.8, 0.9, 0.95), (0.5, 5.0, 20.0)
    chosen = {}
    for i, alpha in enumerate(alphas):
        for j, head in enumerate(heads):
            ms = {k: _round_ms(k, costs["body_ms"] + head, costs["verify_ms"], deferred) for k in range(1, 13)}
            by_k = {k: 1000 * sum(alpha ** a for a in range(k + 1)) / ms[k] for k in ms}
            pred = codesign.predict(alpha, head, costs, deferred=deferred, k_max=12)
            assert pred["by_k"] == pytest.approx(by_k) and pred["k"] == max(by_k, key=by_k.get), (alpha, head)
            sim, err = _simulated_tokens_per_s(alpha, pred["k"], ms[pred["k"]], 10_000, seed=10 * i + j)
            assert abs(pred["tokens_per_s"] - sim) < 4 * err, (alpha, head, pred["tokens_per_s"], sim, err)
            assert pred["speedup"] == pytest.approx(pred["tokens_per_s"] / (1000 / costs["target_step_ms"]))
            chosen[alpha, head] = pred["k"]
    assert len(set(chosen.values())) >= 4  # the grid moves K, so the orderings below say something
    for head in heads:
        ks = [chosen[a, head] for a in alphas]
        assert ks == sorted(ks), (head, ks)
    for alpha in alphas:
        ks = [chosen[alpha, h] for h in heads]
        assert ks == sorted(ks, reverse=True), (alpha, ks)
    short = codesign.predict(0.95, 0.5, costs, deferred=deferred, k_max=3)
    assert set(short["by_k"]) == {1, 2, 3} and short["k"] == 3


def test_pareto_front_keeps_only_undominated_settings():
    rows = [{"head_ms": 1, "tokens_per_s": 5}, {"head_ms": 2, "tokens_per_s": 7}, {"head_ms": 3, "tokens_per_s": 6},
            {"head_ms": 0.5, "tokens_per_s": 4}, {"head_ms": 2, "tokens_per_s": 7}]
    front = codesign.pareto(rows)
    assert [(r["head_ms"], r["tokens_per_s"]) for r in front] == [(0.5, 4), (1, 5), (2, 7), (2, 7)]


def test_sampling_check_fails_fast(tmp_path, capsys):
    out = tmp_path / "done.json"
    out.write_text(json.dumps({"keep": True}))
    assert cli.main(["studies", "sampling-check", "--out", str(out)]) == 2
    assert json.loads(out.read_text()) == {"keep": True}  # nothing already written is lost
    assert cli.main(["studies", "sampling-check", "--delta", "0"]) == 2
    assert "error" in capsys.readouterr().err
    assert cli.main(["studies", "sampling-check", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_a_packed_head_keeps_its_bias_in_the_truncated_head():
    """A biased output layer, oneDNN-packed: the truncated head built from it scores with the bias (the packed layer
    has no ``bias`` attribute; without it the bias decides nothing and token 1 would win instead of token 0)."""
    from types import SimpleNamespace

    from thesis_lib.models.packing import PackedLinear

    lin = torch.nn.Linear(2, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]]))
        lin.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    model = SimpleNamespace(get_output_embeddings=lambda: PackedLinear(lin))
    head = truncated.frequency_head(SimpleNamespace(model=model, vocab_limit=3), Counter(), 3)
    assert head(torch.tensor([[1.0, 0.0]])).tolist() == [0]  # 1 + 5 beats 2 + 0
    plain = SimpleNamespace(get_output_embeddings=lambda: lin)
    assert truncated.frequency_head(SimpleNamespace(model=plain, vocab_limit=3), Counter(), 3)(
        torch.tensor([[1.0, 0.0]])).tolist() == [0]


def test_the_walk_count_verdict_reads_the_table_it_checks():
    """Table 6.9's sentence on counts: exact agreement only when every mode's rounds, drafted and accepted tokens
    are equal in model and run; otherwise which counts agree in every mode and, for each that does not, its largest
    difference in any mode."""
    import pandas as pd

    from thesis_studies.beyond import tables as beyond

    def table(*rows):
        return pd.DataFrame([{"Mode": f"m{i}", "Rounds (model / run)": r, "Drafted (model / run)": d,
                              "Accepted (model / run)": a} for i, (r, d, a) in enumerate(rows)])

    same = table(("40 / 40", "160 / 160", "120 / 120"), ("35 / 35", "150 / 150", "118 / 118"))
    assert beyond.walk_parted(same) == {"modes": 2, "rounds": 0, "drafted": 0, "accepted": 0}
    assert beyond_verdicts.walk_counts(*beyond.walk_parted(same).values()) == \
        "Rounds, drafted and accepted tokens agree exactly in all 2 modes"
    # rounds equal, drafted and accepted tokens apart (as in the default book): each column's largest gap, any mode
    drafted = table(("40 / 40", "160 / 163", "120 / 120"), ("35 / 35", "150 / 150", "118 / 117"),
                    ("30 / 30", "90 / 77", "80 / 80"))
    assert beyond.walk_parted(drafted) == {"modes": 3, "rounds": 0, "drafted": 13, "accepted": 1}
    assert beyond_verdicts.walk_counts(*beyond.walk_parted(drafted).values()) == (
        "Rounds agree in all 3 modes; the walk's totals part from the run's in drafted tokens by up to 13, "
        "accepted tokens by up to 1")
    every = table(("40 / 42", "160 / 163", "120 / 119"))
    assert beyond_verdicts.walk_counts(*beyond.walk_parted(every).values()) == (
        "The walk's totals part from the run's in rounds by up to 2, drafted tokens by up to 3, accepted tokens by up to 1")


def test_tuned_margin_is_the_cheapest_within_tolerance_else_the_widest():
    from thesis_studies.beyond.tables import MARGIN_TOLERANCE, tuned_margin

    def curve(*rows):  # (margin, agreement, mean probes); the first row is the fixed head
        return {"rows": [dict(margin=m, agreement=a, mean_probes=p) for m, a, p in rows]}

    fixed = (None, 0.90, 8.0)
    # 0.02 is cheapest but loses too much agreement; 0.05 is within tolerance and cheaper than 0.10
    assert tuned_margin(curve(fixed, (0.02, 0.90 - 2 * MARGIN_TOLERANCE, 2.0), (0.05, 0.90 - MARGIN_TOLERANCE / 2, 4.0),
                              (0.10, 0.91, 6.0))) == 0.05
    # the tolerance is inclusive: exactly the tolerance below the fixed head still counts
    assert tuned_margin(curve(fixed, (0.02, 0.90 - MARGIN_TOLERANCE, 3.0), (0.10, 0.95, 6.0))) == 0.02
    # no margin keeps agreement: the widest margin (the closest to probing like the fixed head) is taken, not the first
    assert tuned_margin(curve(fixed, (0.02, 0.50, 2.0), (0.20, 0.60, 5.0), (0.10, 0.55, 4.0))) == 0.20
    # the fixed head's own row is never a candidate, however cheap it is
    assert tuned_margin(curve((None, 0.90, 1.0), (0.05, 0.90, 4.0))) == 0.05


def test_the_frequency_head_s_counts_are_kept_under_their_prompts_texts(monkeypatch, tmp_path):
    """The counts are cached per configuration; an edited calibration prompt (same file, same ids) is a new key,
    so the head is not built from counts of the old text."""
    from types import SimpleNamespace

    from thesis_studies.beyond import heads

    monkeypatch.setattr(heads, "clustering_cache_root", lambda: tmp_path / "clusterings")
    monkeypatch.setattr(heads, "count_tokens", lambda draft, prompts, *, cache, **kw: cache)

    def cfg(text):
        prompt = SimpleNamespace(question_id="q-1", text=text)
        return SimpleNamespace(draft="d", prompt_file="p.jsonl", freq_calibration=1, freq_tokens_generated=16,
                               check_prompts=lambda: [SimpleNamespace(question_id="m-1", text="x")],
                               calibration_prompts=lambda: [prompt])

    first, again, edited = (heads.token_counts(cfg(t), None) for t in ("Say hi.", "Say hi.", "Say hello."))
    assert first == again and first != edited and first.parent == edited.parent == tmp_path / "token-counts"
