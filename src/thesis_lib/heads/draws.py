"""Seeded random draws whose generator may live on another device than the probabilities.

A benchmark run seeds one CPU ``torch.Generator`` per prompt, so that a run is reproducible whatever the
devices of target and draft. CUDA refuses a CPU generator for a CUDA tensor, so :func:`multinomial` draws on
the generator's device and hands the indices back on the probabilities' device: the same draws on a CPU and on
any GPU.
"""

from __future__ import annotations

import torch


def multinomial(probs: torch.Tensor, n: int, generator: torch.Generator | None, *,
                replacement: bool = False) -> torch.Tensor:
    """``n`` indices drawn from ``probs`` (``[V]``) with ``generator``, on ``probs``' device."""
    if generator is None or generator.device == probs.device:
        return torch.multinomial(probs, n, replacement=replacement, generator=generator)
    drawn = torch.multinomial(probs.to(generator.device), n, replacement=replacement, generator=generator)
    return drawn.to(probs.device)
