"""Block-length policies: the K of each speculative round, beyond the thesis' fixed K (issue 6, item 3).

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
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from ..errors import ConfigError

K_POLICIES = ("fixed", "heuristic", "cost")


def expected_emitted(alpha, k: int):
    """Expected tokens per round, (1 - alpha^(K+1)) / (1 - alpha); K + 1 at alpha = 1 (chapter 2's i.i.d.
    acceptance model; works on arrays too)."""
    import numpy as np

    a = np.asarray(alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isclose(a, 1.0), k + 1.0, (1 - a ** (k + 1)) / (1 - a))
    return out if out.shape else float(out)


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


__all__ = ["K_POLICIES", "expected_emitted", "FixedK", "HeuristicK", "CostModelK", "make_policy", "measure_costs"]
