"""A frequency-truncated vocabulary head (as FR-Spec), FlashHead's closest rival.

The draft scores only the ``n`` most frequent tokens plus the special tokens and takes the argmax; no other
token can be proposed. Frequencies are counted on the calibration prompts and the draft's own greedy
continuations of them (:func:`thesis_studies.beyond.heads.count_tokens`); unseen tokens rank by id (BPE merge
order). No centroid scoring per step, but the candidates cannot follow the context into a rare token.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch
from torch import nn

from thesis_lib.errors import ConfigError
from thesis_lib.models.packing import layer_bias
from thesis_lib.heads.dense import refined_argmax, refines


class TruncatedHead(nn.Module):
    """Greedy head over a fixed, sorted token subset: the argmax of their logits, ties to the lowest id. 16-bit
    rows on the CPU are refined as the dense head's (:func:`~thesis_lib.heads.dense.refined_argmax`); on a GPU
    the rounded logits decide."""

    def __init__(self, weight: torch.Tensor, token_ids: Sequence[int], *, bias: torch.Tensor | None = None,
                 vocab_limit: int | None = None):
        super().__init__()
        v = weight.shape[0]
        limit = v if vocab_limit is None else min(int(vocab_limit), v)
        ids = sorted({int(i) for i in token_ids if 0 <= int(i) < limit})
        if not ids:
            raise ConfigError("A truncated head needs at least one token inside the vocabulary.")
        idx = torch.tensor(ids, dtype=torch.long, device=weight.device)
        self.register_buffer("ids", idx, persistent=False)
        self.register_buffer("weight", weight.detach()[idx].contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach()[idx].float(), persistent=False)
        self.vocab_limit = limit

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def extra_repr(self) -> str:
        return f"tokens={self.ids.numel()}, vocab_limit={self.vocab_limit}"

    def candidates_per_step(self) -> int:
        return int(self.ids.numel())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        same = self.bias is None or self.bias.dtype == self.weight.dtype  # the float32 bias of a 16-bit head: added after
        logits = nn.functional.linear(hidden.to(self.weight.dtype), self.weight, self.bias if same else None)
        if not same:
            logits = logits.float() + self.bias
        if refines(self.weight):  # 16-bit logits tie by rounding: re-score the near ones, as the dense head does
            return self.ids[refined_argmax(self.weight, self.bias, hidden, logits)]
        return self.ids[logits.argmax(dim=-1)]


def ranked_tokens(counts: Counter, vocab: int) -> list[int]:
    """Every token id below ``vocab``: counted ones by count (ties by id), then the rest by id."""
    seen = sorted((t for t in counts if 0 <= t < vocab), key=lambda t: (-counts[t], t))
    rest = sorted(set(range(vocab)) - set(seen))
    return seen + rest


def frequency_head(loaded, counts: Counter, n_tokens: int, specials: Sequence[int] = (),
                   weight: torch.Tensor | None = None) -> TruncatedHead:
    """The truncated head of the ``n_tokens`` most frequent tokens plus ``specials``; ``weight``: the output
    embedding if the caller holds it already (a packed layer makes a dense copy on every read)."""
    limit = loaded.vocab_limit
    if not 1 <= n_tokens <= limit:
        raise ConfigError(f"the truncated head's token count must lie in 1..{limit} (got {n_tokens}).")
    out = loaded.model.get_output_embeddings()
    keep = ranked_tokens(counts, limit)[:n_tokens] + [int(s) for s in specials]
    weight = out.weight.detach() if weight is None else weight
    return TruncatedHead(weight, keep, bias=layer_bias(out), vocab_limit=limit)
