"""The live explorer: :func:`generate_marked` (one generation, as the explorer and chapter 3 show it) and the
ipywidgets panel :class:`Explorer` that ``thesis-lib explore`` serves (:mod:`thesis_lib.book.live`).
"""

from __future__ import annotations

import html
import statistics
import threading
import time

import torch

from ..bench.modes import parse, variant
from ..bench.prompts import encode
from ..bench.runner import Runner
from ..bench.timing import head_ms
from ..decoding.clocks import PhaseClock
from ..decoding.greedy import greedy_generate
from . import figures

#: What the panel offers: target-only decoding, the thesis' four speculative modes, chapter 6's prompt lookup
#: and lookup + FlashHead hybrid, and chapter 8's token trees (K deep, the width slider's nodes per depth).
EXPLORER_MODES = ("flash_deferred", "dense_deferred", "flash_ordinary", "dense_ordinary", "baseline",
                  "ngram_deferred", "hybrid_deferred", "flash_tree", "dense_tree")
MODE_LABELS = {"flash_deferred": "FlashHead, deferred", "dense_deferred": "dense, deferred",
               "flash_ordinary": "FlashHead, ordinary", "dense_ordinary": "dense, ordinary",
               "baseline": "target only", "ngram_deferred": "prompt lookup", "hybrid_deferred": "lookup + FlashHead",
               "flash_tree": "FlashHead tree", "dense_tree": "dense tree"}
K_MAX, WIDTH_MAX = 10, 4


def generate_marked(target, draft, flash_head, prompt_text: str, *, mode: str, k: int, max_new_tokens: int,
                    probes: int | None = None, baseline=None, trace: bool = False, thinking: bool | None = None,
                    runner: Runner | None = None, warmup: bool = False, width: int = 1) -> dict:
    """One generation of ``mode``: tokens and their origins, speed, acceptance, head latency, whether it equals
    target-only output (``baseline``: one to reuse). ``runner``: one to reuse (K and the token budget are this
    call's). ``warmup``: run it untimed first, so the head's compilations for a new probe count (one per input shape)
    are not timed. A tree mode grows a tree K deep and ``width`` nodes wide (the variant ``<mode>@k<K>w<width>``)."""
    if probes is not None and flash_head is not None:
        flash_head.with_probes(probes)
    runner = runner or Runner(target, draft, k=k, max_new_tokens=max_new_tokens, flash_head=flash_head)
    runner.max_new_tokens = max_new_tokens
    ids = encode(target.tokenizer, prompt_text, thinking=thinking)
    parsed = parse(mode)
    kind, schedule = parsed.draft, parsed.schedule
    with torch.inference_mode():
        if baseline is None:
            if warmup:  # target-only decoding's first call on these shapes is not timed either
                greedy_generate(runner.t_state, ids, max_new_tokens=max_new_tokens, eos_ids=runner.eos)
            baseline = greedy_generate(runner.t_state, ids, max_new_tokens=max_new_tokens, eos_ids=runner.eos)
        if kind == "baseline":
            gen, clock, drafter = baseline, None, None
        else:
            name = variant(mode, k, width=width if schedule == "tree" else None)
            drafter = runner.drafters[kind]  # the chain drafter of that draft: its head is the one timed below
            if warmup:
                runner.run(name, ids)
            clock = PhaseClock([runner.t_state.device] + ([drafter.state.device] if hasattr(drafter, "state") else []),
                               trace=trace)
            gen = runner.run(name, ids, clock=clock)
    head_ms_ = None
    model_drafter = drafter if hasattr(drafter, "state") else getattr(drafter, "model", None)
    if model_drafter is not None and hasattr(model_drafter, "state"):
        with torch.inference_mode():  # the draft's hidden state after the last emitted token
            if schedule == "tree":  # the tree drafter ran, not this one: its cache takes the text first
                model_drafter.state.reset()
                model_drafter.state.hidden(list(ids) + gen.tokens[:-1])
            hidden = model_drafter.state.hidden([gen.tokens[-1]])[-1:]
        head_ms_ = head_ms(model_drafter.state.head, hidden, rows=1, reps=20, warmup=1)
    s = gen.stats
    origins = figures.token_origins(s) if kind != "baseline" else ["target"] * len(gen.tokens)
    return {"mode": mode, "k": k if kind != "baseline" else None, "width": width if schedule == "tree" else None,
            "probes": getattr(flash_head, "n_probes", None) if kind in ("flash", "hybrid") else None,
            "tokens": list(gen.tokens), "origins": origins, "html": figures.tokens_html(target.tokenizer, gen.tokens, origins),
            "decode_tokens_per_s": s.decode_tokens_per_s, "baseline_tokens_per_s": baseline.stats.decode_tokens_per_s,
            "acceptance": s.acceptance, "mean_emitted": s.mean_emitted, "rounds": s.rounds,
            "verify_calls": s.verify_calls, "append_calls": s.append_calls,
            "lossless": list(gen.tokens) == list(baseline.tokens), "head_ms": head_ms_,
            "events": clock.events if clock is not None else [], "phase_s": dict(s.phase_s), "baseline": baseline}


def _num(x, fmt: str) -> str:
    return "n/a" if x is None or x != x else format(x, fmt)


def summary_html(r: dict, seconds: float) -> str:
    """The result's header line and figures, then the marked text (what the browser test reads)."""
    speed, base = r["decode_tokens_per_s"], r["baseline_tokens_per_s"]
    ratio = speed / base if speed and base else None
    head = f"<b>{html.escape(MODE_LABELS.get(r['mode'], r['mode']))}</b>" + (f", K = {r['k']}" if r["k"] else "") + (
        f", width {r['width']}" if r.get("width") else "") + (f", {r['probes']} probes" if r["probes"] else "")
    spec = r["k"] is not None
    return (f'<div class="tc-result" data-mode="{r["mode"]}" data-k="{r["k"] or ""}" data-probes="{r["probes"] or ""}" '
            f'data-width="{r.get("width") or ""}" data-lossless="{r["lossless"]}">' + head
            + (f"<br>acceptance {_num(r['acceptance'], '.3f')} (accepted / drafted), {_num(r['mean_emitted'], '.2f')} "
               f"tokens per round" if spec else "")
            + f"<br>decode {_num(speed, '.2f')} tok/s vs target-only {_num(base, '.2f')} tok/s "
              f"({_num(ratio, '.2f')}x); draft head {_num(r['head_ms'], '.2f')} ms per call; equals target-only "
              f"output: <b class='tc-lossless'>{r['lossless']}</b>; generation took {seconds:.1f} s" + r["html"] + "</div>")


class Explorer:
    """The live panel: ``load()`` (returning ``(target, draft, flash_head)``) runs in a worker thread, then one
    generation per change of K, probes, prompt or mode; changes made meanwhile coalesce to the latest. ``about``:
    the header. Target-only output is kept per prompt, the last settings in a history table."""

    def __init__(self, load, prompts, *, k: int = 4, probes: int | None = None, max_new_tokens: int = 32,
                 mode: str = "flash_deferred", thinking: bool | None = None, about: str = "", history: int = 8):
        import ipywidgets as w

        self.prompts, self.max_new_tokens, self.thinking, self.keep = prompts, max_new_tokens, thinking, history
        self._load, self._probes0 = load, probes
        self.models = None
        self.runner = None
        self.baselines: dict = {}
        self._warmed: set = set()  # (mode, probes, width) settings whose first-call costs were paid untimed
        self.history: list[dict] = []
        self.runs = 0  # generations finished (the tests count them)
        self._want, self._latest, self._busy = threading.Event(), None, False
        self.header = w.HTML(about)
        self.status = w.HTML("<i>loading the models…</i>")
        self.bar = w.IntProgress(value=0, min=0, max=3, description="loading")
        self.k = w.IntSlider(value=max(1, min(k, K_MAX)), min=1, max=K_MAX, description="K", continuous_update=False)
        self.p = w.IntSlider(value=1, min=1, max=1, description="probes", continuous_update=False, disabled=True)
        self.w = w.IntSlider(value=2, min=1, max=WIDTH_MAX, description="tree width", continuous_update=False,
                             disabled=not mode.endswith("_tree"))
        self.prompt = w.Dropdown(options=[(f"{p.question_id}: {p.text[:60]}", i) for i, p in enumerate(prompts)],
                                 value=0, description="prompt", layout=w.Layout(width="95%"))
        self.mode = w.ToggleButtons(options=[(MODE_LABELS[m], m) for m in EXPLORER_MODES], value=mode,
                                    description="mode")
        self.result = w.HTML("")
        self.table = w.HTML("")
        for c in (self.k, self.p, self.w, self.prompt, self.mode):
            c.observe(self.request, names="value")
        self.widget = w.VBox([self.header, self.bar, w.HBox([self.k, self.p, self.w]), self.prompt, self.mode,
                              self.status, self.result, self.table])
        self._worker = threading.Thread(target=self._work, daemon=True, name="explorer")
        self._worker.start()

    def settings(self) -> dict:
        return {"k": self.k.value, "probes": self.p.value, "prompt": self.prompt.value, "mode": self.mode.value,
                "width": self.w.value}

    def request(self, _=None) -> None:
        """A control moved: remember the latest settings; the worker runs them when it is free."""
        self._latest = self.settings()
        self.w.disabled = not self.mode.value.endswith("_tree")  # the width applies to the tree modes only
        if self._busy and self.models is not None:
            s = self._latest
            self.status.value = (f"<i>running; queued next: {html.escape(MODE_LABELS[s['mode']])}, K = {s['k']}, "
                                 f"{s['probes']} probes</i>")
        self._want.set()

    def idle(self, timeout: float = 60.0) -> bool:
        """Wait until nothing is running or queued (tests)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self._busy and not self._want.is_set() and self.models is not None:
                return True
            time.sleep(0.05)
        return False

    def _work(self) -> None:
        self._busy = True
        try:
            self.status.value = "<i>loading the target and draft models (and the draft's FlashHead clustering)…</i>"
            self.bar.value = 1
            t0 = time.perf_counter()
            target, draft, head = self._load()
            self.bar.value = 2
            self.runner = Runner(target, draft, k=self.k.value, max_new_tokens=self.max_new_tokens, flash_head=head)
            self.p.max = head.n_clusters
            self.p.value = self._probes0 or head.n_probes
            self.p.disabled = False
            self.models = (target, draft, head)
            self.bar.value = 3
            self.bar.layout.display = "none"
            self.status.value = f"<i>models loaded in {time.perf_counter() - t0:.1f} s; first generation…</i>"
            self._latest = self.settings()
            self._want.set()
        except Exception as e:  # shown in the page: the app has nothing else to do
            self.status.value = f"<b>loading failed</b>: {html.escape(type(e).__name__)}: {html.escape(str(e))}"
            self._busy = False
            return
        while True:
            self._busy = False
            self._want.wait()
            self._busy = True
            self._want.clear()
            self._run(self._latest)

    def _run(self, s: dict) -> None:
        target, draft, head = self.models
        self.status.value = (f"<i>generating: {html.escape(MODE_LABELS[s['mode']])}, K = {s['k']}, "
                             f"{s['probes']} probes…</i>")
        t0 = time.perf_counter()
        try:
            r = generate_marked(target, draft, head, self.prompts[s["prompt"]].text, mode=s["mode"], k=s["k"],
                                max_new_tokens=self.max_new_tokens, probes=s["probes"],
                                baseline=self.baselines.get(s["prompt"]), thinking=self.thinking, runner=self.runner,
                                warmup=(s["mode"], s["probes"], s["width"]) not in self._warmed, width=s["width"])
        except Exception as e:
            self.status.value = f"<b>failed</b>: {html.escape(type(e).__name__)}: {html.escape(str(e))}"
            return
        seconds = time.perf_counter() - t0
        self._warmed.add((s["mode"], s["probes"], s["width"]))
        self.baselines[s["prompt"]] = r["baseline"]
        self.result.value = summary_html(r, seconds)
        self.history.insert(0, {**s, "k": r["k"], "probes": r["probes"], "width": r["width"], "seconds": seconds,
                                "acceptance": r["acceptance"],
                                "mean_emitted": r["mean_emitted"], "lossless": r["lossless"],
                                "ratio": (r["decode_tokens_per_s"] / r["baseline_tokens_per_s"]
                                          if r["decode_tokens_per_s"] and r["baseline_tokens_per_s"] else None)})
        del self.history[self.keep:]
        self.table.value = self._history_html()
        self.runs += 1
        self.status.value = "" if not self._want.is_set() else self.status.value

    def _history_html(self) -> str:
        """The last settings tried, newest first; a setting tried more than once (same mode, K, width, probes and
        prompt) shows the median of its speed ratios and their range over its repetitions."""
        ratios: dict = {}
        for h in self.history:
            if h["ratio"] is not None:
                ratios.setdefault(_setting(h), []).append(h["ratio"])
        rows = "".join(
            f"<tr><td>{html.escape(MODE_LABELS[h['mode']])}</td><td>{h['k'] or ''}</td><td>{h.get('width') or ''}</td>"
            f"<td>{h['probes'] or ''}</td>"
            f"<td>{h['prompt']}</td><td>{_num(h['acceptance'], '.3f')}</td><td>{_num(h['mean_emitted'], '.2f')}</td>"
            f"<td>{_num(h['ratio'], '.2f')}x</td><td>{_repeated(ratios.get(_setting(h), []))}</td>"
            f"<td>{h['lossless']}</td><td>{h['seconds']:.1f}</td></tr>"
            for h in self.history)
        return ("<details open><summary>last settings tried (newest first)</summary><table class='tc-history'>"
                "<tr><th>mode</th><th>K</th><th>width</th><th>probes</th><th>prompt</th><th>acceptance</th><th>tokens/round</th>"
                "<th>vs target-only</th><th>this setting, repeated</th><th>lossless</th><th>s</th></tr>" + rows +
                "</table></details>")


def _setting(h: dict) -> tuple:
    return (h["mode"], h["k"], h.get("width"), h["probes"], h["prompt"])


def _repeated(ratios: list[float]) -> str:
    """A setting's speed ratios over its repetitions: their median and range, once there are two or more."""
    if len(ratios) < 2:
        return ""
    return (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x, "
            f"{len(ratios)} runs)")


def live_panel(p) -> "Explorer":
    """The app's panel for :class:`~thesis_lib.book.params.Params` ``p``, its header naming set, devices and models."""
    from ..models.loading import resolved_dtype
    from . import params, shared

    about = (f"<h3>Speculative decoding explorer: parameter set <code>{html.escape(p.set_name)}</code></h3>"
             f"target <code>{html.escape(p.target)}</code> on {html.escape(p.device)}, draft "
             f"<code>{html.escape(p.draft)}</code> on {html.escape(p.draft_device or p.device)}, "
             f"{resolved_dtype(p.dtype, p.device)}; {p.max_new_tokens} new tokens per generation")
    return Explorer(lambda: shared.pair(p), params.selected_prompts(p), k=p.k, probes=p.probes,
                    max_new_tokens=p.max_new_tokens, thinking=p.thinking, about=about)
