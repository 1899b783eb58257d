"""Virtual CUDA devices on a CPU: the GPU code path rehearsed with real numbers, device mix-ups caught.

Inside :func:`virtual_cuda` (or process-wide, with ``THESIS_LIB_VIRTUAL_CUDA=<n>`` set before import), tensors
keep their data on the CPU but carry a device tag that moves (``.to()``, ``.cuda()``, ``device=``) copy-free; an
operation mixing devices raises :class:`DeviceMismatch` by CUDA's rules. ``torch.cuda``'s synchronize, Event and
current_stream record the device asked about (``calls``), so a test can check what a timer synchronised.
Unlike ``torch._subclasses.FakeTensorMode`` (no data; no CUDA views in a CPU-only torch), decoding loops run
here with real numbers, comparable with a plain CPU run. Never active unless asked for.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

CPU = torch.device("cpu")
ENV = "THESIS_LIB_VIRTUAL_CUDA"
_REAL_DEVICE = torch._C.TensorBase.device


class DeviceMismatch(RuntimeError):
    """An operation mixed tensors that would sit on different devices."""


def _device(d) -> torch.device:
    if isinstance(d, int) and not isinstance(d, bool):
        return torch.device("cuda", d)
    d = torch.device(d)
    return torch.device("cuda", 0) if d.type == "cuda" and d.index is None else d


def device_of(t: torch.Tensor) -> torch.device:
    return getattr(t, "_virtual_device", None) or _REAL_DEVICE.__get__(t)


def _tensors(x, out: list) -> list:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)
    return out


def _tag(out, dev: torch.device):
    for t in _tensors(out, []):
        try:
            t._virtual_device = dev
        except (AttributeError, RuntimeError):  # some C-level results take no attributes
            pass
    return out


#: Operations whose tensor arguments may legitimately differ in device (they copy between devices).
_COPIES = {"copy_", "__setitem__", "to", "cpu", "cuda"}


class _Mode(TorchFunctionMode):
    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        target = None
        if kwargs.get("device") is not None:
            target = _device(kwargs["device"])
            kwargs["device"] = "cpu"
        if name == "to":
            rest = list(args[1:])
            for i, a in enumerate(rest):
                if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool)):
                    target, rest[i] = _device(a), "cpu"
                elif isinstance(a, torch.Tensor):
                    target = device_of(a)
            args = (args[0], *rest)
        elif name == "cuda":  # x.cuda(1), x.cuda(device=1) (that keyword already read above) or x.cuda()
            if len(args) > 1 and args[1] is not None:
                target = _device(args[1])
            return _tag(args[0].clone(), target if target is not None else _device(0))
        elif name == "cpu":
            return _tag(args[0].clone(), CPU)
        tensors = _tensors(args, []) + _tensors(kwargs, [])
        if name == "__getitem__":  # CUDA tensors accept CPU index tensors
            devices = {device_of(args[0])}
        else:
            devices = {device_of(t) for t in tensors if not (t.dim() == 0 and device_of(t) == CPU)}
        generator = kwargs.get("generator")
        if generator is not None and devices and generator.device not in devices:
            raise DeviceMismatch(f"{name}: a generator on {generator.device} draws for tensors on "
                                 f"{', '.join(sorted(map(str, devices)))}")
        if len(devices) > 1 and name not in _COPIES:
            raise DeviceMismatch(f"{name}: expected all tensors on one device, found "
                                 f"{', '.join(sorted(map(str, devices)))}")
        out = func(*args, **kwargs)
        if target is None:
            target = next(iter(devices)) if len(devices) == 1 else (device_of(tensors[0]) if tensors else CPU)
        if name == "to" and out is args[0] and device_of(out) != target:
            out = out.clone()  # a move makes a new tensor on the real device too
        return _tag(out, target)


class _Event:
    def __init__(self, calls: list, enable_timing: bool = False, **_):
        self.calls, self.at, self.device = calls, None, None

    def record(self, stream=None):
        self.device = getattr(stream, "device", None)
        self.calls.append(("event.record", self.device))
        self.at = time.perf_counter()

    def synchronize(self):
        self.calls.append(("event.synchronize", self.device))

    def elapsed_time(self, end: "_Event") -> float:
        return 1000.0 * (end.at - self.at)


class _Stream:
    def __init__(self, device):
        self.device = device


_MODES: list = []  # the active rehearsal's mode: torch keeps function modes per thread, so workers enter it anew


def enter_in_thread() -> None:
    """Enter the active rehearsal (if any) in the calling thread, which torch starts without the caller's modes:
    the initializer of a worker thread that runs model code."""
    for mode in _MODES[-1:]:
        mode.__enter__()


@contextlib.contextmanager
def virtual_cuda(n: int = 2) -> Iterator[list]:
    """Rehearse with ``n`` virtual CUDA devices; yields the list of recorded ``torch.cuda`` clock calls."""
    calls: list = []
    saved = {k: getattr(torch.cuda, k) for k in ("synchronize", "Event", "current_stream", "device_count",
                                                 "get_device_name")}
    torch.Tensor.device = property(device_of)
    torch.Tensor.is_cuda = property(lambda t: device_of(t).type == "cuda")
    torch.cuda.synchronize = lambda device=None: calls.append(("synchronize", _device(0 if device is None else device)))
    torch.cuda.Event = lambda *a, **k: _Event(calls, *a, **k)
    torch.cuda.current_stream = lambda device=None: _Stream(_device(0 if device is None else device))
    torch.cuda.device_count = lambda: n
    torch.cuda.get_device_name = lambda device=None: "virtual CUDA device (CPU rehearsal)"
    mode = _Mode(calls)
    _MODES.append(mode)
    try:
        with mode:
            yield calls
    finally:
        _MODES.remove(mode)
        del torch.Tensor.device, torch.Tensor.is_cuda
        for k, v in saved.items():
            setattr(torch.cuda, k, v)


def place(module: torch.nn.Module, device) -> torch.nn.Module:
    """Put a module's parameters and buffers on a virtual device (their data stays where it is)."""
    d = _device(device)
    for t in (*module.parameters(), *module.buffers()):
        t._virtual_device = d
    return module


def active() -> bool:
    """Whether this process rehearses on virtual CUDA devices."""
    return isinstance(torch.Tensor.__dict__.get("device"), property)


_PROCESS: list = []  # the process-wide rehearsal's context (kept alive: closing it would end the rehearsal)


def enable_from_environment() -> None:
    """Enter :func:`virtual_cuda` for the rest of the process if ``THESIS_LIB_VIRTUAL_CUDA`` names a count."""
    n = os.environ.get(ENV)
    if n and not active():
        context = virtual_cuda(int(n))
        context.__enter__()
        _PROCESS.append(context)
