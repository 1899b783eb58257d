"""Greedy token selection from final hidden states: the dense LM head (thesis section 2.3).

A *head* maps hidden states ``h: [S, D]``, already moved to its ``device``, to greedy token ids ``[S]`` (a
tensor, no host sync); FlashHead (:mod:`thesis_lib.heads.flashhead`) has the same interface, so a drafter can
swap heads. The dense head takes the argmax over the first ``vocab_limit`` rows (padding never wins), ties
to the lowest id. ``greedy_confidence(hidden) -> (tokens, probs)`` adds each greedy token's softmax probability
(:func:`top_probability`), for :class:`thesis_lib.decoding.drafters.ModelDrafter`'s ``stop_below``; ``top(hidden,
r) -> (tokens [S, r], log-probabilities [S, r])`` the ``r`` best candidates, the greedy token first
(:func:`ranked`), for the token trees of :mod:`thesis_studies.trees.loop`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.packing import PackedLinear
from ..models.weight_only import WeightOnlyLinear


#: Candidates re-scored per position when 16-bit logits are refined (:func:`refined_argmax`).
REFINE_TOP = 8


class DenseGreedyHead(nn.Module):
    """``argmax(h @ W[:vocab_limit].T)`` per position, W the model's own output embedding. 16-bit weights on the
    CPU are *refined* by default (:func:`refined_argmax`): rounded logits often tie at the top, and the winner would
    then depend on whether one token or a block of K + 1 was forwarded. On a GPU no refinement."""

    def __init__(self, weight: torch.Tensor | None, vocab_limit: int | None = None, bias: torch.Tensor | None = None,
                 packed: nn.Module | None = None, refine: bool | None = None):
        super().__init__()
        rows = packed.out_features if packed is not None else weight.shape[0]
        limit = rows if vocab_limit is None else min(int(vocab_limit), rows)
        # A view of the first `limit` rows: no copy, and padding rows are out of reach.
        self.weight = None if weight is None else weight[:limit]
        self.bias = None if bias is None else bias[:limit]
        self.packed = packed  # a oneDNN-packed output layer (models.packing); its logits are cut to `limit`
        self.vocab_limit = limit
        if refine is None:
            refine = refines(self.weight)
        if refine and self.weight is None:
            raise ValueError("refining 16-bit logits needs the head's dense weight")
        self.refine = bool(refine)

    @classmethod
    def from_model(cls, model, vocab_limit: int | None = None) -> "DenseGreedyHead":
        out = model.get_output_embeddings()
        if isinstance(out, WeightOnlyLinear):  # float32 logits: nothing rounded to refine
            return cls(None, vocab_limit, out.packed_bias, packed=out, refine=False)
        if isinstance(out, PackedLinear):
            dense = out.dense_weight  # kept for 16-bit heads (refinement) and tied heads
            return cls(None if dense is None else dense.detach(), vocab_limit, out.packed_bias, packed=out)
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
        logits = self.logits(hidden)
        return self._refined(hidden, logits) if self.refine else logits.argmax(dim=-1)

    def greedy_confidence(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [S, D] -> (token ids [S], softmax probability of each [S])``."""
        raw = self.logits(hidden)
        logits = raw.float()
        tokens = self._refined(hidden, raw) if self.refine else logits.argmax(dim=-1)
        return tokens, top_probability(logits)

    def top(self, hidden: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [S, D] -> (token ids [S, r], log-probabilities [S, r])``: the greedy token, then the next best."""
        raw = self.logits(hidden)
        first = self._refined(hidden, raw) if self.refine else raw.argmax(dim=-1)
        return ranked(raw.float(), None, first, r)

    def _refined(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The greedy tokens of the unrounded logits (see the class docstring)."""
        return refined_argmax(self.weight, self.bias, hidden, logits)


def refines(weight: torch.Tensor | None) -> bool:
    """Whether a head with these rows refines its logits: 16-bit weights on the CPU (see :class:`DenseGreedyHead`)."""
    return weight is not None and weight.dtype in (torch.bfloat16, torch.float16) and weight.device.type == "cpu"


def refined_argmax(weight: torch.Tensor, bias: torch.Tensor | None, hidden: torch.Tensor,
                   logits: torch.Tensor) -> torch.Tensor:
    """Row indices ``[S]`` of the argmax of the unrounded ``hidden @ weight.T + bias``, given its 16-bit rounding
    ``logits [S, rows]``: rows within two rounding steps of the maximum (at most :data:`REFINE_TOP`) are
    re-scored in float32, the highest winning, the lowest row on an exact tie."""
    vals, ids = torch.topk(logits, min(REFINE_TOP, logits.shape[-1]), dim=-1)  # [S, T], descending
    vals = vals.float()
    top = vals[:, :1]
    near = vals >= top - top.abs() * 2.0 ** -6 - 1e-6  # within two rounding steps (bf16: 2^-7 relative each)
    rows = weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, -1).float()  # [S, T, D]
    exact = torch.einsum("std,sd->st", rows, hidden.reshape(ids.shape[0], -1).float())
    if bias is not None:
        exact = exact + bias.float()[ids]
    exact = exact.masked_fill(~near, float("-inf"))
    order = torch.argsort(ids, dim=-1)  # ascending ids: argmax's first maximum is the lowest id
    pick = torch.gather(exact, 1, order).argmax(dim=-1, keepdim=True)
    return torch.gather(torch.gather(ids, 1, order), 1, pick).squeeze(1)


def top_probability(scores: torch.Tensor) -> torch.Tensor:
    """``softmax(scores).max(-1)`` without forming the softmax: ``exp(max - logsumexp)``, float32."""
    scores = scores.float()
    return torch.exp(scores.amax(dim=-1) - torch.logsumexp(scores, dim=-1))


def ranked(scores: torch.Tensor, ids: torch.Tensor | None, first: torch.Tensor, r: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``r`` best candidates of each row: ``scores [S, n]`` float32 over candidate token ``ids [S, n]`` (None: the
    columns are the ids), each row's greedy token ``first [S]`` ranked first whatever its score's rounding, then the
    others by score. Returns their ids and log-probabilities under the softmax over the ``n`` candidates."""
    cols = torch.arange(scores.shape[-1], device=scores.device)
    ids = cols.expand_as(scores) if ids is None else ids
    is_first = ids == first[:, None]
    logz = torch.logsumexp(scores, dim=-1, keepdim=True)
    first_score = scores.masked_fill(~is_first, float("-inf")).amax(dim=-1, keepdim=True)
    vals, at = torch.topk(scores.masked_fill(is_first, float("-inf")), min(r, scores.shape[-1]) - 1, dim=-1)
    return torch.cat([first[:, None], ids.gather(1, at)], dim=1), torch.cat([first_score, vals], dim=1) - logz
