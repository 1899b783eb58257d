"""The benchmark loop: every mode on the same prompts, interleaved (thesis section 3.7).

:func:`execute` runs the measured set, prompts x iterations, after untimed warm-up rounds; on each prompt the
modes run back to back and their order alternates from sample to sample, so drift of this shared machine
does not favour one mode. It can skip samples already done (resuming a run) and hands every finished
sample to a callback at once (the run folder writes it to disk). With ``costs`` the loop's building blocks
are measured on each prompt right after its modes (:func:`component_costs`), so a sample's predicted speed
and its measured one share the machine's state. Summaries and ratios are :mod:`~thesis_lib.bench.metrics`'.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch

from ..decoding.clocks import alternating
from ..decoding.costs import measure_costs
from ..decoding.stats import Generation
from ..errors import ConfigError, at_least
from .metrics import predicted_tokens_per_s, sample_record
from .modes import Mode, parse, parse_all
from .prompts import Prompt, encode, prompt_text
from .runner import Runner


def execute(runner: Runner, prompts: Sequence[Prompt], modes: Sequence[str | Mode], *, iterations: int = 1,
            warmup: int = 1, warmup_tokens: int | None = None, chat: bool = True, turns: str = "first", costs: bool = True, seed: int = 0,
            thinking: bool | None = None, desc: str = "bench",
            progress: bool = True, done: dict[tuple, dict] | None = None,
            on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """The measured set, prompts x iterations, every mode on each (order alternated), after ``warmup``
    untimed rounds of every mode (each ``warmup_tokens`` long; None: as long as a measured generation);
    returns the records of the samples run here (``done`` ones are skipped).

    With ``costs``, the component costs are measured right after each sample's modes, on that prompt, and
    each speculative record gets the decode tok/s they predict: prediction and measurement then share the
    machine's state (this shared machine drifts by tens of percent over a long run)."""
    from ..progress import tqdm

    modes = parse_all(modes)
    if "baseline" not in map(str, modes):
        modes = (parse("baseline"), *modes)  # every ratio is taken against it
    if any(m.sampled for m in modes) and "sample_baseline" not in map(str, modes):
        modes = (*modes, parse("sample_baseline"))  # the sampling modes' ratios are taken against it
    if not prompts:
        raise ConfigError("No prompts selected.")
    at_least("iterations", iterations), at_least("warmup", warmup, 0), at_least("warmup_tokens", warmup_tokens, none=True)
    done = dict(done or {})
    random.seed(seed)
    torch.manual_seed(seed)
    encoded = [encode(runner.target.tokenizer, prompt_text(p, turns), chat=chat, thinking=thinking) for p in prompts]
    todo = [(it, i) for it in range(iterations) for i in range(len(prompts))
            if any((it, prompts[i].question_id, m.name) not in done for m in modes)]
    records: list[dict] = []
    if not todo:
        return records
    n_warm = warmup * len(modes)
    with tqdm(total=n_warm + len(todo) * len(modes), desc=desc, unit="gen", disable=not progress) as bar:
        measured_length = runner.max_new_tokens
        try:  # a warm-up touches every weight and makes every kernel shape; its length need not be the measured one
            runner.max_new_tokens = min(measured_length, warmup_tokens or measured_length)
            for w in range(warmup):
                for mode in modes:
                    bar.set_postfix_str(f"warm-up {mode}")
                    runner.run(mode, encoded[w % len(encoded)])
                    bar.update()
        finally:
            runner.max_new_tokens = measured_length
        for n, (it, i) in enumerate(todo):
            prompt, ids = prompts[i], encoded[i]
            sample = it * len(prompts) + i  # the order alternates by position in the measured set
            order = alternating(modes, sample)
            gens: dict[str, Generation] = {}
            for mode in order:
                if (it, prompt.question_id, mode.name) in done:
                    bar.update()
                    continue
                bar.set_postfix_str(f"{prompt.question_id} #{it} {mode}")
                gens[mode.name] = runner.run(mode, ids)
                bar.update()
            ref = gens["baseline"].tokens if "baseline" in gens else done[(it, prompt.question_id, "baseline")]["tokens"]
            sampling_ref = None  # sampled text is random: it is not compared with greedy output
            prompt_costs = component_costs(runner, ids, reps=3) if costs else None
            for mode in modes:
                if mode.name not in gens:
                    continue
                rec = sample_record(prompt, mode.name, gens[mode.name], sampling_ref if mode.sampled else ref,
                                    iteration=it)
                rec["run_order"] = order.index(mode)  # position of this mode in the sample's (alternated) order
                if prompt_costs:
                    rec["component_costs_s"] = prompt_costs
                    rec["predicted_tokens_per_s"] = predicted_tokens_per_s(rec, prompt_costs)
                records.append(rec)
                if on_record:
                    on_record(rec)
    return records


def component_costs(runner: Runner, ids: Sequence[int], *, reps: int = 5) -> dict[str, float]:
    """Median seconds of the loop's building blocks at the prompt's context length (the terms of the
    thesis' TPOT_spec model, section 2.2; :func:`thesis_lib.decoding.costs.measure_costs` times them): one draft
    step, one target step and a target verify forward over K and K + 1 tokens (the draft's prefill of the prompt
    is timed with the target's, in TTFT, so it is no decode cost); with a FlashHead draft also its step
    (``flash_draft_step_s``)."""
    states = {"draft": runner.drafters["dense"].state}
    if "flash" in runner.drafters:
        states["flash_draft"] = runner.drafters["flash"].state
    measured = measure_costs(runner.t_state, states, ids, verify_sizes=(1, runner.k, runner.k + 1), reps=reps)
    verify = measured.pop("verify_s")
    out = {"target_step_s": verify[1], **measured}
    for n in (runner.k, runner.k + 1):
        out[f"target_verify_{n}_s"] = verify[n]
    return out
