"""Adaptivity beyond the thesis' fixed settings: the block length K per round, and FlashHead's probe count per
token (issue 6, items 2 and 3).

Block-length policies (``policy.first() -> K``, then ``policy.update(accepted, drafted) -> next K``), used by
:func:`thesis_lib.decoding.speculative_generate` through its ``k_policy`` argument:

- :class:`FixedK`: the thesis' constant K.
- :class:`HeuristicK`: transformers' "heuristic" schedule for assisted generation, as a reference: K grows by
  2 after a fully accepted block and shrinks by 1 otherwise (at least 1; capped at ``k_max`` here).
- :class:`CostModelK`: this project's own. It keeps a running estimate of the per-token acceptance alpha
  (accepted tokens over trials, with exponential forgetting so it follows the text) and picks, each round,
  the K that maximises expected tokens per second, ``E(alpha, K) / (K * draft_step + verify(K))``, where
  ``E = (1 - alpha^(K+1)) / (1 - alpha)`` (the i.i.d. acceptance model of chapter 2) and the costs are *measured* on the machine
  (:func:`measure_costs`): one draft step, and the target's verify forward over K + 1 tokens (deferred
  schedule) or K tokens plus the append (ordinary).

Adaptive probing (:class:`AdaptiveFlashHead`): FlashHead ranks the clusters by centroid score and then scores
the tokens of the top ``n_probes`` exactly. Here the count follows the ranking itself: clusters whose
(unit-centroid) score lies within ``margin * |h|`` of the best one are probed, at least ``min_probes`` and at
most ``max_probes``; a clear winner costs few probes, a flat ranking many. Same candidates-then-argmax rule,
same special tokens, ties to the lowest id; ``last_probes`` records what each row used.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import torch

from .errors import ConfigError
from .theory import expected_emitted

K_POLICIES = ("fixed", "heuristic", "cost")


class FixedK:
    """The constant block length of the thesis."""

    name = "fixed"

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"K must be an integer >= 1, got {k!r}.")
        self.k = k

    def first(self) -> int:
        return self.k

    def update(self, accepted: int, drafted: int) -> int:
        return self.k


class HeuristicK:
    """transformers' heuristic: +2 after a fully accepted block, -1 otherwise (1 <= K <= k_max)."""

    name = "heuristic"

    def __init__(self, k: int, k_max: int = 16):
        if not isinstance(k, int) or not 1 <= k <= k_max:
            raise ConfigError(f"need 1 <= K <= k_max, got K={k!r}, k_max={k_max!r}.")
        self.k0, self.k_max = k, k_max
        self.k = k

    def first(self) -> int:
        self.k = self.k0
        return self.k

    def update(self, accepted: int, drafted: int) -> int:
        self.k = min(self.k_max, self.k + 2) if accepted >= drafted else max(1, self.k - 1)
        return self.k


class CostModelK:
    """Picks the K that maximises expected tokens per second under measured step costs (module docstring).

    ``draft_step_s``: one draft step; ``verify_s``: seconds of the target's verify forward indexed by the
    number of tokens it scores (``verify_s[n]``, n = 1 .. k_max + 1); ``deferred``: the deferred schedule
    (verify over K + 1 tokens, no append) or the ordinary one (verify over K tokens plus one append, which
    the skip test sometimes saves; counted always, a slight pessimism). ``alpha0`` and ``prior`` set the
    starting estimate (``prior`` pseudo-trials), ``forget`` the per-round decay of old evidence."""

    name = "cost"

    def __init__(self, k: int, *, draft_step_s: float, verify_s: dict[int, float], deferred: bool = True,
                 k_max: int = 12, alpha0: float = 0.6, prior: float = 4.0, forget: float = 0.8):
        if not isinstance(k, int) or not 1 <= k <= k_max:
            raise ConfigError(f"need 1 <= K <= k_max, got K={k!r}, k_max={k_max!r}.")
        need = range(1, k_max + 2)
        missing = [n for n in need if n not in verify_s]
        if missing:
            raise ConfigError(f"verify costs missing for {missing[:3]}... tokens (need 1..{k_max + 1}).")
        if draft_step_s < 0 or not 0 < forget <= 1 or not 0 < alpha0 < 1:
            raise ConfigError("need draft_step_s >= 0, 0 < forget <= 1 and 0 < alpha0 < 1.")
        self.k0, self.k_max, self.deferred = k, k_max, deferred
        self.draft_step_s, self.verify_s = float(draft_step_s), {int(n): float(s) for n, s in verify_s.items()}
        self.alpha0, self.prior, self.forget = alpha0, prior, forget
        self.first()

    def first(self) -> int:
        self.hits, self.trials = self.alpha0 * self.prior, self.prior
        self.k = self.k0
        return self.k

    @property
    def alpha(self) -> float:
        return min(max(self.hits / self.trials, 1e-3), 0.999)

    def round_seconds(self, k: int) -> float:
        if self.deferred:
            return k * self.draft_step_s + self.verify_s[k + 1]
        return k * self.draft_step_s + self.verify_s[k] + self.verify_s[1]

    def best_k(self, alpha: float | None = None) -> int:
        a = self.alpha if alpha is None else alpha
        return max(range(1, self.k_max + 1), key=lambda k: expected_emitted(a, k) / self.round_seconds(k))

    def update(self, accepted: int, drafted: int) -> int:
        # a round is a run of `accepted` successes, then one failure unless the whole block was accepted
        self.hits = self.forget * self.hits + accepted
        self.trials = self.forget * self.trials + accepted + (1 if accepted < drafted else 0)
        self.k = self.best_k()
        return self.k


def make_policy(name: str, k: int, costs: dict | None = None, *, deferred: bool = True, draft: str = "dense",
                k_max: int = 12):
    """A K policy by name (``fixed``, ``heuristic``, ``cost``); ``cost`` needs :func:`measure_costs`' dict."""
    if name == "fixed":
        return FixedK(k)
    if name == "heuristic":
        return HeuristicK(k, k_max=max(k_max, k))
    if name == "cost":
        if costs is None:
            raise ConfigError("The cost-model K policy needs measured step costs (adaptive.measure_costs).")
        step = costs.get(f"{draft}_step_s", costs["draft_step_s"])
        return CostModelK(min(k, k_max), draft_step_s=step, verify_s=costs["verify_s"], deferred=deferred,
                          k_max=k_max)
    raise ConfigError(f"Unknown K policy {name!r}; use one of {', '.join(K_POLICIES)}.")


@torch.inference_mode()
def measure_costs(target_state, drafters: dict, ids: Sequence[int], *, k_max: int = 12, reps: int = 3) -> dict:
    """Median seconds of one draft step per drafter (``<name>_step_s``; the dense one also as
    ``draft_step_s``) and of the target's forward over n = 1 .. k_max + 1 tokens (``verify_s[n]``), at the
    context length of ``ids``: the inputs of :class:`CostModelK`."""
    out: dict = {}
    for name, d in drafters.items():
        state = getattr(d, "state", None)
        if state is None:  # a drafter without a model costs nothing to step
            out[f"{name}_step_s"] = 0.0
            continue
        state.reset()
        state.greedy(ids, last_only=True)
        out[f"{name}_step_s"] = statistics.median(state.timed_forward([ids[-1]]) for _ in range(reps))
    out["draft_step_s"] = out.get("dense_step_s", 0.0)
    target_state.reset()
    target_state.greedy(ids, last_only=True)
    tail = list(ids) * (1 + (k_max + 1) // max(1, len(ids)))
    out["verify_s"] = {n: statistics.median(target_state.timed_forward(tail[-n:]) for _ in range(reps))
                       for n in range(1, k_max + 2)}
    target_state.reset()
    return out


class AdaptiveFlashHead(torch.nn.Module):
    """A greedy FlashHead whose probe count per row follows the centroid-score margin (module docstring)."""

    def __init__(self, flash, *, margin: float, min_probes: int = 1, max_probes: int | None = None):
        super().__init__()
        max_probes = flash.n_probes if max_probes is None else max_probes
        if not 1 <= min_probes <= max_probes <= flash.n_clusters:
            raise ConfigError(f"need 1 <= min_probes <= max_probes <= C = {flash.n_clusters}, "
                              f"got {min_probes}, {max_probes}.")
        if not (isinstance(margin, (int, float)) and margin >= 0 and math.isfinite(margin)):
            raise ConfigError(f"margin must be a finite number >= 0, got {margin!r}.")
        self.flash, self.margin = flash, float(margin)
        self.min_probes, self.max_probes = int(min_probes), int(max_probes)
        self.vocab_limit = flash.vocab_limit
        self.last_probes: list[int] = []
        self.calls = self.probes_used = 0

    def extra_repr(self) -> str:
        return f"margin={self.margin}, probes={self.min_probes}..{self.max_probes}, C={self.flash.n_clusters}"

    @property
    def mean_probes(self) -> float | None:
        return self.probes_used / self.calls if self.calls else None

    def probes_for(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ranked clusters ``[S, max_probes]`` and the probe count of each row ``[S]``."""
        f = self.flash
        h = hidden.to(f.fast_centroids.dtype)
        scores, top = torch.topk(h @ f.fast_centroids.T, self.max_probes, dim=-1)
        scale = hidden.float().norm(dim=-1, keepdim=True)
        within = (scores[:, :1].float() - scores.float()) <= self.margin * scale
        counts = within.sum(-1).clamp(self.min_probes, self.max_probes)
        return top, counts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        f = self.flash
        top, counts = self.probes_for(hidden)
        hw = hidden.to(f.weight_perm.dtype)
        sp = (hw @ f.special_weight.T).float() + f.special_bias  # [S, ns]
        out, used = [], counts.tolist()
        for i, p in enumerate(used):
            cl = top[i, :p]
            logits = (f.weight_perm[cl] @ hw[i]).float() + f.slot_bias[cl]  # [p, b]
            scores = torch.cat([logits.reshape(-1), sp[i]])
            ids = torch.cat([f.tokens[cl].reshape(-1), f.special_ids])
            best = scores.max()
            out.append(torch.where(scores == best, ids, torch.full_like(ids, f.vocab_size)).min())
        self.last_probes = used
        self.calls += len(used)
        self.probes_used += sum(used)
        return torch.stack(out)


__all__ = ["K_POLICIES", "FixedK", "HeuristicK", "CostModelK", "make_policy", "measure_costs",
           "AdaptiveFlashHead"]
