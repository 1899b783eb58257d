"""Block-length policies: the K of each speculative round, beyond the thesis' fixed K.

Block-length policies (``policy.first() -> K``, then ``policy.update(accepted, drafted) -> next K``), used by
:func:`thesis_lib.decoding.speculative_generate` through its ``k_policy`` argument:

- :class:`FixedK`: the thesis' constant K.
- :class:`HeuristicK`: transformers' "heuristic" schedule for assisted generation, as a reference: K grows by
  2 after a fully accepted block and shrinks by 1 otherwise (at least 1; capped at ``k_max`` here).
- :class:`CostModelK`: this project's own. It keeps a running estimate of the per-token acceptance alpha
  (accepted tokens over trials, with exponential forgetting so it follows the text) and picks, each round,
  the K that maximises expected tokens per second under the cost model of :mod:`thesis_lib.decoding.costs`,
  with costs *measured* on the machine: one draft step, and the target's forward over n tokens.
"""

from __future__ import annotations

from thesis_lib.errors import ConfigError
from thesis_lib.decoding import costs

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

    def best_k(self, alpha: float | None = None) -> int:
        return costs.best_k(self.alpha if alpha is None else alpha, self.draft_step_s, self.verify_s,
                            range(1, self.k_max + 1), deferred=self.deferred)

    def update(self, accepted: int, drafted: int) -> int:
        # a round is a run of `accepted` successes, then one failure unless the whole block was accepted
        self.hits = self.forget * self.hits + accepted
        self.trials = self.forget * self.trials + accepted + (1 if accepted < drafted else 0)
        self.k = self.best_k()
        return self.k


def make_policy(name: str, k: int, measured: dict | None = None, *, deferred: bool = True, draft: str = "dense",
                k_max: int = 12):
    """A K policy by name (``fixed``, ``heuristic``, ``cost``); ``cost`` needs the dict of
    :func:`thesis_lib.decoding.costs.measure_costs` (a ``<draft>_step_s`` or ``draft_step_s``, and ``verify_s``)."""
    if name == "fixed":
        return FixedK(k)
    if name == "heuristic":
        return HeuristicK(k, k_max=max(k_max, k))
    if name == "cost":
        if measured is None:
            raise ConfigError("The cost-model K policy needs measured step costs (costs.measure_costs).")
        step = measured.get(f"{draft}_step_s", measured["draft_step_s"])
        return CostModelK(min(k, k_max), draft_step_s=step, verify_s=measured["verify_s"], deferred=deferred,
                          k_max=k_max)
    raise ConfigError(f"Unknown K policy {name!r}; use one of {', '.join(K_POLICIES)}.")
