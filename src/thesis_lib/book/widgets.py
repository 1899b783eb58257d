"""The interactive explorer (ipywidgets) and the one-generation helper behind it and chapter 3's example.

:func:`generate_marked` runs one mode on one prompt with a given K and probe count (a traced phase clock,
lossless check against target-only output, the FlashHead head's own latency measured on the generation's
context) and returns what the explorer shows. :func:`explorer` builds the widgets: sliders for K and the
probe count, a prompt chooser and a mode choice; each change re-runs the generation live in Jupyter. In the
static book the widgets show the state they were saved with (the first generation).
"""

from __future__ import annotations

import torch

from ..bench.modes import split_mode
from ..bench.prompts import encode
from ..bench.runner import Runner
from ..bench.timing import head_ms
from ..decoding.clocks import PhaseClock
from ..decoding.greedy import greedy_generate, speculative_generate
from . import figures

EXPLORER_MODES = ("flash_deferred", "dense_deferred", "flash_ordinary", "dense_ordinary")


def generate_marked(target, draft, flash_head, prompt_text: str, *, mode: str, k: int, max_new_tokens: int,
                    probes: int | None = None, baseline=None, trace: bool = False, thinking: bool | None = None) -> dict:
    """One generation of ``mode``; returns tokens, which were accepted drafts, speed, acceptance, whether it
    equals target-only greedy output (``baseline``: a previous target-only result to reuse), head latency."""
    if probes is not None and flash_head is not None:
        flash_head.with_probes(probes)
    runner = Runner(target, draft, k=k, max_new_tokens=max_new_tokens, flash_head=flash_head)
    ids = encode(target.tokenizer, prompt_text, thinking=thinking)
    with torch.inference_mode():
        if baseline is None:
            baseline = greedy_generate(runner.t_state, ids, max_new_tokens=max_new_tokens, eos_ids=runner.eos)
        kind, schedule = split_mode(mode)
        drafter = runner.drafters[kind]
        clock = PhaseClock([runner.t_state.device, drafter.state.device], trace=trace)
        gen = speculative_generate(runner.t_state, drafter, ids, k=k, schedule=schedule, clock=clock,
                                   max_new_tokens=max_new_tokens, eos_ids=runner.eos)
    with torch.inference_mode():  # the draft's hidden state after the last emitted token
        hidden = drafter.state.hidden([gen.tokens[-1]])[-1:]
    head_ms_ = head_ms(drafter.state.head, hidden, rows=1, reps=20, warmup=1)
    s = gen.stats
    origins = figures.token_origins(s)
    return {"mode": mode, "k": k, "probes": getattr(flash_head, "n_probes", None) if kind == "flash" else None,
            "tokens": list(gen.tokens), "origins": origins, "html": figures.tokens_html(target.tokenizer, gen.tokens, origins),
            "decode_tokens_per_s": s.decode_tokens_per_s, "baseline_tokens_per_s": baseline.stats.decode_tokens_per_s,
            "acceptance": s.acceptance, "mean_emitted": s.mean_emitted, "rounds": s.rounds,
            "verify_calls": s.verify_calls, "append_calls": s.append_calls,
            "lossless": list(gen.tokens) == list(baseline.tokens), "head_ms": head_ms_,
            "events": clock.events, "phase_s": dict(s.phase_s), "baseline": baseline}


def explorer(target, draft, flash_head, prompts, *, k: int = 4, probes: int | None = None,
             max_new_tokens: int = 32, mode: str = "flash_deferred", thinking: bool | None = None):
    """The widget panel: K and probe sliders, prompt and mode choosers, and the live result."""
    import ipywidgets as w
    from IPython.display import HTML, display

    n_clusters = flash_head.n_clusters
    k_slider = w.IntSlider(value=k, min=1, max=10, description="K", continuous_update=False)
    p_slider = w.IntSlider(value=probes or flash_head.n_probes, min=1, max=n_clusters, description="probes",
                           continuous_update=False)
    prompt = w.Dropdown(options=[(f"{p.question_id}: {p.text[:60]}", i) for i, p in enumerate(prompts)], value=0,
                        description="prompt", layout=w.Layout(width="95%"))
    mode_w = w.ToggleButtons(options=list(EXPLORER_MODES), value=mode, description="mode")
    out = w.Output()
    baselines: dict = {}

    def show(_=None):
        i = prompt.value
        with out:
            out.clear_output(wait=True)
            r = generate_marked(target, draft, flash_head, prompts[i].text, mode=mode_w.value, k=k_slider.value,
                                max_new_tokens=max_new_tokens, probes=p_slider.value, baseline=baselines.get(i),
                                thinking=thinking)
            baselines[i] = r["baseline"]
            speed = r["decode_tokens_per_s"] or float("nan")
            base = r["baseline_tokens_per_s"] or float("nan")
            head = f"{r['head_ms']:.2f} ms" if r["head_ms"] is not None else "n/a"
            display(HTML(
                f"<b>{r['mode']}</b>, K = {r['k']}" + (f", {r['probes']} probes" if r["probes"] else "")
                + f"<br>acceptance {r['acceptance'] or 0:.3f}, {r['mean_emitted'] or 0:.2f} tokens per round, "
                f"decode {speed:.2f} tok/s vs target-only {base:.2f} tok/s ({speed / base:.2f}x), draft head {head} "
                f"per call; equals target-only output: <b>{r['lossless']}</b>" + r["html"]))

    for c in (k_slider, p_slider, prompt, mode_w):
        c.observe(show, names="value")
    show()
    return w.VBox([w.HBox([k_slider, p_slider]), prompt, mode_w, out])
