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

Schedules (``schedule=``), each a function of its own over one :class:`_Round` of shared steps: ``ordinary``
(section 3.3); ``deferred`` (section 3.6.2); ``pipelined`` (section 3.6.1), the ordinary schedule with its
standalone target append started on a worker thread, so the draft proposes the next block meanwhile; the loop
waits for the append only when it needs the target's next token (the skip test and the verify forward). The
tokens are those of the ordinary schedule.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Sequence

import torch

from ..errors import ConfigError
from ..models import virtual
from .clocks import PhaseClock
from .drafters import Drafter
from .rounds import accepted_prefix, check_request, emit_round, finish, prefill
from .state import ModelState
from .stats import FINALIZE, PREFILL, PROPOSE, VERIFY, DecodeStats, Generation

SCHEDULES = ("ordinary", "deferred", "pipelined")


def next_token(target: ModelState, ids: Sequence[int]) -> int:
    """Feed ``ids`` to the target after its cache and return its greedy token after them: the prefill's first
    token, a decode step, and the standalone append (inference mode is per thread, so it enters it itself)."""
    with torch.inference_mode():
        return int(target.greedy(ids, last_only=True))


def greedy_generate(target: ModelState, prompt_ids: Sequence[int], *, max_new_tokens: int,
                    eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> Generation:
    """Target-only greedy decoding with a KV cache; prefill and first token are timed apart (TTFT)."""
    check_request(max_new_tokens, prompt_ids)
    with torch.inference_mode():
        return target_only(target, prompt_ids, lambda ids: next_token(target, ids), mode="baseline",
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
                         max_new_tokens: int, eos_ids: Sequence[int] = (), schedule: str = "ordinary",
                         clock: PhaseClock | None = None, k_policy=None) -> Generation:
    """Greedy speculative decoding (thesis section 3.3) with the ordinary, deferred (section 3.6.2) or pipelined
    (section 3.6.1) schedule. ``k_policy`` (see :mod:`thesis_studies.beyond.policies`) chooses each round's block
    length; without it every round drafts ``k`` tokens. Either way the output is target-only greedy's."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"Unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
    check_request(max_new_tokens, prompt_ids, k)
    with torch.inference_mode():
        round_ = _Round(target, drafter, k=k, max_new_tokens=max_new_tokens, eos_ids=eos_ids, clock=clock,
                        k_policy=k_policy, schedule=schedule)
        if schedule == "deferred":
            return _deferred(round_, prompt_ids)
        if schedule == "ordinary":
            return _ordinary(round_, prompt_ids, _Append(target, round_.clock))
        # the two sides run at once, each a parallel region of all of torch's intra-op threads
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-append", initializer=_worker_init,
                                initargs=(torch.get_num_threads(),)) as worker:
            return _ordinary(round_, prompt_ids, _Append(target, round_.clock, worker))


def _ordinary(r: "_Round", prompt_ids: Sequence[int], append: "_Append") -> Generation:
    """The ordinary schedule. At the start of a round the target's cache holds every emitted token and
    ``append.next()`` is the target's token after them; a round verifies its block in one forward, unless the
    known token already rejects the block's first proposal (a skip), then appends the round's last token."""
    out, done = r.open(prompt_ids)
    if not done:  # the first token into the target's cache before the first round (pipelined: on the worker)
        with r.clock.phase(FINALIZE) if append.worker is None else nullcontext():
            append.start(out[-1])
        r.stats.append_calls += 1
    while not done:
        size = r.block()
        if size == 0:  # one token left: the target knows it already
            out.append(append.next())
            r.stats.tail_tokens += 1
            break
        y = r.propose(size)
        known = append.next()
        with r.clock.phase(VERIFY, r.target.device):
            if y[0] != known:  # skip: the first proposal already disagrees with the target's known next token
                fed, n, correction = 0, 0, known
                r.stats.skipped += 1
            else:  # one forward over the block y: t[i] is the target's token after y_{i+1}
                t = r.target.greedy(y).tolist()
                fed, n = len(y), 1 + accepted_prefix(y[1:], t[:-1])
                correction = t[n - 1]
                r.stats.verify_calls += 1
        done = r.emit(y, n, correction)
        with r.clock.phase(FINALIZE):  # alignment: the cache keeps the accepted proposals; then the append
            r.target.crop(fed - n)
            if not done:
                r.drafter.observe(n, correction)
                append.start(correction)
                r.stats.append_calls += 1
    return r.finish()


def _deferred(r: "_Round", prompt_ids: Sequence[int]) -> Generation:
    """The deferred schedule. At the start of a round the target's cache holds all but the last emitted token,
    which rides at the front of the round's verify forward: no standalone append, but for a last lone token."""
    out, done = r.open(prompt_ids)
    while not done:
        size = r.block()
        if size == 0:  # one token left: one standalone append of the last emitted token gives it
            with r.clock.phase(FINALIZE):
                token = next_token(r.target, [out[-1]])
            r.stats.append_calls += 1
            out.append(token)
            r.stats.tail_tokens += 1
            break
        y = r.propose(size)
        with r.clock.phase(VERIFY, r.target.device):  # one forward over [last] + y: t[i] follows position i
            t = r.target.greedy([out[-1]] + y).tolist()
            n = accepted_prefix(y, t)
            r.stats.verify_calls += 1
        done = r.emit(y, n, t[n])
        with r.clock.phase(FINALIZE):  # alignment: the cache grew by len(y) + 1; it keeps the last token and the n accepted
            r.target.crop(len(y) - n)
            if not done:
                r.drafter.observe(n, t[n])
    return r.finish()


class _Round:
    """What every schedule's rounds share: the pair, the block length (``k``, or the K policy's), the output so far,
    the record and the clock."""

    def __init__(self, target: ModelState, drafter: Drafter, *, k: int, max_new_tokens: int, eos_ids: Sequence[int],
                 clock: PhaseClock | None, k_policy, schedule: str):
        self.target, self.drafter, self.k_policy, self.max_new_tokens = target, drafter, k_policy, max_new_tokens
        self.draft_device = getattr(getattr(drafter, "state", None), "device", "cpu")
        self.clock = clock or PhaseClock([target.device, self.draft_device])
        self.eos = frozenset(eos_ids)
        self.stats = DecodeStats(mode=f"{drafter.name}_{schedule}", k=k)
        self.k = k if k_policy is None else k_policy.first()

    def open(self, prompt_ids: Sequence[int]) -> tuple[list[int], bool]:
        """Both models' prefill and the first token: the output so far and whether it is already done."""
        self.t0, self.t1, self.out, done = prefill(self.target, self.drafter, prompt_ids, self.clock, self.eos,
                                                   self.max_new_tokens, lambda ids: next_token(self.target, ids))
        return self.out, done

    def block(self) -> int:
        """This round's block length: a round emits at most that and one more token."""
        return min(self.k, self.max_new_tokens - len(self.out) - 1)

    def propose(self, size: int) -> list[int]:
        """The draft's proposals y_1..y_n, 1 <= n <= size (a drafter may end a block early)."""
        with self.clock.phase(PROPOSE, self.draft_device):
            y = self.drafter.propose(size)
        if not 1 <= len(y) <= size:
            raise RuntimeError(f"drafter {self.drafter.name!r} proposed {len(y)} tokens; expected 1..{size}")
        return y

    def emit(self, y: list[int], n: int, correction: int) -> bool:
        """The ``n`` accepted proposals and the target's token, counted (and told to the K policy); whether done."""
        done = emit_round(self.stats, self.out, y, n, correction, len(y), self.eos, self.max_new_tokens)
        if self.k_policy is not None:
            self.k = self.k_policy.update(n, len(y))
        return done

    def finish(self) -> Generation:
        return finish(self.stats, self.out, self.eos, self.clock, self.t0, self.t1)


class _Append:
    """The ordinary schedule's standalone append: ``start(token)`` writes a token into the target's cache and
    ``next()`` is the target's token after it. With a ``worker`` (the pipelined schedule) the append runs on that
    thread, so that the draft's next proposal overlaps it, and is waited for (a finalisation of its own) only where
    its token is needed."""

    def __init__(self, target: ModelState, clock: PhaseClock, worker: ThreadPoolExecutor | None = None):
        self.target, self.clock, self.worker, self.known = target, clock, worker, None

    def start(self, token: int) -> None:
        self.known = (self.worker.submit(next_token, self.target, [token]) if self.worker is not None
                      else next_token(self.target, [token]))

    def next(self) -> int:
        if isinstance(self.known, Future):
            with self.clock.phase(FINALIZE, self.target.device):
                self.known = self.known.result()
        return self.known


def _worker_init(threads: int) -> None:
    """The append worker's thread: all of torch's intra-op threads, and a CPU rehearsal's virtual devices."""
    torch.set_num_threads(threads)
    virtual.enter_in_thread()
