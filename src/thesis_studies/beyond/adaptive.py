"""FlashHead with adaptive probes: the probe count per row follows the cluster ranking.

Clusters whose unit-centroid score lies within ``margin * |h|`` of the best are probed, between ``min_probes``
and ``max_probes``: a clear winner costs few probes, a flat ranking many. Otherwise as FlashHead's greedy head
(special tokens always scored, ties to the lowest id); ``last_probes`` records each row's count.
"""

from __future__ import annotations

import math

import torch

from thesis_lib.errors import ConfigError
from thesis_lib.heads.flashhead import score_dtype


class AdaptiveFlashHead(torch.nn.Module):
    """A greedy FlashHead whose probe count per row follows the centroid-score margin (module docstring)."""

    on_flash_body = True  #: a runner drafts with it on the FlashHead draft's body, not the dense draft's

    def __init__(self, flash, *, margin: float, min_probes: int = 1, max_probes: int | None = None):
        super().__init__()
        max_probes = flash.n_probes if max_probes is None else max_probes
        if not 1 <= min_probes <= max_probes <= flash.n_clusters:
            raise ConfigError(f"need 1 <= min_probes <= max_probes <= C = {flash.n_clusters}, "
                              f"got {min_probes}, {max_probes}.")
        if not (isinstance(margin, (int, float)) and margin >= 0 and math.isfinite(margin)):
            raise ConfigError(f"margin must be a finite number >= 0, got {margin!r}.")
        self.flash, self.margin = flash, float(margin)
        self.min_probes, self.max_probes = int(min_probes), int(max_probes)
        self.vocab_limit = flash.vocab_limit
        self.last_probes: list[int] = []
        self.calls = self.probes_used = 0

    @property
    def device(self) -> torch.device:
        return self.flash.device

    def extra_repr(self) -> str:
        return f"margin={self.margin}, probes={self.min_probes}..{self.max_probes}, C={self.flash.n_clusters}"

    @property
    def mean_probes(self) -> float | None:
        return self.probes_used / self.calls if self.calls else None

    def probes_for(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ranked clusters ``[S, max_probes]`` and the probe count of each row ``[S]``."""
        f = self.flash
        h = hidden.to(f.fast_centroids.dtype)
        scores, top = torch.topk(h @ f.fast_centroids.T, self.max_probes, dim=-1)
        scale = hidden.float().norm(dim=-1, keepdim=True)
        within = (scores[:, :1].float() - scores.float()) <= self.margin * scale
        counts = within.sum(-1).clamp(self.min_probes, self.max_probes)
        return top, counts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        f = self.flash
        top, counts = self.probes_for(hidden)
        acc = score_dtype(f.weight_perm.dtype)  # as FlashHead's torch paths: 16-bit rows widened to float32
        hf = hidden.to(acc)
        sp = (hf @ f.special_weight.to(acc).T).float() + f.special_bias  # [S, ns]
        out, used = [], counts.tolist()
        for i, p in enumerate(used):
            cl = top[i, :p]
            logits = (f.weight_perm[cl].to(acc) @ hf[i]).float() + f.slot_bias[cl]  # [p, b]
            scores = torch.cat([logits.reshape(-1), sp[i]])
            ids = torch.cat([f.tokens[cl].reshape(-1), f.special_ids])
            best = scores.max()
            out.append(torch.where(scores == best, ids, torch.full_like(ids, f.vocab_size)).min())
        self.last_probes = used
        self.calls += len(used)
        self.probes_used += sum(used)
        return torch.stack(out)
