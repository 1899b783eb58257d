"""Prompt lookup (chapter 6): drafters that propose what followed an earlier occurrence of the sequence's last
tokens, alone (:class:`NgramDrafter`, no draft model at all) or in front of a model drafter (:class:`HybridDrafter`).
Both speak the core's drafter protocol (:mod:`thesis_lib.decoding.drafters`), so the thesis' chain loop runs them;
:func:`make` builds them for a :class:`~thesis_lib.bench.runner.Runner` (:data:`thesis_lib.extensions.DRAFTERS`).
"""

from __future__ import annotations

from typing import Sequence

from thesis_lib.decoding.clocks import PhaseClock
from thesis_lib.decoding.drafters import ModelDrafter


def _padded(block: list[int], k: int) -> list[int]:
    """``block`` repeated at its last token up to ``k`` proposals (a fixed K; the target rejects the rest)."""
    return block + [block[-1]] * (k - len(block))


class NgramDrafter:
    """Prompt lookup: proposes the tokens that followed the most recent earlier occurrence of the sequence's
    last n tokens (n from ``max_ngram`` down to ``min_ngram``), with no draft model at all (a zero-cost
    reference drafter). Where no n-gram matches, or the match runs out before ``k`` tokens, the
    block is padded by repeating its last token to ``k`` proposals (a fixed K, as the thesis' loop has; the
    target simply rejects what does not fit); with ``pad=False`` the block is what matched (at least one
    token). ``matched`` counts rounds that found a match."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, name: str = "ngram", pad: bool = True):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.name, self.pad = max_ngram, min_ngram, name, pad
        self.history: list[int] = []
        self._proposed: list[int] = []
        self.matched = self.rounds = 0

    def begin(self, context: Sequence[int]) -> None:
        self.history = list(context)
        self._proposed = []

    def counters(self) -> dict:
        return {"lookup_matched": self.matched, "lookup_tried": self.rounds}

    def lookup(self, k: int) -> list[int]:
        """Up to ``k`` tokens continuing the latest earlier match of the longest suffix that matches."""
        h = self.history
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            suffix = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):  # latest earlier occurrence first
                if h[start:start + n] == suffix:
                    return h[start + n:start + n + k]
        return []

    def propose(self, k: int) -> list[int]:
        if k <= 0:
            self._proposed = []
            return []
        found = self.lookup(k)
        self.rounds += 1
        self.matched += bool(found)
        block = found or self.history[-1:]
        self._proposed = _padded(block, k) if self.pad else block
        return self._proposed

    def observe(self, accepted: int, final_token: int) -> None:
        if not 0 <= accepted <= len(self._proposed):
            raise ValueError(f"accepted={accepted} outside 0..{len(self._proposed)}")
        self.history += self._proposed[:accepted] + [int(final_token)]
        self._proposed = []


class HybridDrafter:
    """Prompt lookup where the text repeats itself, the draft model everywhere else: a round whose last
    ``min_ngram``..``max_ngram`` tokens occurred before proposes what followed them, at no draft cost; other rounds
    ask the model. Tokens the model did not draft itself are fed to its
    cache on its next proposal, as the target's final token always is. ``lookup_rounds`` /
    ``model_rounds`` count where the proposals came from. ``pad=False``: a lookup block is what matched, not
    padded to ``k`` (with a model that stops early, so that K is only a cap: lookups then propose up to K
    tokens for free)."""

    def __init__(self, model: ModelDrafter, *, min_ngram: int = 2, max_ngram: int = 3, name: str = "hybrid",
                 pad: bool = True):
        self.model = model
        self.pad = pad
        self.ngram = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.name = name
        self._from_lookup = False
        self.lookup_rounds = self.model_rounds = 0

    @property
    def state(self):
        return self.model.state

    def counters(self) -> dict:
        return {"lookup_rounds": self.lookup_rounds, "model_rounds": self.model_rounds,
                "stopped_early": self.model.stopped_early}

    @property
    def clock(self) -> PhaseClock:
        """The clock a profiled model drafter charges its phases to (the caller sets it per generation)."""
        return self.model.clock

    @clock.setter
    def clock(self, clock: PhaseClock) -> None:
        self.model.clock = clock

    def begin(self, context: Sequence[int]) -> None:
        self.model.begin(context)
        self.ngram.begin(context)
        self._from_lookup = False

    def prefill(self) -> None:
        self.model.prefill()

    def propose(self, k: int) -> list[int]:
        found = self.ngram.lookup(k) if k > 0 else []
        self._from_lookup = bool(found)
        if found:
            self.lookup_rounds += 1
            block = _padded(found, k) if self.pad else found
        else:
            self.model_rounds += 1
            block = self.model.propose(k)
        self.ngram._proposed = list(block)
        return block

    def observe(self, accepted: int, final_token: int) -> None:
        block = self.ngram._proposed
        self.ngram.observe(accepted, final_token)
        if self._from_lookup:  # the model's cache never saw these: it feeds them with its next proposal
            self.model.pending += block[:accepted] + [int(final_token)]
        else:
            self.model.observe(accepted, final_token)


def make(runner, stop_below: float | None) -> dict:
    """The runner's prompt-lookup drafters: ``ngram`` and, with a FlashHead head, ``hybrid``; with ``stop_below``
    the ``hybrid`` whose model part stops at an unsure token and whose lookups are not padded (K is then a cap)."""
    out = {} if stop_below is not None else {"ngram": NgramDrafter()}
    if runner.flash_head is not None:
        model = runner.model_drafter("hybrid", runner.flash_model, runner.flash_head, stop_below)
        out["hybrid"] = HybridDrafter(model, pad=stop_below is None)
    return out
