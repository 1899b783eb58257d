"""Drafters: what proposes the K candidate tokens of a speculative round (thesis sections 3.3 and 3.4).

The verify loop (:mod:`~thesis_lib.decoding.greedy`) only sees this protocol:

- ``begin(context)``: a new sequence; ``context`` is the prompt plus the first emitted token;
- ``prefill()`` (optional): take in the prompt now; the loops call it right after ``begin``, inside the prefill
  phase, so that the draft's prompt processing is timed with the target's, in TTFT (as transformers' assisted
  generation times it), and the decode phase holds the rounds alone;
- ``propose(k) -> list[int]``: 1 to ``k`` greedy proposals continuing everything emitted so far (fewer than
  ``k`` only where the drafter chose to stop early);
- ``observe(accepted, final_token)``: the target accepted the first ``accepted`` proposals and emitted
  ``final_token`` after them (its correction, or the bonus token after a fully accepted block).

:class:`ModelDrafter` is a draft *model*: a transformer body with a KV cache and a greedy head. With the
default :class:`~thesis_lib.heads.dense.DenseGreedyHead` it is the thesis' dense draft; passing a FlashHead head
gives the FlashHead draft with the same body (and, with a FlashHead checkpoint's body and the dense head,
the thesis' "dense shared" control).

With ``stop_below`` a model drafter ends its block at the first token whose probability under its own head
is below that threshold (that token is still proposed: its draft step is paid, and one more token in the
verify batch costs little). The block length then follows the draft's confidence token by token, at most
``k``; ``stopped_early`` counts the blocks it cut.

Tokens the draft has not yet run through its body wait in ``pending`` and are fed at the start of the next
proposal: the first emitted token on the first round (the prompt went in with :meth:`ModelDrafter.prefill`; without
that call, the first proposal feeds it too), then the target's final token (plus the draft's own last proposal
after a fully accepted block, whose cache entry was never written). This is the draft side of the
"append the final token" step; it costs the same in the ordinary and the deferred schedule.

:class:`ProfiledDrafter` proposes exactly what :class:`ModelDrafter` does and charges its work to finer
phases of a :class:`~thesis_lib.decoding.clocks.PhaseClock` (:data:`DRAFT_PHASES`): the prompt prefill, the
transformer body, the head, turning the proposals into Python ints (materialisation) and the cache
alignment after verification. Its extra clock reads (and, on CUDA, the synchronisations they need) are
instrumentation overhead, which is why the headline tables come from runs without it (Tables 4.7/4.8 come
from a separate profiled run, as in the thesis).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..errors import ConfigError
from .clocks import PhaseClock
from .state import ModelState

#: The profiled drafter's phases; all nest inside the loop's ``draft_propose`` / ``finalize_align``.
DRAFT_PHASES = ("draft_prefill", "draft_body", "draft_head", "draft_materialize", "draft_align")


def prefill_pending(drafter) -> None:
    """A model drafter's prefill: every pending token but the last through its body (``drafter._hidden``), only
    while nothing is cached; the last stays pending, so the first proposal is a one-token step."""
    with torch.inference_mode():
        if drafter.state.length == 0 and len(drafter.pending) > 1:
            drafter._hidden(drafter.pending[:-1])
            drafter.pending = drafter.pending[-1:]


class Drafter(Protocol):
    name: str

    def begin(self, context: Sequence[int]) -> None: ...

    def propose(self, k: int) -> list[int]: ...

    def observe(self, accepted: int, final_token: int) -> None: ...


class ModelDrafter:
    """A draft model proposing greedily with its body, KV cache and a (dense or FlashHead) head."""

    def __init__(self, model, head: torch.nn.Module | None = None, vocab_limit: int | None = None, name: str = "dense",
                 stop_below: float | None = None):
        self.state = ModelState(model, head=head, vocab_limit=vocab_limit)
        self.name = name
        if stop_below is not None:
            if not 0 < stop_below < 1:
                raise ConfigError(f"stop_below is a probability threshold in (0, 1), got {stop_below!r}.")
            if not hasattr(self.state.head, "greedy_confidence"):
                raise ConfigError(f"the {name} draft's head ({type(self.state.head).__name__}) gives no "
                                  "confidence, so it cannot stop a block early.")
        self.stop_below = stop_below
        self.stopped_early = 0
        self.pending: list[int] = []
        self._proposed: list[int] = []

    def begin(self, context: Sequence[int]) -> None:
        self.state.reset()
        self.pending = list(context)
        self._proposed = []

    def prefill(self) -> None:
        """Run the context but its last token through the body now (the prompt's prefill); the last token waits
        for the first proposal."""
        prefill_pending(self)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` greedy proposals (fewer where ``stop_below`` ends the block at an unsure token)."""
        with torch.inference_mode():
            if k <= 0:
                self._proposed = []
                return []
            # 1. feed what the draft has not seen (prompt, or the last final token), then draft greedily.
            #    Proposals stay tensors until the block is done: one host sync per round, not per token (a
            #    confidence stop reads each token's probability as it goes: the price of deciding per token).
            feed: Sequence[int] | torch.Tensor = self.pending
            self.pending = []
            drafted = []
            for _ in range(k):
                h = self._hidden(feed)
                if self.stop_below is None:
                    tok = self._head(h)  # [1]
                else:
                    tok, prob = self._head_confidence(h)
                drafted.append(tok)
                if self.stop_below is not None and float(prob[0]) < self.stop_below:
                    break
                feed = tok
            self.stopped_early += len(drafted) < k
            # The last proposal was never fed, so the cache holds all proposals but the last.
            self._proposed = self._materialize(drafted)
            return self._proposed

    # The steps of a proposal; the profiled drafter times each (same calls, in the same order).
    def _hidden(self, feed) -> torch.Tensor:
        return self.state.hidden(feed)[-1:]

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self.state.head(h)

    def _head_confidence(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.state.head.greedy_confidence(h)

    def _materialize(self, drafted: list[torch.Tensor]) -> list[int]:
        return torch.cat(drafted).tolist()

    def observe(self, accepted: int, final_token: int) -> None:
        k = len(self._proposed)
        if not 0 <= accepted <= k:
            raise ValueError(f"accepted={accepted} outside 0..{k}")
        # 4. discard the cache entries of rejected proposals (only the first k-1 were ever cached).
        self.state.crop(max(k - 1 - accepted, 0))
        if accepted == k and k > 0:
            self.pending.append(self._proposed[-1])  # accepted but never fed
        self.pending.append(int(final_token))
        self._proposed = []


class ProfiledDrafter(ModelDrafter):
    """A model drafter that charges prefill, body, head, materialisation and alignment to ``clock``.

    It runs :class:`ModelDrafter`'s one proposal loop (a confidence stop included) and times its steps, so it
    proposes the same tokens; ``clock`` is set by the caller for each generation (the loop's own clock, so the
    phases nest in its ``draft_propose``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = PhaseClock([self.state.device])

    def _hidden(self, feed) -> torch.Tensor:
        name = "draft_prefill" if self.state.length == 0 else "draft_body"
        with self.clock.phase(name, self.state.device):
            return super()._hidden(feed)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        with self.clock.phase("draft_head", self.state.device):
            return super()._head(h)

    def _head_confidence(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.clock.phase("draft_head", self.state.device):
            return super()._head_confidence(h)

    def _materialize(self, drafted: list[torch.Tensor]) -> list[int]:
        with self.clock.phase("draft_materialize", self.state.device):
            return super()._materialize(drafted)

    def observe(self, accepted: int, final_token: int) -> None:
        with self.clock.phase("draft_align", self.state.device):
            super().observe(accepted, final_token)


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
    """Prompt lookup where the text repeats itself, the draft model everywhere else: a round whose last ``min_ngram``..``max_ngram`` tokens occurred before proposes what followed
    them, at no draft cost; other rounds ask the model. Tokens the model did not draft itself are fed to its
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

    @property
    def stopped_early(self) -> int:
        return self.model.stopped_early

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
