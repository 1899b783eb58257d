"""The decoding loops: target-only greedy, and greedy speculative decoding with the ordinary or the deferred
schedule (thesis sections 2.2, 3.3 and 3.6.2).

Every loop returns a :class:`Generation`: the new token ids and a :class:`DecodeStats` record. Printing,
aggregation and benchmarking live elsewhere (``bench``); tokenisation too (``prompts``).

Greedy speculative decoding is lossless: its output equals target-only greedy output token for token,
because a draft token is kept only where it equals the target's own argmax at that position, and every
round ends with a token the target chose. The one caveat is floating point: the target scores a block of
tokens in one forward, and a K-token forward can round differently from K one-token forwards, so the two
loops can part ways where the target's top two logits are (almost exactly) tied. The tests check that
every divergence sits at such a near-tie.

Vocabulary of the stats (one word per concept, as in the thesis):

- a *round* drafts ``k >= 1`` tokens (fewer than K only near ``max_new_tokens``);
- ``accepted``: draft tokens the target confirmed; ``emitted``: tokens the round added to the output
  (accepted plus the target's correction or bonus token, cut at EOS);
- ``acceptance`` = accepted / drafted (the thesis' "acceptance rate"); ``mean_emitted`` = emitted per round
  (``tau``, which counts the target's token, as vLLM and Spec-Bench do);
- a *verify* call is one batched target forward over a drafted block; an *append* is a standalone one-token
  target forward that only writes the final token into the target's cache (the thesis' "finalize");
- ``skipped``: rounds whose first proposal already disagreed with the target's known next token, so the
  ordinary schedule did not run the verify forward;
- target-only decoding counts each decode-phase forward as an append (as the thesis' Table 4.9 does).

Schedules (``schedule=``): ``ordinary``; ``deferred``; ``pipelined`` (thesis section 3.6.1): the ordinary
schedule, but the standalone target append runs on a worker thread while the main thread lets the draft
catch up and propose the next block; the loop waits for the append only when it needs the target's next
token (the skip test and the verify forward). The tokens are those of the ordinary schedule.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from .drafters import Drafter
from .errors import ConfigError
from .profiling import PhaseClock
from .state import ModelState

#: Phase names (the thesis' Table 4.5 columns); all in seconds.
PREFILL, PROPOSE, VERIFY, FINALIZE = "prefill", "draft_propose", "target_verify", "finalize_align"
SCHEDULES = ("ordinary", "deferred", "pipelined")


@dataclass
class DecodeStats:
    """What one generation did and how long each phase took."""

    mode: str
    k: int = 0
    new_tokens: int = 0
    drafted: list[int] = field(default_factory=list)  # per round
    accepted: list[int] = field(default_factory=list)  # per round
    emitted: list[int] = field(default_factory=list)  # per round
    verify_calls: int = 0
    append_calls: int = 0
    skipped: int = 0
    tail_tokens: int = 0  # tokens emitted outside any round (the target's known last token)
    first_emit: int = 1  # tokens known at TTFT (1 here; transformers' assisted loop can deliver several)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)
    stopped_by: str = "max_new_tokens"  # or "eos"

    @property
    def rounds(self) -> int:
        return len(self.drafted)

    @property
    def zero_accept_rounds(self) -> int:
        return sum(1 for a in self.accepted if a == 0)

    @property
    def full_accept_rounds(self) -> int:
        return sum(1 for a, d in zip(self.accepted, self.drafted) if a == d)

    @property
    def acceptance(self) -> float | None:
        """accepted / drafted over all rounds (None without rounds)."""
        d = sum(self.drafted)
        return sum(self.accepted) / d if d else None

    @property
    def mean_emitted(self) -> float | None:
        """tokens emitted per round, the target's token included (tau)."""
        return sum(self.emitted) / len(self.emitted) if self.emitted else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens produced after TTFT, over the decode phase (TTFT excluded)."""
        n = self.new_tokens - self.first_emit
        return n / self.decode_s if n > 0 and self.decode_s > 0 else None

    @property
    def tpot_s(self) -> float | None:
        n = self.new_tokens - self.first_emit
        return self.decode_s / n if n > 0 else None

    @property
    def e2e_tokens_per_s(self) -> float | None:
        """All new tokens over TTFT plus decode time: comparable across loops however they split the two."""
        t = self.ttft_s + self.decode_s
        return self.new_tokens / t if t > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("rounds", "zero_accept_rounds", "full_accept_rounds", "acceptance", "mean_emitted",
                     "decode_tokens_per_s", "tpot_s", "e2e_tokens_per_s"):
            d[name] = getattr(self, name)
        return d


@dataclass
class Generation:
    tokens: list[int]
    stats: DecodeStats
    extra: dict = field(default_factory=dict)  # what a drafter counted about itself (see bench.sample_record)


def _check(max_new_tokens: int, prompt_ids: Sequence[int], k: int | None = None) -> None:
    if k is not None and (not isinstance(k, int) or k < 1):
        raise ConfigError(f"K (the block length) must be an integer >= 1, got {k!r}.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}.")
    if len(prompt_ids) == 0:
        raise ConfigError("The prompt is empty: at least one token is needed.")


def _cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


@torch.inference_mode()
def greedy_generate(target: ModelState, prompt_ids: Sequence[int], *, max_new_tokens: int,
                    eos_ids: Sequence[int] = (), clock: PhaseClock | None = None) -> Generation:
    """Target-only greedy decoding with a KV cache; prefill and first token are timed apart (TTFT)."""
    _check(max_new_tokens, prompt_ids)
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
    return _finish(stats, out, eos, clock, t0, t1)


def _finish(stats: DecodeStats, out: list[int], eos: frozenset[int], clock: PhaseClock, t0: float,
            t1: float) -> Generation:
    """Close the record: t0 = start, t1 = first token known, now = last token known."""
    t2 = clock.now()
    stats.new_tokens = len(out)
    stats.stopped_by = "eos" if out[-1] in eos else "max_new_tokens"
    stats.ttft_s, stats.decode_s = t1 - t0, t2 - t1
    stats.phase_s = clock.as_dict()
    return Generation(out, stats)


def _accepted_prefix(proposals: Sequence[int], target_tokens: Sequence[int]) -> int:
    """Length of the longest prefix on which the proposals equal the target's argmax tokens."""
    n = 0
    for y, t in zip(proposals, target_tokens):
        if y != t:
            break
        n += 1
    return n


def _emit(stats: DecodeStats, out: list[int], y: Sequence[int], n: int, correction: int, kk: int,
          eos: frozenset[int], max_new_tokens: int) -> bool:
    """Append a round's output (the ``n`` accepted proposals and the target's token, cut at EOS) and count
    it; returns whether generation is done."""
    emitted, hit_eos = _cut_at_eos(list(y[:n]) + [correction], eos)
    out.extend(emitted)
    stats.drafted.append(kk)
    stats.accepted.append(min(n, len(emitted)))
    stats.emitted.append(len(emitted))
    return hit_eos or len(out) >= max_new_tokens


@torch.inference_mode()
def speculative_generate(target: ModelState, drafter: Drafter, prompt_ids: Sequence[int], *, k: int,
                         max_new_tokens: int, eos_ids: Sequence[int] = (), deferred: bool = False,
                         schedule: str | None = None, clock: PhaseClock | None = None,
                         k_policy=None) -> Generation:
    """Greedy speculative decoding (thesis section 3.3) with the ordinary, deferred (section 3.6.2) or
    pipelined (section 3.6.1) schedule; ``deferred=True`` is short for ``schedule="deferred"``.
    ``k_policy`` (see :mod:`thesis_lib.adaptive`) chooses each round's block length; without it every
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
    _check(max_new_tokens, prompt_ids, k)
    if schedule != "pipelined":
        return _speculative(target, drafter, prompt_ids, k, max_new_tokens, eos_ids, schedule, clock, None, k_policy)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-append") as worker:
        return _speculative(target, drafter, prompt_ids, k, max_new_tokens, eos_ids, schedule, clock, worker,
                            k_policy)


@torch.inference_mode()
def _append(target: ModelState, token: int) -> int:
    """The standalone target append (inference mode is per thread, so the worker enters it itself)."""
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
    target.reset()
    t0 = clock.now()
    # 0. initial step: target prefill and first token
    with clock.phase(PREFILL):
        final = int(target.greedy(prompt_ids, last_only=True))
    t1 = clock.now()
    out = [final]
    done = final in eos or max_new_tokens == 1
    drafter.begin(list(prompt_ids) + [final])
    next_token = None
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
                n = _accepted_prefix(y, t)
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
                n = 1 + _accepted_prefix(y[1:], t[:-1])
                correction = t[n - 1]
                stats.verify_calls += 1
                cached_extra = kk - n
        # 3. emission: accepted proposals, then the target's correction or bonus token
        done = _emit(stats, out, y, n, correction, kk, eos, max_new_tokens)
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
    return _finish(stats, out, eos, clock, t0, t1)
