"""The greedy decoding loops: target-only greedy, and greedy speculative decoding with the ordinary, deferred
or pipelined schedule (thesis sections 2.2, 3.3, 3.6.1 and 3.6.2).

Every loop returns a :class:`~thesis_lib.decoding.stats.Generation`: the new token ids and a stats record
(:mod:`~thesis_lib.decoding.stats` defines its words). Printing, aggregation and benchmarking live elsewhere
(:mod:`thesis_lib.bench`); tokenisation too (:mod:`thesis_lib.bench.prompts`).

Greedy speculative decoding is lossless: its output equals target-only greedy output token for token,
because a draft token is kept only where it equals the target's own argmax at that position, and every
round ends with a token the target chose. The one caveat is floating point: the target scores a block of
tokens in one forward, and a K-token forward can round differently from K one-token forwards, so the two
loops can part ways where the target's top two logits are (almost exactly) tied. On a CPU the loader closes
that gap where it can: with row-exact attention (:mod:`thesis_lib.models.attention`) and linear layers whose
rows do not depend on the block (the loader probes every block size:
:func:`thesis_lib.models.attention.rows_exact_by_size`), a block computes what one-token steps do, bit for bit, and
the tests demand equal outputs there; elsewhere (a CPU where the probe fails, GPUs) they check that every
divergence sits at a near-tie.

Schedules (``schedule=``): ``ordinary``; ``deferred``; ``pipelined`` (thesis section 3.6.1): the ordinary
schedule, but the standalone target append runs on a worker thread while the main thread lets the draft
catch up and propose the next block; the loop waits for the append only when it needs the target's next
token (the skip test and the verify forward). The tokens are those of the ordinary schedule.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from ..errors import ConfigError
from ..models import virtual
from .clocks import PhaseClock
from .drafters import Drafter
from .state import ModelState
from .stats import (FINALIZE, PREFILL, PROPOSE, VERIFY, DecodeStats, Generation, accepted_prefix, check_request,
                    emit_round, finish, opening)

SCHEDULES = ("ordinary", "deferred", "pipelined")


def greedy_generate(target: ModelState, prompt_ids: Sequence[int], *, max_new_tokens: int,
                    eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> Generation:
    """Target-only greedy decoding with a KV cache; prefill and first token are timed apart (TTFT)."""
    check_request(max_new_tokens, prompt_ids)
    with torch.inference_mode():
        return target_only(target, prompt_ids, lambda ids: int(target.greedy(ids, last_only=True)), mode="baseline",
                           max_new_tokens=max_new_tokens, eos_ids=eos_ids, clock=clock)


def target_only(target: ModelState, prompt_ids: Sequence[int], next_token, *, mode: str, max_new_tokens: int,
                eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> Generation:
    """The one-token-per-forward loop of target-only decoding, greedy or sampled: ``next_token(ids) -> int``
    feeds ``ids`` to the target and chooses the token after them (argmax, or a draw)."""
    clock = clock or PhaseClock([target.device])
    eos = frozenset(eos_ids)
    stats = DecodeStats(mode=mode)
    target.reset()
    t0 = clock.now()
    # 1. prefill the prompt; the first token is chosen at its last position
    with clock.phase(PREFILL):
        out = [next_token(prompt_ids)]
    t1 = clock.now()
    # 2. decode one token per target forward (a host sync each: the loop needs the token to test for EOS)
    while len(out) < max_new_tokens and out[-1] not in eos:
        out.append(next_token([out[-1]]))
        stats.append_calls += 1  # every decode step appends one token to the cache (the thesis' count)
    return finish(stats, out, eos, clock, t0, t1)


def speculative_generate(target: ModelState, drafter: Drafter, prompt_ids: Sequence[int], *, k: int,
                         max_new_tokens: int, eos_ids: Sequence[int] = (), deferred: bool = False,
                         schedule: str | None = None, clock: PhaseClock | None = None,
                         k_policy=None) -> Generation:
    """Greedy speculative decoding (thesis section 3.3) with the ordinary, deferred (section 3.6.2) or
    pipelined (section 3.6.1) schedule; ``deferred=True`` is short for ``schedule="deferred"``.
    ``k_policy`` (see :mod:`thesis_studies.beyond.policies`) chooses each round's block length; without it every
    round drafts ``k`` tokens. Either way the output is target-only greedy's.

    Invariant at the start of a round:
    - ordinary/pipelined: the target's cache holds every emitted token and ``next_token`` is its argmax
      after them (pipelined: possibly still being computed by the worker thread);
    - deferred: the target's cache holds all but the last emitted token, ``final``, which rides along at
      the front of the next verify batch.
    """
    schedule = schedule or ("deferred" if deferred else "ordinary")
    if schedule not in SCHEDULES:
        raise ConfigError(f"Unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
    check_request(max_new_tokens, prompt_ids, k)
    args = (target, drafter, prompt_ids, k, max_new_tokens, eos_ids, schedule, clock)
    with torch.inference_mode():
        if schedule != "pipelined":
            return _speculative(*args, None, k_policy)
        # the two sides run at once, each a parallel region of all of torch's intra-op threads
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-append", initializer=_worker_init,
                                initargs=(torch.get_num_threads(),)) as worker:
            return _speculative(*args, worker, k_policy)


def _worker_init(threads: int) -> None:
    """The append worker's thread: all of torch's intra-op threads, and a CPU rehearsal's virtual devices."""
    torch.set_num_threads(threads)
    virtual.enter_in_thread()


def _append(target: ModelState, token: int) -> int:
    """The standalone target append (inference mode is per thread, so the worker enters it itself)."""
    with torch.inference_mode():
        return int(target.greedy([token], last_only=True))


def _speculative(target: ModelState, drafter: Drafter, prompt_ids: Sequence[int], k: int, max_new_tokens: int,
                 eos_ids: Sequence[int], schedule: str, clock: PhaseClock | None,
                 worker: ThreadPoolExecutor | None, k_policy=None) -> Generation:
    deferred = schedule == "deferred"
    draft_device = getattr(getattr(drafter, "state", None), "device", "cpu")
    clock = clock or PhaseClock([target.device, draft_device])
    eos = frozenset(eos_ids)
    stats = DecodeStats(mode=f"{drafter.name}_{schedule}", k=k)
    pending: Future | None = None  # pipelined: the append running on the worker thread
    if k_policy is not None:
        k = k_policy.first()

    def next_known() -> int:
        nonlocal pending, next_token
        if pending is not None:
            with clock.phase(FINALIZE, target.device):
                next_token = pending.result()
            pending = None
        return next_token
    # 0. initial step: target prefill and first token
    t0, t1, out, done = opening(target, drafter, prompt_ids, clock, eos, max_new_tokens,
                                lambda ids: int(target.greedy(ids, last_only=True)))
    final, next_token = out[0], None
    if not done and not deferred:
        # The ordinary schedule writes the first token into the target's cache before the first round
        # (pipelined: on the worker, overlapping the draft's prefill of the prompt).
        if worker is not None:
            pending = worker.submit(_append, target, final)
        else:
            with clock.phase(FINALIZE):
                next_token = int(target.greedy([final], last_only=True))
        stats.append_calls += 1

    while not done:
        remaining = max_new_tokens - len(out)
        kk = min(k, remaining - 1)  # a round emits at most kk + 1 tokens
        if kk == 0:
            # Tail: one token left. Ordinary: the target already knows it. Deferred: one standalone append.
            if deferred:
                with clock.phase(FINALIZE):
                    next_token = int(target.greedy([final], last_only=True))
                stats.append_calls += 1
            out.append(next_known())
            stats.tail_tokens += 1
            break
        # 1. draft proposal: y_1..y_kk
        with clock.phase(PROPOSE, draft_device):
            y = drafter.propose(kk)
        if not 1 <= len(y) <= kk:
            raise RuntimeError(f"drafter {drafter.name!r} proposed {len(y)} tokens; expected 1..{kk}")
        kk = len(y)  # a drafter may stop a block early (drafters.ModelDrafter's stop_below)
        if not deferred:
            next_known()
        # 2. target verification
        with clock.phase(VERIFY, target.device):
            if deferred:
                # one forward over [final, y_1..y_kk]: t[i] is the target's token after position i
                t = target.greedy([final] + y).tolist()
                n = accepted_prefix(y, t)
                correction = t[n]
                stats.verify_calls += 1
                cached_extra = kk - n  # cache grew by kk + 1; keep final and the n accepted
            elif y[0] != next_token:
                # skip: the first proposal already disagrees with the target's known next token
                n, correction, cached_extra = 0, next_token, 0
                stats.skipped += 1
            else:
                # one forward over y_1..y_kk: t[i] is the target's token after y_{i+1}
                t = target.greedy(y).tolist()
                n = 1 + accepted_prefix(y[1:], t[:-1])
                correction = t[n - 1]
                stats.verify_calls += 1
                cached_extra = kk - n
        # 3. emission: accepted proposals, then the target's correction or bonus token
        done = emit_round(stats, out, y, n, correction, kk, eos, max_new_tokens)
        if k_policy is not None:
            k = k_policy.update(n, kk)
        # 4. alignment: discard cache entries of rejected proposals, on both sides
        with clock.phase(FINALIZE):
            target.crop(cached_extra)
            if done:
                break
            drafter.observe(n, correction)
            # 5. finalize. This is the step deferred verification changes:
            #    ordinary -- a standalone one-token target forward writes the final token into the cache now;
            #    deferred -- the final token waits and is verified at the front of the next round's batch.
            #    pipelined -- the same append, started on the worker thread; the next proposal overlaps it.
            if deferred:
                final = correction
            elif worker is not None:
                pending = worker.submit(_append, target, correction)
                stats.append_calls += 1
            else:
                next_token = int(target.greedy([correction], last_only=True))
                stats.append_calls += 1
    return finish(stats, out, eos, clock, t0, t1)
