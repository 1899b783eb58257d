"""The cost model of a speculative round, in one place, and the one timer of its inputs.

A round drafts k tokens (k draft steps) and runs the target once over the block: over k + 1 tokens under
deferred verification (the final token rides along), or over k tokens plus a one-token append under the
ordinary schedule. Under chapter 2's i.i.d. acceptance model, with per-token acceptance alpha, a round emits
:func:`expected_emitted` tokens on average. Costs may be in any one unit (seconds, ms, target steps).

- :func:`round_cost`: k draft steps + the verify forward + the append; :func:`schedule_cost` reads the last two
  from a verify curve (``n -> cost of the target's forward over n tokens``) for a schedule;
  :func:`verify_cost` turns measured sizes into such a curve (the cheapest measured size of at least n).
- :func:`rate`: expected tokens per unit of cost; :func:`best_k`: the block length that maximises it;
  :func:`speedup`: the rate in units of one target step, i.e. the model's speedup over target-only decoding.
- :func:`measure_costs`: median seconds of one step of each draft and of the target's forward over n tokens,
  at a prompt's context length, by :func:`forward_curves`: the one forward-cost timer (any model states side by
  side, over any sizes; the benchmark, the K policies, the trees, precision, co-design, serving's batched step
  costs and head shares, and the GPU check use it).
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable, Mapping, Sequence

import torch

from ..errors import ConfigError
from .clocks import alternating


def expected_emitted(alpha, k: int):
    """Expected tokens per round, (1 - alpha^(K+1)) / (1 - alpha); K + 1 at alpha = 1 (works on arrays too)."""
    import numpy as np

    a = np.asarray(alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isclose(a, 1.0), k + 1.0, (1 - a ** (k + 1)) / (1 - a))
    return out if out.shape else float(out)


def round_cost(k: int, draft_step: float, verify: float, append: float = 0.0) -> float:
    """One round: ``k`` draft steps, the target's verify forward and a standalone append."""
    return k * draft_step + verify + append


def _curve(verify: Mapping[int, float] | Callable[[int], float]) -> Callable[[int], float]:
    return verify if callable(verify) else verify.__getitem__


def schedule_cost(k: int, draft_step: float, verify, *, deferred: bool = True) -> float:
    """A round of a schedule on a verify curve (a mapping or a function ``n -> cost``): deferred verifies
    k + 1 tokens and appends nothing; ordinary verifies k tokens and appends one."""
    v = _curve(verify)
    return round_cost(k, draft_step, v(k + 1)) if deferred else round_cost(k, draft_step, v(k), v(1))


def rate(alpha, k: int, draft_step: float, verify, *, deferred: bool = True):
    """Expected tokens per unit of cost of a round."""
    return expected_emitted(alpha, k) / schedule_cost(k, draft_step, verify, deferred=deferred)


def best_k(alpha, draft_step: float, verify, ks: Iterable[int], *, deferred: bool = True) -> int:
    """The block length among ``ks`` with the highest :func:`rate`."""
    return max(ks, key=lambda k: rate(alpha, k, draft_step, verify, deferred=deferred))


def speedup(alpha, k: int, c: float, verify: float = 1.0, append: float = 0.0):
    """The model's decode speedup over target-only decoding, E(alpha, K) / (K c + verify + append), with c the
    draft/target step-cost ratio and the verify forward and append in target steps (works on arrays of alpha)."""
    return expected_emitted(alpha, k) / round_cost(k, c, verify, append)


def verify_cost(verify: Mapping[int, float]) -> Callable[[int], float]:
    """``n -> cost`` of a target forward over ``n`` tokens: the cheapest measured size of at least ``n`` (a block
    can always be padded to a size that runs faster)."""
    v = {int(n): float(x) for n, x in verify.items()}
    sizes = sorted(v)

    def cost(n: int) -> float:
        ok = [v[m] for m in sizes if m >= n]
        if not ok:
            raise ConfigError(f"no verify cost measured for {n} tokens (largest: {sizes[-1]}).")
        return min(ok)
    return cost


@torch.inference_mode()
def measure_costs(target_state, draft_states: Mapping, ids: Sequence[int], *, verify_sizes: Iterable[int],
                  reps: int = 3) -> dict:
    """Median seconds at the context length of ``ids``: one step of each draft state (``<name>_step_s``; a
    ``None`` state, a drafter without a model, costs 0) and the target's forward over n tokens for each n of
    ``verify_sizes`` (``verify_s[n]``). Every state is reset afterwards."""
    steps = forward_curves({n: s for n, s in draft_states.items() if s is not None}, ids, [1], reps=reps)
    out: dict = {f"{n}_step_s": steps[n][1] if n in steps else 0.0 for n in draft_states}
    out["verify_s"] = forward_curves({"target": target_state}, ids, sorted(set(verify_sizes)), reps=reps)["target"]
    return out


@torch.inference_mode()
def forward_curves(states: Mapping, ids: Sequence[int], sizes: Iterable[int], *, reps: int = 3, warmup: int = 0,
                   head: bool = True, after_steps: Callable[[int], None] | None = None, progress: bool = False,
                   desc: str = "forward costs", raw: bool = False) -> dict[str, dict[int, float]]:
    """The one forward-cost timer: median seconds of each state's forward over n tokens after ``ids`` (the prompt's
    own last tokens, repeated where n exceeds it), for each n of ``sizes``; with ``head=False`` the body's alone
    (:meth:`~thesis_lib.decoding.state.ModelState.timed_forward`). Repetitions outermost, then the sizes, the states
    in :func:`~thesis_lib.decoding.clocks.alternating` order; the first ``warmup`` repetitions are not kept;
    ``after_steps(r)``, if given, runs after the first size of every kept repetition ``r``. Every state is prefilled
    with ``ids`` first and reset at the end. ``raw``: every kept timing instead of the median."""
    from ..progress import tqdm

    sizes = list(sizes)
    tail = list(ids) * (1 + max(sizes) // max(1, len(ids)))
    for state in states.values():
        state.reset()
        state.greedy(ids, last_only=True)
    times = {name: {n: [] for n in sizes} for name in states}
    with tqdm(total=(warmup + reps) * len(sizes), desc=desc, disable=not progress, unit="block") as bar:
        for r in range(warmup + reps):
            for n in sizes:
                for name in alternating(list(states), r + n):
                    dt = states[name].timed_forward(tail[-n:], head=head)
                    if r >= warmup:
                        times[name][n].append(dt)
                if r >= warmup and n == sizes[0] and after_steps is not None:
                    after_steps(r)
                bar.update()
    for state in states.values():
        state.reset()
    return {name: {n: ts if raw else statistics.median(ts) for n, ts in by_size.items()} for name, by_size in times.items()}
