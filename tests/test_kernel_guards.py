"""Every entry point of the C++ kernel module (``models/csrc``) refuses a bad tensor before it reads a raw pointer:
each tensor argument on the meta device (and on CUDA where there is one), in float64, non-contiguous, expanded and
with each size 0 in turn; a negative and a huge ``start``, ``N`` and probe count; a zero dimension. A refusal is a
Python error that names the function and the argument; a non-contiguous or expanded tensor the kernel copies may
instead give the result of its contiguous copy, bit for bit. The cases run in a child process, so a crash fails the
entry points it reaches (with the case it died on) instead of ending the test session."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from thesis_lib.models import weight_only as wo

pytestmark = pytest.mark.skipif(not wo.available(), reason="the project's CPU kernel cannot be built here")

ENTRY_POINTS = ("pack", "pack_dynamic", "linear", "linear_dynamic", "linear_dynamic4", "rms_norm", "rotary",
                "attend_one", "attend_causal", "flash_greedy", "compact_layers")
HUGE = 2 ** 63 - 1  # start + n and N + a block's rows overflow int64
#: sizes of 0 given to several tensors at once, so that only the size a kernel divides or steps by is wrong: the
#: name the refusal must give, and (argument, dimension) of each tensor narrowed to it
JOINT_ZEROS = {
    "rms_norm": ("x's last dimension", (("x", -1), ("w", 0))),
    "linear": ("x's width", (("x", 1), ("packed", 0))),
    "linear_dynamic": ("x's width", (("x", 1), ("packed", 0))),
    "linear_dynamic4": ("x's width", (("x", 1), ("packed", 0), ("scales", 0))),
    "attend_one": ("k's head count", (("k", 1), ("v", 1))),
    "attend_causal": ("the head width", (("q", 3), ("k", 3), ("v", 3))),
    "flash_greedy": ("rows' slots per cluster", (("rows", 1), ("slot_bias", 1), ("tokens", 1))),
}


def valid_calls(k) -> dict[str, dict]:
    """Each entry point's arguments, in order and by name, for a call that succeeds."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    def int8(n, width):
        return torch.randint(-127, 128, (n, width), dtype=torch.int8, generator=g)

    levels = torch.randint(-7, 8, (32, 64), dtype=torch.int8, generator=g)
    p4, s4 = wo.pack_int4(levels, r(32, 2).abs().bfloat16())
    D, h, hkv, d, inter = 32, 2, 1, 16, 32  # one int8-dynamic layer of a compact step
    none = torch.empty(0)

    def product(n, width):
        return [k.pack_dynamic(int8(n, width)), r(n).abs() / 100, none]

    layer = [r(D), *product(h * d + 2 * hkv * d, D), r(d), r(d), *product(D, h * d), r(D), *product(2 * inter, D),
             *product(D, inter)]
    return {
        "pack": {"w": r(8, 32).bfloat16()},
        "pack_dynamic": {"w": int8(32, 64)},
        "linear": {"x": r(3, 32), "packed": k.pack(int8(8, 32)), "N": 8, "scale": r(8).abs(), "bias": r(8), "path": 0},
        "linear_dynamic": {"x": r(3, 64), "packed": k.pack_dynamic(int8(32, 64)), "N": 32, "scale": r(32).abs(),
                           "bias": r(32), "path": 0},
        "linear_dynamic4": {"x": r(3, 64), "packed": p4, "N": 32, "scales": s4, "bias": r(32), "path": 0},
        "rms_norm": {"x": r(2, 3, 16), "w": r(16), "eps": 1e-6},
        "rotary": {"q": r(1, 4, 3, 8), "k": r(1, 2, 3, 8), "cos": r(1, 3, 8), "sin": r(1, 3, 8)},
        "attend_one": {"q": r(1, 4, 1, 8), "k": r(1, 2, 5, 8), "v": r(1, 2, 5, 8), "scale": 0.35},
        "attend_causal": {"q": r(1, 4, 2, 8), "k": r(1, 2, 6, 8), "v": r(1, 2, 6, 8), "scale": 0.35, "start": 3},
        "flash_greedy": {"h": r(2, 16), "centroids": r(4, 16), "rows": r(4, 3, 16), "slot_bias": r(4, 3),
                         "tokens": torch.arange(12).view(4, 3), "special_w": r(1, 16), "special_b": r(1),
                         "special_ids": torch.tensor([12]), "n_probes": 2, "sentinel": -1, "path": 0},
        "compact_layers": {"x": r(1, 2, D), "cos": r(1, 2, d), "sin": r(1, 2, d), "keys": [r(1, hkv, 8, d)],
                           "values": [r(1, hkv, 8, d)], "weights": layer,
                           "dims": [h, hkv, d, h * d, hkv * d, hkv * d, inter, 0], "start": 3, "eps": 1e-6,
                           "scale": 0.25, "path": 0},
    }


def _tensors(args: dict):
    """(name, key, index) of every tensor argument, list elements included (index None for a plain argument)."""
    for key, v in args.items():
        if isinstance(v, torch.Tensor):
            yield key, key, None
        elif isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            yield from ((f"{key}[{i}]", key, i) for i in range(len(v)))


def _non_contiguous(t):
    out = torch.empty(*t.shape, 2, dtype=t.dtype)[..., 0]
    return out.copy_(t)


def _expanded(t):
    return t.reshape(-1)[:1].view([1] * t.dim()).expand(t.shape)


def cases(entry: str, args: dict):
    """(case, argument name, the arguments, what may happen): ``refused``, the error names the argument;
    ``refused or same``, that or the result of the arguments with that tensor made contiguous; ``no crash``, an
    error or a result."""
    def with_(key, i, value):
        new = {k: ([x.clone() for x in v] if isinstance(v, list) and v and isinstance(v[0], torch.Tensor)
                   else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        if key is None:
            pass
        elif i is None:
            new[key] = value
        else:
            new[key][i] = value
        return new

    devices = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
    for name, key, i in _tensors(args):
        t = args[key] if i is None else args[key][i]
        for device in devices:
            yield f"{name} on {device}", name, with_(key, i, t.to(device)), "refused"
        yield f"{name} in float64", name, with_(key, i, t.double()), "refused"
        if t.numel() >= 2:
            yield f"{name} non-contiguous", name, with_(key, i, _non_contiguous(t)), "refused or same"
            e = _expanded(t)
            yield f"{name} expanded", name, (with_(key, i, e), with_(key, i, e.contiguous())), "refused or same"
        for dim, size in enumerate(t.shape):
            if size:
                yield f"{name} with dimension {dim} of size 0", name, with_(key, i, t.narrow(dim, 0, 0)), "no crash"
    if entry in JOINT_ZEROS:
        name, narrowed = JOINT_ZEROS[entry]
        new = with_(None, None, None)
        for key, dim in narrowed:
            new[key] = new[key].narrow(dim, 0, 0)
        yield f"{name} of 0", name, new, "refused"
    for key in ("start", "N", "n_probes"):
        if key in args:
            for bad in (-1, 0, HUGE) if key != "start" else (-1, HUGE):
                yield f"{key} = {bad}", key, with_(key, None, bad), "refused"
    for j in range(7 if "dims" in args else 0):
        dims = list(args["dims"])
        dims[j] = 0
        yield f"dims[{j}] = 0", f"dims[{j}]", with_("dims", None, dims), "refused"
    if "dims" in args:  # a query width that is not heads x head width
        dims = list(args["dims"])
        dims[3] += 16
        yield "dims' widths", "dims'", with_("dims", None, dims), "refused"
    if entry == "linear":  # N x K past int64: N under the cap, x one row of 2^23 columns, bf16 weights (no scale)
        big = {**with_("N", None, 2 ** 40), "x": torch.zeros(1, 2 ** 23), "scale": None, "bias": None,
               "packed": args["packed"].view(torch.bfloat16)}
        yield "N x K overflows", "N x K", big, "refused"


def _outcome(fn, name: str, run, expect: str) -> str:
    """What happened to one case, as ``ok`` or a line saying what went wrong."""
    call, same_as = (run if isinstance(run, tuple) else (run, None))
    try:
        got = fn(*call.values())
    except (RuntimeError, ValueError, TypeError) as e:
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        if expect == "no crash" or f"{fn.__name__}: {name}" in said:
            return "ok"
        return f"refused without naming {name}: {said}"
    if expect == "refused":
        return "accepted"
    if expect == "refused or same":
        want = fn(*(same_as or _contiguous(call)).values())
        pairs = zip(got, want) if isinstance(got, list) else [(got, want)]
        if not all(torch.equal(a, b) for a, b in pairs):
            return "accepted with a result that differs from its contiguous copy's"
    return "ok"


def _contiguous(args: dict) -> dict:
    return {k: ([x.contiguous() for x in v] if isinstance(v, list) and v and isinstance(v[0], torch.Tensor)
                else v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def main() -> None:
    """The child: every case of every entry point, a JSON line each (the case is announced before it runs)."""
    k = wo.kernel()
    for entry, args in valid_calls(k).items():
        fn = getattr(k, entry)
        fn(*_contiguous(args).values())  # the valid call runs
        for case, name, run, expect in cases(entry, args):
            print(json.dumps({"entry": entry, "case": case}), flush=True)
            print(json.dumps({"entry": entry, "case": case, "outcome": _outcome(fn, name, run, expect)}), flush=True)


@pytest.fixture(scope="module")
def outcomes():
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, lines


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_entry_point_refuses_every_bad_tensor_without_crashing(outcomes, entry):
    done, lines = outcomes
    mine = [line for line in lines if line["entry"] == entry]
    assert mine, f"the child process died before {entry} (exit {done.returncode}): {done.stderr[-800:]}"
    started = [line["case"] for line in mine if "outcome" not in line]
    finished = {line["case"]: line["outcome"] for line in mine if "outcome" in line}
    died = [c for c in started if c not in finished]
    assert not died, f"{entry} crashed the process on {died[0]!r} (exit {done.returncode})"
    wrong = {c: o for c, o in finished.items() if o != "ok"}
    assert not wrong, f"{entry}: {len(wrong)} of {len(finished)} cases: {wrong}"
    assert len(finished) >= 5


if __name__ == "__main__":
    main()
