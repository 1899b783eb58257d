"""This machine's decoding step against a reference build's (the planner's ``speed``, :mod:`.sizing`): the pair
loaded as the book loads it, in a child process (its memory goes with it), and one target step and one draft step
timed at each of the reference's prompts."""

from __future__ import annotations

import json
import math
import statistics
import sys

from ..errors import ConfigError
from .params import Params


def _measure(p, reference_steps: dict[str, float]) -> dict[str, float]:
    """The step times of :func:`measure_speed`, in this process."""
    import torch

    from ..bench.execute import component_costs
    from ..bench.prompts import encode, load_prompts, prompt_text
    from ..bench.disturbance import available_cores
    from ..bench.runner import Runner
    from ..models import loading

    torch.set_num_threads(available_cores())
    target, draft = loading.load_pair(p.target, p.draft, device=p.device, draft_device=p.draft_device,
                                      dtype=p.dtype, progress=False, draft_dtype=p.draft_dtype)
    runner = Runner(target, draft, k=p.k, max_new_tokens=12)
    pool = {q.question_id: q for q in load_prompts(p.prompt_file)}
    here: dict[str, float] = {}
    for _ in range(2):
        for qid in reference_steps:
            ids = encode(target.tokenizer, prompt_text(pool[qid], "first"), chat=True, thinking=p.thinking)
            runner.run("baseline", ids)
            c = component_costs(runner, ids, reps=7)
            here[qid] = min(here.get(qid, math.inf), c["target_step_s"] + c["draft_step_s"])
    return here


def measure_speed(p, reference_steps: dict[str, float]) -> dict:
    """This machine's step time against the reference's, timed in a child process (the pair's memory goes with
    it): the pair loaded as the book loads it, then, twice over the reference's prompts, a short generation and one
    target step and one draft step timed (median of seven) at the prompt's context, as the runs time them; a
    prompt's time is the faster of its two passes (the first also warms up). Returns the seconds per prompt and
    ``speed``, the median of the per-prompt ratios (above 1: slower than the reference)."""
    import subprocess
    import time

    from ..bench.prompts import load_prompts
    from ..progress import heartbeat

    pool = {q.question_id for q in load_prompts(p.prompt_file)}
    missing = [q for q in reference_steps if q not in pool]
    if missing:
        raise ConfigError(f"The cost reference's prompts {', '.join(missing)} are not in {p.prompt_file!r}.")
    t0 = time.perf_counter()
    arg = json.dumps({"params": p.values(), "reference": reference_steps})
    with heartbeat("timing this machine's steps"):  # about a minute, without a bar
        proc = subprocess.run([sys.executable, "-m", "thesis_lib.book.speed", arg], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"Timing this machine's steps failed (exit {proc.returncode}); see the messages above.")
    here = json.loads(proc.stdout.strip().splitlines()[-1])
    ratios = [here[q] / reference_steps[q] for q in reference_steps]
    return {"step_by_prompt_s": {q: round(v, 5) for q, v in here.items()}, "speed": statistics.median(ratios),
            "measure_s": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":  # measure_speed's child: the step times as one JSON line

    _arg = json.loads(sys.argv[1])
    print(json.dumps(_measure(Params.from_namespace(_arg["params"]), _arg["reference"])))
