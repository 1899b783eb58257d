"""Lossless speculative *sampling*, the loop: target-only sampling and speculative sampling with a dense or FlashHead
draft, ordinary and deferred schedules (beyond the thesis, which is greedy throughout).

The rule (speculative sampling as published by Leviathan et al. and Chen et al.): the draft draws
``y_i ~ q_i``; the target scores the block once, giving ``p_i``; ``y_i`` is kept with probability
``min(1, p_i(y_i) / q_i(y_i))``; the first rejected position is replaced by a draw from the residual
``norm(max(0, p_i - q_i))``; after a fully accepted block the target's next distribution gives a bonus token.
Whatever ``q`` is, the emitted tokens are distributed exactly as target-only sampling's, provided ``q`` is the
distribution the draft token was really drawn from.

- :class:`Sampler` is the warp applied identically to ``p`` and ``q``: temperature, then top-k, then top-p
  (nucleus), then softmax, in float64.
- The dense draft's ``q`` is the warped softmax over the whole vocabulary. The FlashHead draft draws its probe
  clusters at random (softmax of centroid scores, without replacement) and then a token from the warped
  softmax over those clusters' tokens; its ``q`` is that candidate-restricted distribution (zero outside the
  candidates), conditional on the clusters drawn. The clusters are auxiliary randomness independent of the
  acceptance test, so the rule stays exact given them.
- Schedules as in :mod:`thesis_lib.decoding.greedy`: *ordinary* writes each round's final token into the target's
  cache with a one-token forward, which also yields ``p`` for the next round's first proposal (so a first
  proposal that is rejected needs no verify forward: a *skip*); *deferred* carries the final token to the
  front of the next verify batch.

All randomness comes from one ``torch.Generator`` (CPU), so a seeded run is reproducible.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from thesis_lib import extensions
from thesis_lib.bench.modes import Mode
from thesis_lib.decoding.clocks import PhaseClock
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import target_only
from thesis_lib.decoding.state import ModelState
from thesis_lib.decoding.rounds import check_request, emit_round, finish, prefill
from thesis_lib.decoding.stats import FINALIZE, PROPOSE, VERIFY, DecodeStats, Generation
from thesis_lib.errors import ConfigError
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.draws import multinomial

SCHEDULES = ("ordinary", "deferred")


@dataclass(frozen=True)
class Sampler:
    """Temperature, top-k and top-p, applied in that order to any logits (target's or draft's alike)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def check(self) -> "Sampler":
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature must be a finite number > 0 for sampling, got {self.temperature!r} "
                              "(temperature 0 is greedy decoding: use the greedy loops).")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ConfigError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}.")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1] or None, got {self.top_p!r}.")
        return self

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits (``-inf`` allowed: never chosen) -> ``[..., V]`` float64 probabilities."""
        x = logits.double() / self.temperature
        if self.top_k is not None and self.top_k < x.shape[-1]:
            kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))  # ties with the k-th value are all kept
        if self.top_p is not None and self.top_p < 1:
            sorted_x, order = torch.sort(x, dim=-1, descending=True)
            sorted_p = torch.softmax(sorted_x, dim=-1)
            before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each token
            drop_sorted = before >= self.top_p  # keep the smallest prefix reaching top_p (at least one token)
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            x = x.masked_fill(drop, float("-inf"))
        return torch.softmax(x, dim=-1)


def draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from the probability vector ``p`` (on the generator's device, see
    :func:`thesis_lib.heads.draws.multinomial`)."""
    return int(multinomial(p, 1, generator)[0])


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator | None) -> int | None:
    """One position of the rule: ``None`` if ``token`` (drawn from ``q``) is kept, else the replacement drawn
    from ``norm(max(0, p - q))``. ``p`` and ``q`` are ``[V]`` probability vectors (float64)."""
    q = q.to(p.device)  # the draft's q may come from another device than the target's p
    pt, qt = float(p[token]), float(q[token])
    if qt <= 0:
        raise ValueError(f"token {token} has draft probability 0: it cannot have been drawn from q")
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    if u < pt / qt:
        return None
    residual = (p - q).clamp_min(0)
    if float(residual.sum()) <= 0:  # only by rounding (p == q would have accepted)
        residual = p
    return draw(residual / residual.sum(), generator)


class SamplingModelDrafter(ModelDrafter):
    """A draft model that samples its proposals (dense head, or FlashHead when ``flash_head`` is given) and
    reports each proposal's exact distribution ``q`` as a ``[V]`` float64 vector. Cache handling
    (``begin``, ``observe``) is the greedy :class:`~thesis_lib.decoding.drafters.ModelDrafter`'s."""

    def __init__(self, model, sampler: Sampler, *, flash_head=None, vocab_limit: int | None = None,
                 vocab_size: int | None = None, name: str | None = None):
        self.sampler = sampler.check()
        self.dense = DenseGreedyHead.from_model(model, vocab_limit)
        super().__init__(model, head=self.dense, vocab_limit=vocab_limit,
                         name=name or ("flash" if flash_head is not None else "dense"))
        self.flash = flash_head
        self.vocab_size = vocab_size or self.dense.vocab_limit

    def _one(self, h: torch.Tensor, generator) -> tuple[int, torch.Tensor]:
        if self.flash is None:
            q = self.sampler.probs(self.dense.logits(h[None])[0])
            return draw(q, generator), q
        s = self.flash.sample(h, sampler=self.sampler, generator=generator)
        return int(s.token), s.dense(self.vocab_size)

    def propose(self, k: int, generator: torch.Generator | None = None) -> tuple[list[int], list[torch.Tensor]]:
        with torch.inference_mode():
            if k <= 0:  # nothing drafted: what the draft has not seen stays pending for the next block
                self._proposed = []
                return [], []
            feed: Sequence[int] = self.pending
            self.pending = []
            tokens, qs = [], []
            for _ in range(k):
                tok, q = self._one(self.state.hidden(feed)[-1], generator)
                tokens.append(tok)
                qs.append(q)
                feed = [tok]
            self._proposed = tokens  # the last one was never fed: the cache holds the first k - 1
            return tokens, qs


def target_probs(target: ModelState, head: DenseGreedyHead, ids, sampler: Sampler,
                 last_only: bool = False) -> torch.Tensor:
    """Feed ``ids`` to the target; ``[S, V]`` warped next-token distributions after each fed position, or only
    after the last (``[1, V]``: a prompt's prefill needs no other, and warping every position of a long prompt
    would cost memory and time in proportion to it)."""
    h = target.hidden(ids)
    return sampler.probs(head.logits(h[-1:] if last_only else h))


def sample_generate(target: ModelState, prompt_ids: Sequence[int], *, max_new_tokens: int, sampler: Sampler,
                    generator: torch.Generator | None = None, eos_ids: Sequence[int] = (),
                    clock: PhaseClock | None = None) -> Generation:
    """Target-only sampling with a KV cache (the reference distribution)."""
    with torch.inference_mode():
        check_request(max_new_tokens, prompt_ids)
        sampler.check()
        head = DenseGreedyHead.from_model(target.model, getattr(target.head, "vocab_limit", None))

        def next_token(ids) -> int:
            return draw(target_probs(target, head, ids, sampler, last_only=True)[0], generator)

        return target_only(target, prompt_ids, next_token, mode="baseline_sample", max_new_tokens=max_new_tokens,
                           eos_ids=eos_ids, clock=clock)


def speculative_sample(target: ModelState, drafter: SamplingModelDrafter, prompt_ids: Sequence[int], *, k: int,
                       max_new_tokens: int, sampler: Sampler, generator: torch.Generator | None = None,
                       eos_ids: Sequence[int] = (), schedule: str = "ordinary",
                       clock: PhaseClock | None = None) -> Generation:
    """Speculative sampling (see the module docstring); the draft must use the same ``sampler``.

    Invariant at the start of a round: ordinary -- the target's cache holds every emitted token and
    ``p_next`` is its distribution for the next position; deferred -- the cache holds all but ``final``."""
    with torch.inference_mode():
        if schedule not in SCHEDULES:
            raise ConfigError(f"Unknown sampling schedule {schedule!r}; use one of {', '.join(SCHEDULES)}.")
        check_request(max_new_tokens, prompt_ids, k)
        sampler.check()
        if getattr(drafter, "sampler", sampler) != sampler:
            raise ConfigError("The draft samples with other settings than the target: p and q must be warped alike.")
        deferred = schedule == "deferred"
        head = DenseGreedyHead.from_model(target.model, getattr(target.head, "vocab_limit", None))
        draft_device = getattr(getattr(drafter, "state", None), "device", "cpu")
        clock = clock or PhaseClock([target.device, draft_device])
        eos = frozenset(eos_ids)
        stats = DecodeStats(mode=f"{drafter.name}_{schedule}_sample", k=k)
        t0, t1, out, done = prefill(target, drafter, prompt_ids, clock, eos, max_new_tokens,
                                    lambda ids: draw(target_probs(target, head, ids, sampler, last_only=True)[0], generator))
        final = out[0]
        p_next = None
        if not done and not deferred:
            with clock.phase(FINALIZE):
                p_next = target_probs(target, head, [final], sampler)[-1]
            stats.append_calls += 1

        while not done:
            remaining = max_new_tokens - len(out)
            kk = min(k, remaining - 1)
            if kk == 0:  # one token left: drawn from the target itself
                if deferred:
                    with clock.phase(FINALIZE):
                        p_next = target_probs(target, head, [final], sampler)[-1]
                    stats.append_calls += 1
                out.append(draw(p_next, generator))
                stats.tail_tokens += 1
                break
            with clock.phase(PROPOSE, draft_device):
                y, qs = drafter.propose(kk, generator)
            with clock.phase(VERIFY, target.device):
                if deferred:
                    ps = target_probs(target, head, [final] + y, sampler)  # p for y_1..y_kk, then the bonus
                    stats.verify_calls += 1
                    verified = True
                else:
                    first = accept_or_resample(p_next, qs[0], y[0], generator)
                    if first is not None:  # skip: the first proposal is rejected before any verify forward
                        ps, verified = None, False
                        stats.skipped += 1
                    else:
                        ps = torch.cat([p_next[None], target_probs(target, head, y, sampler)])
                        stats.verify_calls += 1
                        verified = True
                if not verified:
                    n, correction = 0, first
                else:
                    n, correction = 1 if not deferred else 0, None
                    while n < kk:
                        replaced = accept_or_resample(ps[n], qs[n], y[n], generator)
                        if replaced is not None:
                            correction = replaced
                            break
                        n += 1
                    if correction is None:
                        correction = draw(ps[kk], generator)  # bonus token after a fully accepted block
            done = emit_round(stats, out, y, n, correction, kk, eos, max_new_tokens)
            with clock.phase(FINALIZE):
                # cache grew by kk (ordinary, verified) or kk + 1 (deferred); keep the accepted (and final)
                if verified:
                    target.crop(kk - n)
                if done:
                    break
                drafter.observe(n, correction)
                if deferred:
                    final = correction
                else:
                    p_next = target_probs(target, head, [correction], sampler)[-1]
                    stats.append_calls += 1
        return finish(stats, out, eos, clock, t0, t1)


def drafters(runner) -> dict:
    """The runner's sampling drafters (with its ``sampler``): dense, and FlashHead where it has the head."""
    return {name: SamplingModelDrafter(model, runner.sampler, flash_head=head, vocab_limit=runner.draft.vocab_limit)
            for name, (model, head) in runner.bodies().items()} if runner.sampler is not None else {}


def run(runner, mode: Mode, ids: Sequence[int], clock: PhaseClock | None = None) -> Generation:
    """``sample_baseline`` (target-only sampling) or speculative sampling with the dense or FlashHead draft (deferred
    schedule). Each prompt's draws are seeded from the runner's seed and the prompt, so a run is reproducible
    whatever the order of modes."""
    which = mode.schedule
    if runner.sampler is None:
        raise ConfigError("The sample_* modes need a sampler (Runner(..., sampler=Sampler(...))).")
    g = torch.Generator().manual_seed(runner.seed * 1_000_003 + zlib.crc32(repr(list(ids)).encode()))
    common = dict(max_new_tokens=runner.max_new_tokens, eos_ids=runner.eos, sampler=runner.sampler, generator=g,
                  clock=clock)
    if which == "baseline":
        return sample_generate(runner.t_state, ids, **common)
    drafter = runner.loop_drafters["sample"].get(which)
    if drafter is None:
        raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
    return speculative_sample(runner.t_state, drafter, ids, k=runner.k, schedule="deferred", **common)


def options(settings, modes) -> dict:
    """The runner's ``sampler`` from a run's warp (``temperature``, ``top_k``, ``top_p``), checked, where a mode
    samples (``modes``: parsed; a command without a warp gives none)."""
    if not hasattr(settings, "temperature") or not any(m.sampled for m in modes):
        return {}
    return {"sampler": Sampler(settings.temperature, settings.top_k, settings.top_p).check()}


LOOP = extensions.Loop(claims=lambda draft, schedule: draft == "sample", drafters=drafters, run=run, options=options)
