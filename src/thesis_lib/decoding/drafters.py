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

That is the one drafter interface of this project: every drafter speaks it, and every drafter with a model is a
:class:`ModelDrafter` (the profiled one below; the studies' sampling drafter, whose ``propose`` also takes the
generator and returns each proposal's distribution; their tree drafter, asked for a tree's nodes and told the
accepted path), so the cache, its pending tokens and the prompt's prefill are written once.

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

    def counters(self) -> dict:
        return {"stopped_early": self.stopped_early}

    def begin(self, context: Sequence[int]) -> None:
        self.state.reset()
        self.pending = list(context)
        self._proposed = []

    def prefill(self) -> None:
        """Run the context but its last token through the body now (the prompt's prefill), only while nothing is
        cached; the last token waits for the first proposal, a one-token step."""
        with torch.inference_mode():
            if self.state.length == 0 and len(self.pending) > 1:
                self._hidden(self.pending[:-1])
                self.pending = self.pending[-1:]

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
