"""The first benchmark: every decoding mode on the same prompts, interleaved, after a warm-up
(``thesis-lib compare``).

Modes:

- ``baseline``: this library's target-only greedy loop;
- ``dense_ordinary`` / ``dense_deferred``: greedy speculative decoding with the dense draft, ordinary and
  deferred schedule (thesis sections 3.3 and 3.6.2);
- ``flash_ordinary`` / ``flash_deferred``: the same with the FlashHead draft (the draft's body with a
  FlashHead head, ``flashhead``), given to the runner as ``flash_head``;
- ``hf_greedy``: transformers' ``generate()``, greedy, as the peer of ``baseline``;
- ``hf_assisted``: transformers' ``generate(assistant_model=...)`` with the same draft and a constant K (its
  adaptive schedule and confidence threshold switched off), the peer of ``dense_ordinary``.

Each prompt is one *sample* per mode; the modes run back to back on a prompt and their order alternates
from prompt to prompt, so drift of this shared machine does not favour one mode. One untimed warm-up
generation per mode comes first. Summaries are medians over prompts; ratios are taken per prompt against
``baseline`` and then their median is reported. The fuller protocol (iterations, run folders, resuming)
comes with the benchmark chapter; this module already keeps the record format (one dict per sample).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .decoding import DecodeStats, Generation, greedy_generate, speculative_generate
from .drafters import ModelDrafter
from .errors import ConfigError
from .models import LoadedModel, output_rows
from .prompts import Prompt, encode
from .state import ModelState

OUR_MODES = ("baseline", "dense_ordinary", "dense_deferred")
FLASH_MODES = ("flash_ordinary", "flash_deferred")
PEER_MODES = ("hf_greedy", "hf_assisted")
ALL_MODES = OUR_MODES + FLASH_MODES + PEER_MODES
DEFAULT_MODES = OUR_MODES + PEER_MODES


class _Stamps:
    """A ``generate()`` streamer that timestamps the first generated token and counts what it is given."""

    def __init__(self):
        self.calls = 0
        self.first_token_at: float | None = None
        self.first_count = 1

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt, call 2 the first new token(s)
            self.first_token_at = time.perf_counter()
            # assisted generation verifies prompt + first draft block in its first forward, so the first
            # call can carry several tokens: they were produced inside TTFT, not in the decode phase
            self.first_count = int(value.numel())

    def end(self):
        pass


@dataclass
class Runner:
    """Binds a loaded target/draft pair to the modes; ``run(mode, ids)`` returns a :class:`Generation`."""

    target: LoadedModel
    draft: LoadedModel
    k: int
    max_new_tokens: int
    flash_head: torch.nn.Module | None = None

    def __post_init__(self):
        self.eos = self.target.eos_ids
        self.t_state = ModelState(self.target.model, vocab_limit=self.target.vocab_limit)
        self.drafter = ModelDrafter(self.draft.model, vocab_limit=self.draft.vocab_limit, name="dense")
        self.flash_drafter = None if self.flash_head is None else ModelDrafter(
            self.draft.model, head=self.flash_head, vocab_limit=self.draft.vocab_limit, name="flashhead")

    def run(self, mode: str, ids: Sequence[int]) -> Generation:
        common = dict(max_new_tokens=self.max_new_tokens, eos_ids=self.eos)
        if mode == "baseline":
            return greedy_generate(self.t_state, ids, **common)
        if mode in ("dense_ordinary", "dense_deferred"):
            return speculative_generate(self.t_state, self.drafter, ids, k=self.k,
                                        deferred=mode.endswith("deferred"), **common)
        if mode in FLASH_MODES:
            if self.flash_drafter is None:
                raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
            gen = speculative_generate(self.t_state, self.flash_drafter, ids, k=self.k,
                                       deferred=mode.endswith("deferred"), **common)
            gen.stats.mode = mode
            return gen
        if mode in PEER_MODES:
            return self._hf(mode, ids)
        raise ConfigError(f"Unknown mode {mode!r}; known: {', '.join(ALL_MODES)}.")

    @torch.inference_mode()
    def _hf(self, mode: str, ids: Sequence[int]) -> Generation:
        model = self.target.model
        inp = torch.tensor([list(ids)], device=model.device)
        kwargs = dict(max_new_tokens=self.max_new_tokens, do_sample=False, eos_token_id=self.eos,
                      pad_token_id=self.target.tokenizer.pad_token_id, attention_mask=torch.ones_like(inp),
                      temperature=None, top_p=None, top_k=None)
        rows = output_rows(model)
        if self.target.vocab_limit < rows:  # padding rows past the tokenizer: never chosen, as in our loops
            kwargs["suppress_tokens"] = list(range(self.target.vocab_limit, rows))
        if mode == "hf_assisted":
            gc = self.draft.model.generation_config
            gc.num_assistant_tokens = self.k
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = self.draft.model
        stamps = _Stamps()
        t0 = time.perf_counter()
        out = model.generate(inp, streamer=stamps, **kwargs)
        t2 = time.perf_counter()
        tokens = out[0, inp.shape[1]:].tolist()
        t1 = stamps.first_token_at or t2
        st = DecodeStats(mode=mode, k=self.k if mode == "hf_assisted" else 0, new_tokens=len(tokens),
                         ttft_s=t1 - t0, decode_s=t2 - t1, first_emit=min(stamps.first_count, len(tokens)),
                         stopped_by="eos" if tokens and tokens[-1] in self.eos else "max_new_tokens")
        return Generation(tokens, st)


def sample_record(prompt: Prompt, mode: str, gen: Generation, reference: list[int] | None) -> dict:
    """One JSON-able record per prompt x mode (the results format of the benchmark chapter)."""
    st = gen.stats
    rec = {"question_id": prompt.question_id, "category": prompt.category, "mode": mode, "k": st.k,
           "new_tokens": st.new_tokens, "ttft_s": st.ttft_s, "decode_s": st.decode_s,
           "decode_tokens_per_s": st.decode_tokens_per_s, "tpot_s": st.tpot_s,
           "e2e_tokens_per_s": st.e2e_tokens_per_s, "first_emit": st.first_emit, "stopped_by": st.stopped_by,
           "matches_baseline": None if reference is None else gen.tokens == reference, "tokens": gen.tokens}
    if st.drafted:
        rec.update(acceptance=st.acceptance, mean_emitted=st.mean_emitted, rounds=st.rounds,
                   drafted=sum(st.drafted), accepted=sum(st.accepted), emitted=sum(st.emitted),
                   verify_calls=st.verify_calls,
                   append_calls=st.append_calls, skipped=st.skipped, zero_accept_rounds=st.zero_accept_rounds,
                   full_accept_rounds=st.full_accept_rounds, phase_s=st.phase_s)
    return rec


def compare(runner: Runner, prompts: Sequence[Prompt], modes: Sequence[str] = DEFAULT_MODES, *, chat: bool = True,
            warmup: int = 1, progress: bool = True, costs: bool = True,
            on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every mode on every prompt (order alternated per prompt) after ``warmup`` untimed rounds.

    With ``costs``, the component costs are measured right after each prompt's modes, on that prompt, and
    each speculative record gets the decode tok/s they predict: prediction and measurement then share the
    machine's state (this shared machine drifts by tens of percent over a long run)."""
    from tqdm.auto import tqdm

    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {unknown}; known: {', '.join(ALL_MODES)}.")
    if not prompts:
        raise ConfigError("No prompts selected.")
    if "baseline" not in modes:
        modes = ("baseline", *modes)  # every ratio is taken against it
    encoded = [encode(runner.target.tokenizer, p.text, chat=chat) for p in prompts]
    total = len(modes) * (warmup + len(prompts))
    records: list[dict] = []
    with tqdm(total=total, desc="compare", unit="gen", disable=not progress) as bar:
        for w in range(warmup):
            for mode in modes:
                bar.set_postfix_str(f"warm-up {mode}")
                runner.run(mode, encoded[w % len(encoded)])
                bar.update()
        for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
            order = list(modes) if i % 2 == 0 else list(reversed(modes))
            gens = {}
            for mode in order:
                bar.set_postfix_str(f"{prompt.question_id} {mode}")
                gens[mode] = runner.run(mode, ids)
                bar.update()
            ref = gens["baseline"].tokens
            prompt_costs = component_costs(runner, ids, reps=3) if costs else None
            for mode in modes:
                rec = sample_record(prompt, mode, gens[mode], ref)
                if prompt_costs:
                    rec["component_costs_s"] = prompt_costs
                    rec["predicted_tokens_per_s"] = predicted_tokens_per_s(rec, prompt_costs)
                records.append(rec)
                if on_record:
                    on_record(rec)
    return records


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(records: Sequence[dict]) -> dict[str, dict]:
    """Per mode: medians over prompts, and the median per-prompt ratio of decode tok/s against baseline."""
    base = {r["question_id"]: r for r in records if r["mode"] == "baseline"}
    out: dict[str, dict] = {}
    for mode in dict.fromkeys(r["mode"] for r in records):
        rs = [r for r in records if r["mode"] == mode]
        def ratios(key):
            return [r[key] / base[r["question_id"]][key] for r in rs
                    if r[key] and base.get(r["question_id"], {}).get(key)]

        drafted = sum(r.get("drafted", 0) for r in rs)
        out[mode] = {
            "samples": len(rs),
            "decode_tokens_per_s": _median(r["decode_tokens_per_s"] for r in rs),
            "ttft_s": _median(r["ttft_s"] for r in rs),
            "tpot_s": _median(r["tpot_s"] for r in rs),
            "speedup_vs_baseline": _median(ratios("decode_tokens_per_s")),
            "e2e_tokens_per_s": _median(r["e2e_tokens_per_s"] for r in rs),
            "e2e_speedup_vs_baseline": _median(ratios("e2e_tokens_per_s")),
            # pooled over all rounds of all prompts; per-prompt medians are in the records
            "acceptance": (sum(r.get("accepted", 0) for r in rs) / drafted) if drafted else None,
            "mean_emitted": (sum(r["emitted"] for r in rs) / sum(r["rounds"] for r in rs)) if drafted else None,
            "matches_baseline": sum(bool(r["matches_baseline"]) for r in rs),
            "predicted_over_measured": _median(r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] for r in rs
                                               if r.get("predicted_tokens_per_s") and r["decode_tokens_per_s"]),
        }
    return out


def component_costs(runner: Runner, ids: Sequence[int], *, reps: int = 5) -> dict[str, float]:
    """Median seconds of the loop's building blocks at the prompt's context length (the terms of the
    thesis' TPOT_spec model, section 2.2): one draft step, one target step, a target verify forward over
    K and K + 1 tokens, and the draft's prefill of the prompt (which the loops do inside the first proposal,
    so it falls in the decode phase); with a FlashHead draft also its step (``flash_draft_step_s``)."""
    def timed(state: ModelState, feed: list[int]) -> float:
        t0 = time.perf_counter()
        state.greedy(feed).tolist()
        dt = time.perf_counter() - t0
        state.crop(len(feed))
        return dt

    out = {}
    with torch.inference_mode():
        d_state = runner.drafter.state
        steps = [("target", runner.t_state), ("draft", d_state)]
        if runner.flash_drafter is not None:
            steps.append(("flash_draft", runner.flash_drafter.state))
        for name, state in steps:
            state.reset()
            state.greedy(ids, last_only=True)
            out[f"{name}_step_s"] = statistics.median(timed(state, [ids[-1]]) for _ in range(reps))
        prefills = []
        for _ in range(3):
            d_state.reset()
            t0 = time.perf_counter()
            d_state.greedy(ids, last_only=True).tolist()
            prefills.append(time.perf_counter() - t0)
        out["draft_prefill_s"] = statistics.median(prefills)
        for n in (runner.k, runner.k + 1):
            out[f"target_verify_{n}_s"] = statistics.median(timed(runner.t_state, list(ids[-n:])) for _ in range(reps))
    return out


def predicted_tokens_per_s(rec: dict, costs: dict[str, float]) -> float | None:
    """Decode tok/s that the component costs predict for one speculative sample, given what it did:
    the draft's prompt prefill once, each drafted token a draft step, each verify call a K-token (deferred:
    K+1) target forward, each standalone append a target step. Python, cache cropping and the second token
    the draft feeds after a fully accepted block are left out."""
    if "rounds" not in rec or rec["new_tokens"] < 2:
        return None
    k = rec["k"]
    verify = costs[f"target_verify_{k + 1}_s"] if rec["mode"].endswith("deferred") else costs[f"target_verify_{k}_s"]
    step = costs["flash_draft_step_s"] if rec["mode"].startswith("flash") else costs["draft_step_s"]
    t = (costs["draft_prefill_s"] + rec["drafted"] * step + rec["verify_calls"] * verify
         + rec["append_calls"] * costs["target_step_s"])
    return (rec["new_tokens"] - rec["first_emit"]) / t
