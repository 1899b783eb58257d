"""Memory: the bytes each part of a mode holds, counted from the tensors themselves, and the
peak resident memory of each mode's run.

- :func:`tensor_bytes`: the bytes of every distinct tensor storage a module holds (parameters, buffers, and tensors
  kept as plain attributes, such as a weight-only layer's dense rows), each storage once (a tied head and its
  embedding share one).
- :func:`flashhead_bytes`: FlashHead's own tensors by name (centroids, permuted rows, token ids, assignments, the
  special tokens' rows) beside the dense head it replaces.
- :func:`kv_bytes`: the KV cache one sequence holds after L tokens, read from a real cache.
- :func:`peak_rss`: the process's peak resident memory during a call, with the kernel's peak counter reset before
  it (Linux ``/proc/self/clear_refs``; None where it cannot be reset), and on a GPU torch's peak allocation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

import torch

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _storages(module: torch.nn.Module) -> dict[int, int]:
    """data pointer -> bytes of every tensor storage below ``module``."""
    seen: dict[int, int] = {}
    for m in module.modules():
        tensors = list(m._parameters.values()) + list(m._buffers.values())
        tensors += [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            if t is not None and t.numel():
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return seen


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of the distinct tensor storages ``module`` holds (module docstring)."""
    return sum(_storages(module).values())


def flashhead_bytes(head, dense: torch.nn.Module) -> dict:
    """FlashHead's tensors by buffer name, their total, and the bytes of the ``dense`` head they stand in for (its
    storages; shared with the input embedding where the head is tied)."""
    parts = {name: b.untyped_storage().nbytes() for name, b in head.named_buffers() if b is not None and b.numel()}
    return {"tensors": parts, "total": sum(parts.values()), "dense_head": tensor_bytes(dense)}


@torch.inference_mode()
def kv_bytes(state, ids: Sequence[int]) -> dict:
    """The KV cache a :class:`~thesis_lib.decoding.state.ModelState` holds after ``ids``: bytes in all, per token."""
    state.reset()
    state.hidden(list(ids))
    total = sum(t.untyped_storage().nbytes() for layer in state.cache.layers for t in (layer.keys, layer.values))
    state.reset()
    return {"tokens": len(ids), "bytes": total, "per_token": total / len(ids)}


def _kib(field: str) -> int | None:
    try:
        found = re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def peak_rss(fn: Callable[[], object], device: str = "cpu") -> dict:
    """``fn()``'s peak resident bytes (the process's, models included) and the resident bytes before it; on a CUDA
    ``device`` also the peak and the starting bytes torch allocated there."""
    cuda = str(device).startswith("cuda") and torch.cuda.is_available()  # a rehearsal's virtual GPU: host only
    before = _kib("VmRSS")
    try:
        _CLEAR.write_text("5")  # resets VmHWM to the current resident size
        reset = True
    except OSError:
        reset = False
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    fn()
    out = {"before": before, "peak": _kib("VmHWM") if reset else None}
    if cuda:
        out.update(device_before=start, device_peak=torch.cuda.max_memory_allocated(device))
    return out
