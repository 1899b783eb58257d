"""Greedy token selection from final hidden states: the dense LM head (thesis section 2.3).

A *head* maps final hidden states ``h: [S, D]`` to greedy token ids ``[S]`` (a tensor, no host sync).
The dense head projects onto every row of the output embedding matrix (``V x D`` multiply-adds per
position) and takes the argmax over the first ``vocab_limit`` rows only: rows past the tokenizer's size are
padding and must never win. ``torch.argmax`` returns the first maximum, so ties go to the lowest token id,
the convention FlashHead's greedy head follows too.

The FlashHead head (:mod:`thesis_lib.heads.flashhead`) has the same call signature, so a drafter can swap one head
for the other without touching the transformer body.

Every head has a ``device``: hidden states computed elsewhere (on the CPU, or on the target's GPU) must be
moved there before the call.

``greedy_confidence(hidden) -> (tokens, probs)`` also gives the probability the head's softmax puts on its
greedy token (for FlashHead: the softmax over its candidates). A drafter that stops a block at a token it is
unsure of (:class:`thesis_lib.decoding.drafters.ModelDrafter`'s ``stop_below``) uses it; :func:`top_probability` is
the shared formula.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.packing import PackedLinear


class DenseGreedyHead(nn.Module):
    """``argmax(h @ W[:vocab_limit].T)`` for each position; W is the model's own output embedding."""

    def __init__(self, weight: torch.Tensor | None, vocab_limit: int | None = None, bias: torch.Tensor | None = None,
                 packed: nn.Module | None = None):
        super().__init__()
        rows = packed.out_features if packed is not None else weight.shape[0]
        limit = rows if vocab_limit is None else min(int(vocab_limit), rows)
        # A view of the first `limit` rows: no copy, and padding rows are out of reach.
        self.weight = None if weight is None else weight[:limit]
        self.bias = None if bias is None else bias[:limit]
        self.packed = packed  # a oneDNN-packed output layer (models.packing); its logits are cut to `limit`
        self.vocab_limit = limit

    @classmethod
    def from_model(cls, model, vocab_limit: int | None = None) -> "DenseGreedyHead":
        out = model.get_output_embeddings()
        if isinstance(out, PackedLinear):
            return cls(None, vocab_limit, packed=out)
        return cls(out.weight.detach(), vocab_limit, getattr(out, "bias", None))

    @property
    def device(self) -> torch.device:
        """Where the head's weight lives (a oneDNN-packed layer: the CPU)."""
        return self.weight.device if self.weight is not None else torch.device("cpu")

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden: [S, D] -> [S, vocab_limit]``"""
        if self.packed is not None:
            return self.packed(hidden)[..., : self.vocab_limit]
        return nn.functional.linear(hidden.to(self.weight.dtype), self.weight, self.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden: [S, D] -> token ids [S]``"""
        return self.logits(hidden).argmax(dim=-1)

    def greedy_confidence(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [S, D] -> (token ids [S], softmax probability of each [S])``."""
        logits = self.logits(hidden).float()
        return logits.argmax(dim=-1), top_probability(logits)


def top_probability(scores: torch.Tensor) -> torch.Tensor:
    """``softmax(scores).max(-1)`` without forming the softmax: ``exp(max - logsumexp)``, float32."""
    scores = scores.float()
    return torch.exp(scores.amax(dim=-1) - torch.logsumexp(scores, dim=-1))
