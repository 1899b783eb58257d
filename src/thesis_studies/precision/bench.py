"""The CPU precision, measured side by side in one process: what float32, bfloat16 and a 4-bit target cost per step.

What this module knows:

- :func:`check`: the precisions asked for exist here (bfloat16 needs native bf16 in oneDNN), before any model loads.
- :func:`verify_curve`: one greedy forward (body and dense head, tokens read back) of a block of n tokens
  (n = 1 .. ``max_block``) after a real prompt's context, for the target and the draft of every precision, timed
  side by side by the core's forward-cost timer; medians, and the ratio of each block to one step (the cost curve
  speculative decoding lives on: a flat curve makes a verified block nearly free).
- :func:`end_to_end`: per prompt, target-only greedy decoding (our loop), transformers' greedy ``generate()``,
  dense-draft and FlashHead deferred speculative decoding, in every precision, interleaved the same way; the
  speculative output is checked against the same precision's target-only output (lossless) and the precisions' outputs
  are compared with each other (how often bf16 rounding changes the greedy text).
- :func:`bandwidth`: the rate at which each one-token step reads its weights (:func:`step_bytes` over the step's
  time) beside the rate a plain sum reads matrices of the same shapes and precision, timed repetition by
  repetition between the steps (:func:`read_probe`), and a 1 GiB sum before and after (:func:`stream_gbps`): a
  step reading at about the sum's rate is bound by memory, so a number format can shorten it by at most the
  ratio of its bytes (times the ratio of the two formats' read rates).

Every precision runs the same embedded pair with oneDNN-packed layers (:mod:`thesis_lib.models.packing`), so the
ratios are the precision's effect alone. ``int4`` is the thesis' kind of target (its Qwen3-32B is AWQ 4-bit): the
target's body quantised to 4-bit weights in groups of :data:`INT4_GROUP` (torchao's weight-only int4 for CPU,
which runs torch's ``_weight_int4pack_mm_for_cpu``; round-to-nearest, no AWQ calibration), its head and the whole
draft in packed bfloat16 (torchao is in the default environment). It is a different model from the
bf16 one (its greedy text parts from bf16's after a dozen or so tokens on a real prompt), so its losslessness is
checked against its own target-only output. The document (:func:`run`) records the CPU, torch and thread count.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Sequence

import torch

from thesis_lib.decoding.clocks import alternating
from thesis_lib.decoding.costs import forward_curves
from thesis_lib.errors import ConfigError
from thesis_lib.models.weight_only import FORMATS, kernel

#: int4's quantisation group (weights per scale and zero point along the input dimension)
INT4_GROUP = 128


def int4_available() -> bool:
    """Whether torchao (the optional ``int4`` extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


#: the number formats: float32, bfloat16, the weight-only formats (bf16 or int8 weights, float32 products:
#: :mod:`thesis_lib.models.weight_only`) and the 4-bit target (its body int4, head and draft bf16)
PRECISIONS = ("float32", "bfloat16", "bfloat16-weights", "int8-weights", "int8-dynamic", "int4")


def dtype_of(precision: str) -> str:
    """The torch dtype name a precision runs its float layers in (int4: bfloat16 activations; the weight-only
    formats: float32)."""
    return "bfloat16" if precision == "int4" else "float32" if precision in FORMATS else precision


def stored_of(precision: str) -> str:
    """The torch dtype name of a precision's body weights (what a step reads)."""
    stored = {p: str(d).replace("torch.", "") for p, d in FORMATS.items()} | {"int4": "bfloat16"}
    return stored.get(precision, precision)


def emulates_bf16(precisions: Sequence[str]) -> bool:
    """Whether measuring ``precisions`` here runs bf16 layers without native dot products (bfloat16, or int4's
    bf16 activations and draft, on a CPU where oneDNN cannot pack bf16)."""
    from thesis_lib.models.packing import bf16_packing_available

    return any(dtype_of(p) == "bfloat16" for p in precisions) and not bf16_packing_available()


def check(precisions: Sequence[str], max_block: int, reps: int, int4_group: int = INT4_GROUP, *,
          emulated: bool = False) -> None:
    """Refuse what cannot be measured here, before any weights load. ``emulated``: bfloat16 on a CPU without native
    bf16 dot products is measured anyway (stock bf16 layers, oneDNN cannot pack them): what ``DTYPE: auto``
    declines there, timed so that the choice rests on a measurement of this machine too."""
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise ConfigError(f"Unknown precision(s) {bad or precisions}: use some of {', '.join(PRECISIONS)}.")
    if emulates_bf16(precisions) and not emulated:
        raise ConfigError("bfloat16 is not native on this CPU (no AVX-512 BF16 in oneDNN's view): it would be "
                          "emulated and measure the emulation (int4 runs its activations and draft in bf16). "
                          "Use --precisions float32, or --emulated to time the emulation on purpose.")
    if int4_group not in (32, 64, 128, 256):
        raise ConfigError(f"--int4-group must be 32, 64, 128 or 256 (torch's int4 CPU kernel), got {int4_group}.")
    if any(p in FORMATS for p in precisions):
        kernel()  # a clear error (no compiler, no AVX2) before any weights load
    if "int4" in precisions and not int4_available():
        raise ConfigError("--precisions int4 needs torchao (not installed): pip install -e '.[int4]' (torchao 0.18.0).")
    if max_block < 1 or reps < 1:
        raise ConfigError(f"--max-block and --reps must be >= 1 (got {max_block}, {reps}).")


def verify_curve(states: dict[str, object], context: Sequence[int], *, max_block: int = 13, reps: int = 15,
                 progress: bool = True, desc: str = "verify curve", after_steps=None) -> dict:
    """``states``: name -> :class:`~thesis_lib.decoding.state.ModelState`, each prefilled with ``context`` and timed
    by :func:`~thesis_lib.decoding.costs.forward_curves` side by side (body and dense head, tokens read back; one
    warm-up repetition dropped). Returns name -> {"ms": {n: median ms}, "over_step": {n: ms[n] / ms[1]}}.
    ``after_steps(r)``, if given, runs after the one-token steps of every measured repetition ``r`` (the reads
    :func:`read_probe` times beside them)."""
    curves = forward_curves(states, context, range(1, max_block + 1), reps=reps, warmup=1, after_steps=after_steps,
                            progress=progress, desc=desc)
    out = {}
    for name, curve in curves.items():
        ms = {n: 1e3 * s for n, s in curve.items()}
        out[name] = {"ms": ms, "over_step": {n: ms[n] / ms[1] for n in ms}}
    return out


def end_to_end(runners: dict[str, object], prompts: list[list[int]], *, progress: bool = True) -> dict:
    """``runners``: precision -> :class:`~thesis_lib.bench.runner.Runner`. Per prompt and precision (order
    alternating), the seconds, tokens, rounds and emitted tokens of ``baseline``, ``hf_greedy``, ``dense_deferred``
    and ``flash_deferred``."""
    from thesis_lib.progress import tqdm

    modes = ("baseline", "hf_greedy", "dense_deferred", "flash_deferred")
    names = list(runners)
    for name in names:  # warm-up: one short run of each mode, not recorded
        for mode in modes:
            runners[name].run(mode, prompts[0][:16])
    rows = []
    with tqdm(total=len(prompts) * len(names), desc="end to end", disable=not progress, unit="run") as bar:
        for i, ids in enumerate(prompts):
            row = {"prompt": i, "prompt_tokens": len(ids)}
            for name in alternating(names, i):
                for mode in alternating(modes, i):
                    g = runners[name].run(mode, ids)
                    row[f"{name}/{mode}"] = {"seconds": g.stats.ttft_s + g.stats.decode_s, "tokens": g.tokens,
                                             "rounds": g.stats.rounds, "emitted": sum(g.stats.emitted)}
                bar.update()
            rows.append(row)
    summary = {}
    for name in names:
        base = [r[f"{name}/baseline"] for r in rows]
        per = {}
        for mode in modes[1:]:
            got = [r[f"{name}/{mode}"] for r in rows]
            per[mode] = {
                "speedup_median": statistics.median(b["seconds"] / g["seconds"] for b, g in zip(base, got)),
                "speedup_pooled": sum(b["seconds"] for b in base) / sum(g["seconds"] for g in got),
                "equal_outputs": sum(g["tokens"] == b["tokens"] for b, g in zip(base, got)),
                "mean_emitted": (sum(g["emitted"] for g in got) / sum(g["rounds"] for g in got)
                                 if sum(g["rounds"] for g in got) else None),
            }
        summary[name] = {"baseline_ms_per_token": 1e3 * sum(b["seconds"] for b in base)
                         / max(1, sum(len(b["tokens"]) for b in base)), "vs_baseline": per}
    if len(names) > 1:
        a, b = names[0], names[1]
        summary["same_text_across_precisions"] = sum(r[f"{a}/baseline"]["tokens"] == r[f"{b}/baseline"]["tokens"]
                                                     for r in rows)
    for r in rows:  # the documents keep token counts, not token lists
        for key, v in r.items():
            if isinstance(v, dict):
                v["tokens"] = len(v["tokens"])
    return {"prompts": len(prompts), "rows": rows, "summary": summary}


def step_bytes(model) -> int | None:
    """Bytes of weights one greedy step reads: every linear layer's weight once (oneDNN-packed or plain, head
    included), the input embedding not (a step reads one row of it); None where a weight is a quantised tensor
    subclass (the int4 body), whose bytes this does not count."""
    from thesis_lib.models.packing import PackedLinear

    total = 0
    from thesis_lib.models.weight_only import WeightOnlyLinear

    for m in model.modules():
        if isinstance(m, WeightOnlyLinear):
            total += m.weight_bytes()
        elif isinstance(m, PackedLinear):
            total += m.in_features * m.out_features * torch.empty((), dtype=m.out_dtype).element_size()
        elif isinstance(m, torch.nn.Linear):
            w = m.weight.detach()
            if type(w) is not torch.Tensor:
                return None
            total += w.numel() * w.element_size()
    return total


def stream_gbps(*, gib: float = 1.0, reps: int = 9) -> float:
    """What this machine reads from memory per second with torch's threads: the median over ``reps`` sums of a
    ``gib`` GiB float32 tensor (far larger than any cache), in GB/s. A decode step whose weights stream at about
    this rate is bound by memory, and then halving the weights' bytes can at most halve its time."""
    from thesis_lib.bench.timing import interleaved

    x = torch.ones(int(gib * 2 ** 28), dtype=torch.float32)
    times = interleaved({"sum": lambda i: x.sum()}, 1, reps=reps, warmup=1, desc="read", progress=False)["sum"]
    return x.numel() * 4 / statistics.median(times) / 1e9


def read_probe(model, dtype: torch.dtype, *, min_bytes: int = 256 * 2 ** 20):
    """A read of the same kind of memory a step reads: one plain tensor per linear weight of one decoder layer of
    ``model`` (the head's excepted), each holding that weight's bytes in ``dtype``, repeated up to ``min_bytes``
    (far beyond any cache), each summed once as float32 words (a bf16 sum's conversion can be slower than the memory
    it reads; the bytes are what matters). Returns a function that does the read and returns ``(bytes, seconds)``.
    Timed beside the steps, repetition by repetition, because a shared machine's read rate drifts over minutes."""
    from thesis_lib.models.packing import PackedLinear
    from thesis_lib.models.weight_only import WeightOnlyLinear

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    shapes, seen = [], set()
    for name, m in model.named_modules():
        if m is head or not isinstance(m, (PackedLinear, WeightOnlyLinear, torch.nn.Linear)):
            continue
        layer = name.split(".mlp")[0].split(".self_attn")[0]
        if seen and layer not in seen:
            break  # one layer's shapes are enough
        seen.add(layer)
        shapes.append((m.out_features, m.in_features))
    size = torch.empty((), dtype=dtype).element_size()
    per = sum(o * i for o, i in shapes) * size
    if not per:
        raise ConfigError("read_probe: the model has no linear layers to imitate.")
    tensors = [torch.ones(-(-o * i * size // 4), dtype=torch.float32)  # each matrix's bytes; ones: no denormals
               for _ in range(-(-min_bytes // per)) for o, i in shapes]
    nbytes = sum(t.numel() for t in tensors) * 4

    def read() -> tuple[int, float]:
        t0 = time.perf_counter()
        for t in tensors:
            t.sum()
        return nbytes, time.perf_counter() - t0

    return read


def bandwidth(doc: dict, pairs: dict, before: float, after: float, reads: dict | None = None) -> dict:
    """The 1 GiB stream rate around the verify curves; the rate of :func:`read_probe` per precision, timed beside the
    steps (``reads``: precision -> GB/s per repetition); each model's weights per step over its one-token step time,
    and that over its precision's read rate (``step_share``: near 1, the step reads memory as fast as a plain sum of
    the same shapes does)."""
    reads = reads or {}
    out = {"stream_read_gbps": statistics.median([before, after]), "stream_before_gbps": before,
           "stream_after_gbps": after, "step_bytes": {}, "step_gbps": {},
           "read_gbps": {p: statistics.median(v) for p, v in reads.items() if v}, "step_share": {}}
    for p, pair in pairs.items():
        for role, lm in zip(("target", "draft"), pair):
            name = f"{role}/{p}"
            n = step_bytes(lm.model)
            out["step_bytes"][name] = n
            out["step_gbps"][name] = None if n is None else n / (doc["verify"][name]["ms"][1] / 1e3) / 1e9
            if n is not None:  # the floor: the step's bytes at the 1 GiB sum's rate; each block's time over it
                out.setdefault("floor_ms", {})[name] = n / out["stream_read_gbps"] / 1e6
                out.setdefault("over_floor", {})[name] = {k: ms / out["floor_ms"][name]
                                                          for k, ms in doc["verify"][name]["ms"].items()}
            fmt = stored_of(p)
            if role == "target" and out["step_gbps"][name] is not None and fmt in out["read_gbps"]:  # its shapes
                out["step_share"][name] = out["step_gbps"][name] / out["read_gbps"][fmt]
    return out


def run(target: str, draft: str, *, precisions: Sequence[str] = ("float32", "bfloat16"), prompts: list | None = None,
        context_prompt: int = 0, max_block: int = 13, reps: int = 15, e2e_prompts: int = 3, max_new_tokens: int = 32,
        k: int = 4, int4_group: int = INT4_GROUP, emulated: bool = False, progress: bool = True) -> dict:
    """Load the pair once per precision, then measure the verify curves and the end-to-end runs side by side."""
    from thesis_lib.decoding.state import ModelState
    from thesis_lib.heads.for_model import flashhead_for
    from thesis_lib.models import loading
    from thesis_lib.models.auto import auto_precision
    from thesis_lib.models.cpu import cpu_name, fast_bf16
    from thesis_lib.bench.prompts import demo_prompts, encode
    from thesis_lib.bench.environment import provenance
    from thesis_lib.bench.runner import Runner

    check(precisions, max_block, reps, int4_group, emulated=emulated)
    measured = provenance()  # the code and revision that make the numbers, taken before they are made
    prompts = prompts if prompts is not None else demo_prompts()
    if not 0 <= context_prompt < len(prompts) or e2e_prompts > len(prompts):
        raise ConfigError(f"{len(prompts)} prompts: --context-prompt {context_prompt} or --e2e-prompts {e2e_prompts} "
                          "is out of range.")
    t0 = time.perf_counter()
    pairs = {p: (int4_pair(target, draft, group_size=int4_group, progress=progress) if p == "int4"
                 else loading.load_pair(target, draft, dtype=p, progress=progress, draft_dtype="same"))
             for p in precisions}
    first = next(iter(pairs.values()))[0]
    context = encode(first.tokenizer, prompts[context_prompt].text)
    doc = {"measured": measured, "target": target, "draft": draft, "precisions": list(precisions), "context_tokens": len(context),
           "max_block": max_block, "reps": reps, "k": k, "max_new_tokens": max_new_tokens,
           "processor": cpu_name(), "machine": platform.machine(), "fast_bf16": fast_bf16(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           # bf16 layers that this CPU runs without native dot products (stock kernels, not oneDNN-packed)
           "emulated_bf16": emulates_bf16(precisions),
           "auto": dict(zip(("dtype", "reason"), auto_precision())),
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "kernels": {p: [lm.info.get("cpu_kernels") for lm in pair] for p, pair in pairs.items()},
           "attention": {p: [lm.info.get("attention") for lm in pair] for p, pair in pairs.items()}}
    states = {}
    for p, (t, d) in pairs.items():
        states[f"target/{p}"] = ModelState(t.model, vocab_limit=t.vocab_limit)
        states[f"draft/{p}"] = ModelState(d.model, vocab_limit=d.vocab_limit)
    # one read probe per number format
    probes = {stored_of(p): read_probe(pairs[p][0].model, getattr(torch, stored_of(p))) for p in precisions if p != "int4"}
    read_rates = {p: [] for p in probes}

    def read_all(r: int) -> None:  # beside the one-token steps, order alternating like theirs
        for p in alternating(list(probes)[::-1], r):
            nbytes, secs = probes[p]()
            read_rates[p].append(nbytes / secs / 1e9)

    before = stream_gbps()
    doc["verify"] = verify_curve(states, context, max_block=max_block, reps=reps, progress=progress,
                                 after_steps=read_all)
    del probes
    doc["bandwidth"] = bandwidth(doc, pairs, before, stream_gbps(), read_rates)
    del states
    if e2e_prompts:
        runners = {p: Runner(t, d, k=k, max_new_tokens=max_new_tokens, flash_head=flashhead_for(d, progress=progress))
                   for p, (t, d) in pairs.items()}
        ids = [encode(first.tokenizer, pr.text) for pr in prompts[:e2e_prompts]]
        doc["end_to_end"] = end_to_end(runners, ids, progress=progress)
    doc["int4"] = {"group_size": int4_group, "method": "torchao PrototypeInt4WeightOnlyConfig (weight-only, RTN)",
                   "quantised": "target body; head and draft bf16"} if "int4" in precisions else None
    if len(precisions) > 1 and "float32" in precisions:
        base = "float32"
        doc["ratios"] = {p: {"target_step": doc["verify"][f"target/{base}"]["ms"][1] / doc["verify"][f"target/{p}"]["ms"][1],
                             "draft_step": doc["verify"][f"draft/{base}"]["ms"][1] / doc["verify"][f"draft/{p}"]["ms"][1]}
                         for p in precisions if p != base}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    return doc


def int4_pair(target: str, draft: str, *, group_size: int = INT4_GROUP, progress: bool = True):
    """The target as ``<target>@int4`` loads it (body int4 weight-only, ``group_size`` weights per scale; head
    packed bf16; :func:`thesis_lib.models.loading.load_model`), the draft packed bf16."""
    from thesis_lib.models import loading
    from thesis_lib.models.specs import QUANT_SUFFIXES

    spec, saved = (target if target.endswith("@int4") else f"{target}@int4"), QUANT_SUFFIXES["int4"]
    QUANT_SUFFIXES["int4"] = {**saved, "group_size": int(group_size)}
    try:
        return loading.load_pair(spec, draft, dtype="bfloat16", progress=progress)
    finally:
        QUANT_SUFFIXES["int4"] = saved


def text(doc: dict) -> str:
    """The document as the command prints it."""
    lines = [f"{doc['processor']} ({doc['threads']} threads, torch {doc['torch']}); DTYPE auto here: "
             f"{doc['auto']['reason']}",
             f"context {doc['context_tokens']} tokens; medians of {doc['reps']} (ms, and over one step)"]
    names = list(doc["verify"])
    lines.append("n    " + "".join(f"{n:>24}" for n in names))
    for n in range(1, doc["max_block"] + 1):
        cells = [f"{doc['verify'][m]['ms'][n]:9.1f} ms ({doc['verify'][m]['over_step'][n]:4.2f}x)" for m in names]
        lines.append(f"{n:<5}" + "".join(f"{c:>24}" for c in cells))
    for p, r in doc.get("ratios", {}).items():
        lines.append(f"{p} over float32: target step {r['target_step']:.2f}x faster, draft step {r['draft_step']:.2f}x faster")
    bw = doc.get("bandwidth")
    if bw:
        lines.append(f"memory: a 1 GiB sum streams {bw['stream_read_gbps']:.1f} GB/s (before and after); beside the steps a "
                     "sum of one layer's shapes reads " + ", ".join(f"{p} {g:.1f} GB/s" for p, g in
                                                                  bw.get("read_gbps", {}).items()))
        lines.append("  a one-token step reads its weights at " + ", ".join(
            f"{n} {g:.1f} GB/s ({b / 1e9:.2f} GB" + (f", {100 * bw['step_share'][n]:.0f} % of the sum's rate)"
                                                    if n in bw.get("step_share", {}) else ")")
            for n, g, b in ((n, bw['step_gbps'][n], bw['step_bytes'][n]) for n in bw['step_gbps']) if g is not None))
    if bw and bw.get("over_floor"):
        lines.append(f"over the floor (the step's bytes at {bw['stream_read_gbps']:.1f} GB/s): block of n tokens")
        names = list(bw["over_floor"])
        lines.append("n    " + "".join(f"{n:>24}" for n in names))
        lines.append("floor" + "".join(f"{bw['floor_ms'][m]:>21.1f} ms" for m in names))
        for n in range(1, doc["max_block"] + 1):
            lines.append(f"{n:<5}" + "".join(f"{bw['over_floor'][m][n]:>23.2f}x" for m in names))
    e2e = doc.get("end_to_end")
    if e2e:
        lines.append(f"end to end, {e2e['prompts']} prompts, K = {doc['k']}, {doc['max_new_tokens']} new tokens:")
        for p in doc["precisions"]:
            s = e2e["summary"][p]
            parts = [f"{m}: {v['speedup_median']:.3f}x median, {v['speedup_pooled']:.3f}x pooled, "
                     f"{v['equal_outputs']}/{e2e['prompts']} outputs equal" for m, v in s["vs_baseline"].items()]
            lines.append(f"  {p}: baseline {s['baseline_ms_per_token']:.1f} ms/token; " + "; ".join(parts))
        if "same_text_across_precisions" in e2e["summary"]:
            lines.append(f"  target-only text equal across precisions: {e2e['summary']['same_text_across_precisions']}"
                         f"/{e2e['prompts']}")
    return "\n".join(lines)
