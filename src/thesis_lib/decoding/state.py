"""One model's decoding state: its transformer body, its KV cache, and a greedy head.

:class:`ModelState` runs tokens through the body with the cache and applies a head to the positions the
caller asks for. It knows nothing about drafts, targets or schedules: the loops
(:mod:`~thesis_lib.decoding.greedy`) and the drafters (:mod:`~thesis_lib.decoding.drafters`) decide what to feed and what to discard. Batch size is 1 throughout (the thesis'
latency setting).

Shape buckets (stock, unpacked float32 layers on x86 only): MKL computes 2, 3 or 7 rows as that many
matrix-vector products but 4, 5, 6 or 8 rows in one blocked kernel costing about two single rows, so a forward
over 3 new tokens is padded to 4 and one over 7 to 8 by repeating the last token (the padded positions come
last, so causal attention leaves the real ones unchanged; their cache entries are dropped at once).
``buckets={}`` turns this off; oneDNN-packed models (the CPU default) cost smoothly more per row and get none.

Where :mod:`~thesis_lib.models.compact` applies (the CPU default), tokens after a cache go through its direct calls
instead of the modules: the same values, bit for bit, in fewer operations.
"""

from __future__ import annotations

import time

from typing import Sequence

import torch
from transformers import DynamicCache

from ..heads.dense import DenseGreedyHead
from ..models import compact, fused
from ..models.packing import is_packed
from .clocks import synchronize

#: Block sizes padded up on CPU (see the module docstring); measured, not guessed.
CPU_BUCKETS = {3: 4, 7: 8}


class ModelState:
    """KV cache of one model over a token prefix; ``length`` is the number of cached positions."""

    def __init__(self, model, head: torch.nn.Module | None = None, vocab_limit: int | None = None,
                 buckets: dict[int, int] | None = None):
        self.model = model
        self.body = model.get_decoder()
        self.head = head if head is not None else DenseGreedyHead.from_model(model, vocab_limit)
        self.device = next(model.parameters()).device
        if buckets is None:
            buckets = CPU_BUCKETS if self.device.type == "cpu" and not is_packed(model) else {}
        self.buckets = dict(buckets)
        self.compact = compact.for_model(model)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.storage = compact.Storage()
        self.length = 0

    def hidden(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (appended after the cached prefix) through the body; return final hidden states ``[S, D]``."""
        if not torch.is_tensor(ids):
            ids = torch.tensor(list(ids), dtype=torch.long)
        ids = ids.reshape(1, -1).to(self.device)
        n = ids.shape[1]
        pad = self.buckets.get(n, n) - n
        if self.compact is not None and self.length and compact.ENABLED and fused.ENABLED and not pad:
            out = self.compact.hidden(ids, self.cache, self.storage)  # the same values, fewer calls
            self.length += n
            return out
        if pad > 0:
            ids = torch.cat([ids, ids[:, -1:].expand(1, pad)], dim=1)
        out = self.body(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.length += n
        if pad > 0:
            self.cache.crop(-pad)  # the padded positions' keys and values
        return out.last_hidden_state[0, :n]

    def hidden_masked(self, ids: Sequence[int], positions: Sequence[int], visible: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` after the cached prefix with their own position ids and a boolean mask ``visible [S, length
        + S]`` (what each new token attends to: cached positions and the new ones); their keys and values are
        appended to the cache in order. Returns final hidden states ``[S, D]`` (a token tree's forward)."""
        dev = self.device
        ids_t = torch.tensor([list(ids)], dtype=torch.long, device=dev)
        pos = torch.tensor([list(positions)], dtype=torch.long, device=dev)
        out = self.body(input_ids=ids_t, attention_mask=visible.to(dev)[None, None], position_ids=pos,
                        past_key_values=self.cache, use_cache=True)
        self.length += len(ids)
        return out.last_hidden_state[0]

    def keep(self, base: int, offsets: Sequence[int]) -> None:
        """Keep the cached positions before ``base`` and ``base + offsets`` (moved, in that order, to ``base``
        onwards); drop every other position from ``base`` on (a verified tree keeps its accepted path)."""
        if any(not 0 <= o < self.length - base for o in offsets) or base > self.length:
            raise ValueError(f"cannot keep {list(offsets)} after {base} of {self.length} cached positions")
        n = len(offsets)
        if list(offsets) != list(range(n)):
            idx = torch.tensor([base + o for o in offsets], dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                layer.keys[:, :, base:base + n] = layer.keys.index_select(2, idx)
                layer.values[:, :, base:base + n] = layer.values.index_select(2, idx)
        self.crop(self.length - base - n)

    def greedy(self, ids: Sequence[int] | torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed ``ids``; return the greedy next token after each fed position (``[S]``, or ``[1]`` if ``last_only``)."""
        h = self.hidden(ids)
        return self.head(h[-1:] if last_only else h)

    def timed_forward(self, ids: Sequence[int], head: bool = True) -> float:
        """Seconds of one greedy forward over ``ids`` after the cached prefix (tokens read back to the host, so
        the time includes the device's work), or with ``head=False`` of the body's alone (the device synchronised),
        then the cache as it was: a cost probe (:func:`thesis_lib.decoding.costs.forward_curves` runs it)."""
        synchronize(self.device)
        t0 = time.perf_counter()
        if head:
            self.greedy(list(ids)).tolist()
        else:
            self.hidden(list(ids))
            synchronize(self.device)
        dt = time.perf_counter() - t0
        self.crop(len(ids))
        return dt

    def crop(self, remove: int) -> None:
        """Discard the last ``remove`` cached positions (transformers 5: ``crop`` takes a negative count)."""
        if remove < 0 or remove > self.length:
            raise ValueError(f"cannot remove {remove} of {self.length} cached positions")
        if remove:
            self.cache.crop(-remove)
            self.length -= remove
