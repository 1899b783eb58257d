"""Where a decode step's time goes on this machine (``thesis-lib studies step-profile``).

A model's forward over a block of n tokens, then its greedy head, is split into parts by timing modules with
hooks (:class:`PartClock`; a CPU runs each module synchronously, so a module's wall time is its work):

- ``linear``: the decoder layers' linear layers, the weights' reads (``attn_linear`` and ``mlp_linear``);
- ``attention``: each attention module less its linear layers: rotary application, the KV cache's update and the
  attention itself;
- ``norms``, ``activation``, ``rotary_table`` (the cos/sin table, once a forward), ``embedding``;
- ``other``: the body's time outside all of these: what eager PyTorch and transformers spend between them
  (Python, dispatch, residual adds, masks, cache bookkeeping);
- ``head``: the greedy head on the block's last position (a draft) or on every position (a verify).

Beside each part its byte floor: the bytes it must read at the machine's stream rate
(:func:`~thesis_studies.precision.bench.stream_gbps`), and the aten operations one forward dispatches
(:func:`count_ops`). The hooks cost time of their own; :class:`StepCase` times the same forward without them,
interleaved, and reports both; the hooked forward goes through the modules (the compact step of
:mod:`~thesis_lib.models.compact` calls none), the bare one as decoding runs it. :func:`loop_overhead` sets the
target-only loop's time per token against its one-token forward and head. :data:`SWITCHES` names what a profile can
time with and without, side by side.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from thesis_lib.decoding.clocks import alternating
from thesis_lib.heads import cpu_kernels
from thesis_lib.models import compact, fused
from thesis_lib.models.packing import PackedLinear
from thesis_lib.models.weight_only import WeightOnlyLinear

#: the parts a forward is split into, in the order tables show them
PARTS = ("linear", "attn_linear", "mlp_linear", "attention", "norms", "activation", "rotary_table", "embedding",
         "other", "head")
#: what ``--compare`` can switch off for a step's twin (named "<step>, <switch> off"): each a context manager
#: factory taking on/off
SWITCHES = {"fused": fused.enabled, "compact": compact.enabled, "native": compact.native,
            "head-kernel": cpu_kernels.enabled}


class PartClock:
    """Forward hooks on a model's modules that add each module's wall time to its part (:data:`PARTS`); nested
    parts (an attention module's linear layers) are subtracted from their parent by :meth:`parts`."""

    def __init__(self, model):
        self.seconds: dict[str, float] = defaultdict(float)
        self.handles = []
        head = model.get_output_embeddings()
        for name, m in model.named_modules():
            kind = type(m).__name__
            if m is head or name.endswith(".stock"):  # a fused norm's stand-by: timed as its fused norm
                continue
            if isinstance(m, (WeightOnlyLinear, PackedLinear, torch.nn.Linear)):
                self._hook(m, "attn_linear" if ".self_attn." in name else "mlp_linear")
            elif kind.endswith("RMSNorm"):
                self._hook(m, "norms")
            elif kind.endswith("Attention"):
                self._hook(m, "attention_module")
            elif kind.endswith("RotaryEmbedding"):
                self._hook(m, "rotary_table")
            elif name.endswith("act_fn"):
                self._hook(m, "activation")
            elif isinstance(m, torch.nn.Embedding):
                self._hook(m, "embedding")

    def _hook(self, module, part: str) -> None:
        def pre(m, args):
            m._part_t0 = time.perf_counter()

        def post(m, args, out):
            self.seconds[part] += time.perf_counter() - m._part_t0

        self.handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def parts(self, body: float) -> dict[str, float]:
        """The seconds since the last :meth:`reset` by part, for a body that took ``body`` seconds."""
        s = self.seconds
        out = {"attn_linear": s["attn_linear"], "mlp_linear": s["mlp_linear"],
               "attention": s["attention_module"] - s["attn_linear"], "norms": s["norms"],
               "activation": s["activation"], "rotary_table": s["rotary_table"], "embedding": s["embedding"]}
        out["linear"] = out["attn_linear"] + out["mlp_linear"]
        out["other"] = body - sum(v for k, v in out.items() if k not in ("linear", "attn_linear", "mlp_linear")) \
            - out["linear"]
        return out

    def reset(self) -> None:
        self.seconds.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> int:
    """How many aten operations ``fn()`` dispatches (a custom kernel called through pybind is not one of them)."""
    with _Counter() as counter:
        fn()
    return counter.n


def floors(model, head, n: int, context: int, gbps: float) -> dict[str, float]:
    """Each part's byte floor in seconds at ``gbps``: the decoder's linear weights (once per forward, whatever
    ``n``), the KV cache read by attention (every layer's keys and values over ``context + n`` positions, float32),
    the head's rows (the dense head: every row; FlashHead: centroids and probed rows, once per position scored)."""
    cfg = model.config
    out_head = model.get_output_embeddings()
    lin = {"attn_linear": 0, "mlp_linear": 0}
    for name, m in model.named_modules():
        if m is out_head:
            continue
        if isinstance(m, WeightOnlyLinear):
            lin["attn_linear" if ".self_attn." in name else "mlp_linear"] += m.weight_bytes()
        elif isinstance(m, PackedLinear):
            size = torch.empty((), dtype=m.out_dtype).element_size()
            lin["attn_linear" if ".self_attn." in name else "mlp_linear"] += m.in_features * m.out_features * size
        elif isinstance(m, torch.nn.Linear):
            lin["attn_linear" if ".self_attn." in name else "mlp_linear"] += m.weight.numel() * m.weight.element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * (context + n) * 4
    if hasattr(head, "weight_perm"):  # FlashHead
        per_row = (head.fast_centroids.numel() * head.fast_centroids.element_size()
                   + head.candidates_per_step() * head.weight_perm.shape[-1] * head.weight_perm.element_size())
        head_bytes = per_row * n
    else:
        head_bytes = (out_head.weight_bytes() if isinstance(out_head, WeightOnlyLinear)
                      else out_head.weight.numel() * out_head.weight.element_size())
    rate = gbps * 1e9
    out = {k: v / rate for k, v in lin.items()}
    out["linear"] = out["attn_linear"] + out["mlp_linear"]
    out.update(attention=kv / rate, head=head_bytes / rate)
    return out


class StepCase:
    """One step to profile: the forward of the block ``ids[-n:]`` after the cached ``ids[:-n]`` on ``state``, then
    the head (on the last position for n = 1, else on every position, as a verify scores them). :meth:`once` runs
    it with the part hooks or without (``bare``); :meth:`result` gives the medians in ms."""

    def __init__(self, state, ids: list[int], n: int, off: str | None = None):
        self.state, self.n, self.block, self.off = state, n, ids[-n:], off
        state.reset()
        with self._switched(False):
            state.greedy(ids[:-n], last_only=True)
        self.context = len(ids) - n
        self.times: dict[str, list[float]] = defaultdict(list)

    def _switched(self, hooked: bool):
        """The step's variant: its switch (:data:`SWITCHES`) off where it has one; hooked, through the modules."""
        stack = contextlib.ExitStack()
        if self.off is not None:
            stack.enter_context(SWITCHES[self.off](False))
        if hooked:
            stack.enter_context(compact.enabled(False))
        return stack

    def once(self, hooked: bool, record: bool = True) -> None:
        with self._switched(hooked):
            self._once(hooked, record)

    def _once(self, hooked: bool, record: bool) -> None:
        clock = PartClock(self.state.model) if hooked else None
        try:
            t0 = time.perf_counter()
            hidden = self.state.hidden(self.block)
            t1 = time.perf_counter()
            self.state.head(hidden if self.n > 1 else hidden[-1:])
            t2 = time.perf_counter()
            self.state.crop(self.n)
        finally:
            if clock is not None:
                clock.remove()
        if not record:
            return
        prefix = "" if hooked else "bare_"
        self.times[prefix + "body"].append(t1 - t0)
        self.times[prefix + "head"].append(t2 - t1)
        if hooked:
            for part, secs in clock.parts(t1 - t0).items():
                self.times[part].append(secs)

    def ops(self) -> int:
        """The aten operations one bare forward of the block dispatches."""
        def forward():
            self.state.hidden(self.block)
            self.state.crop(self.n)

        with self._switched(False):
            return count_ops(forward)

    def result(self) -> dict:
        ms = {k: 1e3 * statistics.median(v) for k, v in self.times.items()}
        bare = [1e3 * (b + h) for b, h in zip(self.times["bare_body"], self.times["bare_head"])]
        return {"n": self.n, "context": self.context, "ms": ms, "aten_ops": self.ops(),
                "hook_cost_ms": ms["body"] - ms["bare_body"], "bare_ms": [round(x, 4) for x in bare]}


def loop_overhead(runner, case: StepCase, ids: list[int], *, reps: int) -> dict:
    """The target-only loop's time per token (``tpot``: decode seconds over the tokens after the first) against the
    target's bare one-token step and head (``case``), the two alternating ``reps`` times after a warm-up: what the
    loop spends per token beyond its model."""
    runner.run("baseline", ids)
    tpot, step = [], []
    for r in range(reps):
        for loop_first in alternating((False, True), r):
            if loop_first:
                tpot.append(runner.run("baseline", ids).stats.tpot_s)
            else:
                for _ in range(3):
                    case.once(hooked=False)
                step.append(case.times["bare_body"][-1] + case.times["bare_head"][-1])
    t, s = 1e3 * statistics.median(tpot), 1e3 * statistics.median(step)
    return {"tpot_ms": t, "step_ms": s, "beyond_ms": t - s, "beyond_share": (t - s) / t, "reps": reps,
            "new_tokens": runner.max_new_tokens}


def run(target, draft, flash, ids: list[int], *, blocks=(1, 2, 3, 4, 5, 6, 7, 8), reps: int = 15,
        new_tokens: int = 32, progress: bool = True, compare: tuple[str, ...] = (),
        other_drafts: dict | None = None) -> dict:
    """The whole profile on a loaded pair (target and draft :class:`~thesis_lib.models.loading.LoadedModel`,
    ``flash`` the draft's FlashHead): the draft's one-token step with the dense head and with FlashHead and the
    target's blocks, every step hooked and bare once per repetition, steps interleaved in alternating order, the
    stream rate read once per repetition beside them; each part beside its floor at the median rate; then the
    target-only loop's overhead per token. ``compare``: names of :data:`SWITCHES`; every step also with each
    switched off (its name ending ", <switch> off"), interleaved with the rest. ``other_drafts``: ``{label: (draft,
    flash)}``, the same draft in another precision, its two steps named "draft (<label>), ..." beside the rest."""
    from thesis_lib.bench.runner import Runner
    from thesis_lib.decoding.state import ModelState
    from thesis_lib.models.cpu import cpu_flags, cpu_name, fast_bf16
    from thesis_lib.progress import tqdm
    from thesis_studies.precision.bench import stream_gbps

    unknown = set(compare) - set(SWITCHES)
    if unknown:
        raise ValueError(f"cannot compare {sorted(unknown)}: the switches are {', '.join(SWITCHES)}")
    cases = {"draft, dense head": (draft, None, 1, None), "draft, FlashHead": (draft, flash, 1, None)}
    for label, (lm, fh) in (other_drafts or {}).items():
        cases.update({f"draft ({label}), dense head": (lm, None, 1, None), f"draft ({label}), FlashHead": (lm, fh, 1, None)})
    cases.update({f"target, block of {n}": (target, None, n, None) for n in blocks})
    for switch in compare:  # FlashHead's kernel changes the FlashHead steps only
        cases.update({f"{name}, {switch} off": (*case[:3], switch) for name, case in list(cases.items())
                      if case[3] is None and (switch != "head-kernel" or case[1] is not None)})
    doc = {"processor": cpu_name(), "fused": target.info.get("fused"), "compare": list(compare),
           "compact": compact.why_not(target.model) or "the compact step (models.compact)",
           "flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx"))),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "fast_bf16": fast_bf16(),
           "threads": torch.get_num_threads(), "torch": torch.__version__, "context": len(ids), "reps": reps,
           "target_kernels": target.info.get("cpu_kernels"), "draft_kernels": draft.info.get("cpu_kernels"),
           "other_drafts": {label: lm.info.get("cpu_kernels") for label, (lm, _) in (other_drafts or {}).items()}}
    with torch.inference_mode():
        steps = {}
        for name, (lm, head, n, off) in cases.items():
            # each step its own state (and cache): the draft's two heads share the model, not the cache
            state = ModelState(lm.model, head=head, vocab_limit=lm.vocab_limit) if head is not None else \
                ModelState(lm.model, vocab_limit=lm.vocab_limit)
            steps[name] = StepCase(state, ids, n, off=off)
        names, readings = list(steps), []
        for r in tqdm(range(3 + reps), desc="step profile", disable=not progress):
            for name in alternating(names[::-1], r):
                for hooked in alternating((False, True), r):
                    steps[name].once(hooked, record=r >= 3)
            if r >= 3:  # the read rate drifts on a shared machine: read beside the steps, every repetition
                readings.append(stream_gbps(gib=0.5, reps=3))
        gbps = statistics.median(readings)
        doc.update(stream_gbps=gbps, stream_gbps_range=[min(readings), max(readings)], steps={})
        for name, case in steps.items():
            lm = cases[name][0]
            part = case.result()
            part["floor_ms"] = {k: 1e3 * v for k, v in
                                floors(lm.model, case.state.head, case.n, case.context, gbps).items()}
            doc["steps"][name] = part
        runner = Runner(target, draft, k=4, max_new_tokens=new_tokens)
        doc["loop"] = loop_overhead(runner, steps["target, block of 1"], ids, reps=max(3, reps // 3))
    return doc


def table_rows(doc: dict) -> list[dict]:
    """One row per step: total, each part and the rest, in ms, and each part's floor."""
    rows = []
    for name, part in doc["steps"].items():
        ms, floor = part["ms"], part["floor_ms"]
        rows.append({"step": name, "ms (bare)": ms["bare_body"] + ms["bare_head"], "ms (hooked)": ms["body"] + ms["head"],
                     **{p: ms[p] for p in PARTS}, **{f"{p} floor": floor[p] for p in ("linear", "attention", "head")},
                     "aten ops": part["aten_ops"]})
    return rows


def text(doc: dict) -> str:
    """The document as ``thesis-lib studies step-profile`` prints it."""
    cols = ("linear", "attention", "norms", "activation", "other", "head")
    lines = [f"step profile on {doc['processor']} ({doc['threads']} threads), stream {doc['stream_gbps']:.1f} GB/s "
             f"(median; {doc['stream_gbps_range'][0]:.1f}-{doc['stream_gbps_range'][1]:.1f}); "
             "ms, medians; [floor] = the part's bytes at the stream rate",
             f"{'step':<31}{'bare':>8}{'hooked':>8}" + "".join(f"{c:>15}" for c in cols) + f"{'aten ops':>10}"]
    for r in table_rows(doc):
        cells = []
        for c in cols:
            floor = r.get(f"{c} floor")
            cells.append(f"{r[c]:7.2f}" + (f" [{floor:5.2f}]" if floor is not None else " " * 8))
        lines.append(f"{r['step']:<31}{r['ms (bare)']:8.2f}{r['ms (hooked)']:8.2f}" + "".join(f"{c:>15}" for c in cells)
                     + f"{r['aten ops']:10d}")
    for name, step in doc["steps"].items():
        for switch in SWITCHES:
            off = doc["steps"].get(f"{name}, {switch} off")
            if off is not None:
                lines.append(f"{name}: {statistics.median(off['bare_ms']) / statistics.median(step['bare_ms']):.3f}x "
                             f"as fast as with {switch} off (medians)")
    loop = doc["loop"]
    lines.append(f"target-only loop: {loop['tpot_ms']:.2f} ms per token against a one-token step of {loop['step_ms']:.2f} "
                 f"ms: {loop['beyond_ms']:.2f} ms ({100 * loop['beyond_share']:.0f} %) beyond the model")
    return "\n".join(lines)
