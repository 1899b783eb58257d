"""Draft-head settings judged without a decoding run each. Under greedy decoding the draft's prefix is always the
target's output, so one draft forward over it (:func:`teacher_forced`) gives every state, and any head's acceptance
(:func:`head_quality`); :func:`predict` turns that and measured costs into decode tok/s
(:mod:`thesis_lib.decoding.costs`), :func:`sweep` over clusters x probes, :func:`pareto` keeps the undominated.
"""

from __future__ import annotations

from typing import Sequence

import torch

from thesis_lib.bench.timing import head_ms
from thesis_lib.decoding import costs as cost_model
from thesis_lib.decoding.state import ModelState
from thesis_lib.errors import ConfigError


@torch.inference_mode()
def teacher_forced(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                   vocab_limit: int | None = None, progress: bool = True) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The draft's float32 states ``[N, D]`` at the positions predicting each ``(prompt_ids, target_tokens)``'s
    tokens, those tokens ``[N]``, and each row's sequence index."""
    from thesis_lib.progress import tqdm

    state = ModelState(model, vocab_limit=vocab_limit)
    hs, ts, owner = [], [], []
    for i, (prompt, out) in enumerate(tqdm(sequences, desc="teacher-forced states", disable=not progress)):
        if not out:
            continue
        state.reset()
        h = state.hidden(list(prompt) + list(out[:-1]))
        hs.append(h[len(prompt) - 1:].float().cpu())
        ts.extend(int(t) for t in out)
        owner.extend([i] * len(out))
    if not hs:
        raise ConfigError("No target tokens to teacher-force the draft on.")
    return torch.cat(hs), torch.tensor(ts), owner


@torch.inference_mode()
def head_tokens(head, states: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The head's greedy token for every state (``[N]``, on the CPU); states go to the head's device in chunks."""
    return torch.cat([head(states[s:s + chunk].to(head.device)).cpu() for s in range(0, states.shape[0], chunk)])


@torch.inference_mode()
def head_quality(head, states: torch.Tensor, targets: torch.Tensor, dense_tokens: torch.Tensor,
                 chunk: int = 256) -> dict:
    """Per-token acceptance (head token == target token) and top-1 agreement with the dense head."""
    out = head_tokens(head, states, chunk)
    return {"alpha": float((out == targets).float().mean()), "agreement": float((out == dense_tokens).float().mean()),
            "n": int(states.shape[0])}


def predict(alpha: float, head_ms_: float, costs: dict, *, deferred: bool = True, k_max: int = 12) -> dict:
    """Best K and predicted decode tok/s for a head of this acceptance and latency, at :func:`step_costs`' costs."""
    step, verify = costs["body_ms"] + head_ms_, costs["verify_ms"]
    ks = [k for k in range(1, k_max + 1) if (k + 1) in verify]
    by_k = {k: 1000 * float(cost_model.rate(alpha, k, step, verify, deferred=deferred)) for k in ks}
    best = cost_model.best_k(alpha, step, verify, ks, deferred=deferred)
    return {"k": best, "tokens_per_s": by_k[best], "speedup": by_k[best] * costs["target_step_ms"] / 1000,
            "by_k": by_k}


def pareto(rows: Sequence[dict], *, cost: str = "head_ms", gain: str = "tokens_per_s") -> list[dict]:
    """The rows that no other row beats on both ``cost`` (lower is better) and ``gain`` (higher is better)."""
    front = [r for r in rows if not any(o[cost] <= r[cost] and o[gain] >= r[gain]
                                        and (o[cost] < r[cost] or o[gain] > r[gain]) for o in rows)]
    return sorted(front, key=lambda r: r[cost])


def sweep(heads: dict[int, object], probes: dict[int, Sequence[int]], states: torch.Tensor, targets: torch.Tensor,
          dense_tokens: torch.Tensor, costs: dict, *, deferred: bool = True, k_max: int = 12,
          progress: bool = True) -> list[dict]:
    """Quality, latency and :func:`predict` per FlashHead (by cluster count) x probes; probe counts are restored."""
    from thesis_lib.progress import tqdm

    rows = []
    todo = [(c, p) for c in heads for p in probes[c]]
    for c, p in tqdm(todo, desc="co-design sweep", disable=not progress):
        head = heads[c]
        old = head.n_probes
        head.with_probes(p)
        q = head_quality(head, states, targets, dense_tokens)
        ms = head_ms(head, states)
        pred = predict(q["alpha"], ms, costs, deferred=deferred, k_max=k_max)
        rows.append({"clusters": c, "probes": p, "cluster_size": head.cluster_size,
                     "candidates": head.candidates_per_step(), "alpha": q["alpha"], "agreement": q["agreement"],
                     "head_ms": ms, "k": pred["k"], "tokens_per_s": pred["tokens_per_s"],
                     "speedup": pred["speedup"]})
        head.with_probes(old)
    return rows


@torch.inference_mode()
def step_costs(target_state: ModelState, draft_model, ids: Sequence[int], dense_head, *, k_max: int = 12,
               reps: int = 5, vocab_limit: int | None = None) -> dict:
    """Measured inputs of :func:`predict` at ``ids``' context length: the draft body's step (no head), the dense
    head on one state, and the target's forward over n = 1 .. k_max + 1 tokens."""
    d = ModelState(draft_model, vocab_limit=vocab_limit)
    body = cost_model.forward_curves({"draft": d}, ids, [1], reps=reps, head=False)["draft"][1]
    h = d.hidden(ids)[-1:]  # a hidden state of the draft at this context, for the head
    c = cost_model.measure_costs(target_state, {}, ids, verify_sizes=range(1, k_max + 2), reps=reps)
    verify = {n: 1000 * s for n, s in c["verify_s"].items()}
    return {"body_ms": 1000 * body, "dense_head_ms": head_ms(dense_head, h.float()),
            "verify_ms": verify, "target_step_ms": verify[1]}
