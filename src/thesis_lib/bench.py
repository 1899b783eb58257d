"""The benchmark loop: every decoding mode on the same prompts, interleaved (thesis section 3.7).

Modes are ``baseline`` (this library's target-only greedy loop), ``<draft>_<schedule>`` for greedy
speculative decoding, and two peers from transformers:

- drafts: ``dense`` (the draft model with its dense head), ``flash`` (the same body with a FlashHead head,
  given to the runner as ``flash_head``), ``shared`` (the thesis' "dense shared" control: the FlashHead
  draft's body with the dense head, run through its own drafter; for the embedded pair the FlashHead draft
  reuses the dense draft's body, so this control isolates code-path effects only);
- schedules: ``ordinary`` (section 3.3), ``deferred`` (deferred final-token verification, section 3.6.2),
  ``pipelined`` (the target's append overlapping the draft's next proposal, section 3.6.1);
- ``hf_greedy``: transformers' ``generate()``, greedy, the peer of ``baseline``; ``hf_assisted``:
  ``generate(assistant_model=...)`` with the same draft and a constant K (its adaptive schedule and
  confidence threshold off), the peer of ``dense_ordinary``.

:func:`execute` runs the measured set, prompts x iterations, after untimed warm-up rounds; on each prompt the
modes run back to back and their order alternates from sample to sample, so drift of this shared machine
does not favour one mode. It can skip samples already done (resuming a run) and hands every finished
sample to a callback at once (the run folder writes it to disk). Summaries are medians over samples, ratios
are taken per sample against ``baseline`` (same prompt, same iteration) and then their median is reported.
With ``Runner(profile=True)`` the drafters are :class:`~thesis_lib.profiling.ProfiledDrafter` and the
target's forwards are timed on their own: a diagnostic run (Tables 4.7/4.8), not a headline one.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from .decoding import SCHEDULES, DecodeStats, Generation, greedy_generate, speculative_generate
from .drafters import HybridDrafter, ModelDrafter, NgramDrafter
from .errors import ConfigError
from .heads import DenseGreedyHead
from .models import LoadedModel, output_rows
from .profiling import ForwardTimer, PhaseClock, ProfiledDrafter
from .prompts import Prompt, encode, prompt_text
from .state import ModelState

#: ngram: prompt lookup, no draft model; adaflash: FlashHead with adaptive probes; freq: the frequency-truncated
#: head; hybrid: prompt lookup where the text repeats, the FlashHead draft elsewhere (issue 6).
DRAFTS = ("dense", "flash", "shared", "ngram", "adaflash", "freq", "hybrid")
#: Block-length policies other than the fixed K, as mode suffixes (``flash_deferred_ck``). ``sk``: the draft
#: stops its block at its first token below the confidence threshold ``stop_below``, at most ``k_max``
#: tokens (lookup blocks of the hybrid: what matched, up to ``k_max``).
K_SUFFIXES = {"hk": "heuristic", "ck": "cost", "sk": "confidence"}
#: Drafts whose head gives a confidence (``sk`` modes).
CONFIDENCE_DRAFTS = ("dense", "flash", "hybrid")
PEER_MODES = ("hf_greedy", "hf_assisted")
SPEC_MODES = (tuple(f"{d}_{s}" for d in DRAFTS for s in SCHEDULES)
              + tuple(f"{d}_{s}_{x}" for d in DRAFTS for s in ("ordinary", "deferred") for x in K_SUFFIXES))
#: Speculative *sampling* (deferred schedule) and its reference, target-only sampling.
SAMPLE_MODES = ("sample_baseline", "sample_dense", "sample_flash")
ALL_MODES = ("baseline",) + SPEC_MODES + SAMPLE_MODES + PEER_MODES
#: Drafts that need the FlashHead head (their own, or for their candidate count).
FLASH_DRAFTS = ("flash", "adaflash", "freq", "hybrid")
FLASH_MODES = tuple(m for m in SPEC_MODES if m.split("_")[0] in FLASH_DRAFTS) + ("sample_flash",)
#: ``thesis-lib compare``'s default: no FlashHead (needs a clustering) and no pipelining.
DEFAULT_MODES = ("baseline", "dense_ordinary", "dense_deferred") + PEER_MODES
#: Every mode of the thesis' chapter 4 plus the peers: the benchmark protocol's default.
THESIS_MODES = ("baseline", "dense_ordinary", "flash_ordinary", "dense_deferred", "flash_deferred",
                "dense_pipelined", "flash_pipelined") + PEER_MODES
#: The profiled run's modes (Table 4.7): dense draft, dense-shared control, FlashHead draft.
PROFILE_DRAFTS = ("dense", "shared", "flash")


def split_mode(mode: str) -> tuple[str, str]:
    """``"flash_deferred" -> ("flash", "deferred")``; ``("baseline", "")`` and ``("hf", ...)`` for the rest."""
    if mode not in ALL_MODES:
        raise ConfigError(f"Unknown mode {mode!r}; known: {', '.join(ALL_MODES)}.")
    if mode in SPEC_MODES:
        d, s = mode.split("_")[:2]
        return d, s
    if mode in SAMPLE_MODES:
        return "sample", mode[len("sample_"):]
    return ("baseline", "") if mode == "baseline" else ("hf", mode[3:])


def k_policy_of(mode: str) -> str:
    """``fixed``, or the block-length policy a mode's suffix names (``heuristic``, ``cost``)."""
    return K_SUFFIXES.get(mode.rsplit("_", 1)[-1], "fixed") if mode in SPEC_MODES else "fixed"


def baseline_of(mode: str) -> str:
    """The mode a mode's speed is compared with: target-only sampling for sampling modes, else greedy."""
    return "sample_baseline" if mode in SAMPLE_MODES else "baseline"


def check_modes(modes: Iterable[str]) -> tuple[str, ...]:
    modes = tuple(modes)
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise ConfigError(f"Unknown mode(s) {', '.join(unknown)}; known: {', '.join(ALL_MODES)}.")
    if not modes:
        raise ConfigError("No modes selected.")
    if len(set(modes)) != len(modes):
        raise ConfigError(f"A mode is listed twice: {', '.join(modes)}.")
    return modes


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
    profile: bool = False
    #: issue 6: heads of the drafts ``adaflash`` and ``freq``; the sampling warp of the ``sample_*`` modes;
    #: the largest K (and the measured step costs, found on first use) of the adaptive-K modes
    extra_heads: dict | None = None
    sampler: object | None = None
    k_max: int = 12
    k_costs: dict | None = None
    seed: int = 0
    stop_below: float | None = None

    def __post_init__(self):
        self.eos = self.target.eos_ids
        self.t_state = ModelState(self.target.model, vocab_limit=self.target.vocab_limit)
        self.target_forward = None
        if self.profile:
            self.target_forward = ForwardTimer(self.t_state.hidden, self.t_state.device)
            self.t_state.hidden = self.target_forward
        cls = ProfiledDrafter if self.profile else ModelDrafter
        limit = self.draft.vocab_limit
        self.drafters = {"dense": cls(self.draft.model, vocab_limit=limit, name="dense")}
        if self.flash_head is not None:
            self.drafters["flash"] = cls(self.draft.model, head=self.flash_head, vocab_limit=limit, name="flash")
        # the control: the FlashHead draft's body (here the same model) with the dense head, its own drafter
        self.drafters["shared"] = cls(self.draft.model, head=DenseGreedyHead.from_model(self.draft.model, limit),
                                      vocab_limit=limit, name="shared")
        self.drafters["ngram"] = NgramDrafter()
        for name, head in (self.extra_heads or {}).items():
            self.drafters[name] = cls(self.draft.model, head=head, vocab_limit=limit, name=name)
        if self.flash_head is not None:
            self.drafters["hybrid"] = HybridDrafter(cls(self.draft.model, head=self.flash_head, vocab_limit=limit,
                                                        name="hybrid"))
        #: the ``sk`` modes' drafters: same heads, a block that ends at the first unsure token
        self.confident_drafters = {}
        if self.stop_below is not None:
            def confident(name, head=None):
                return ModelDrafter(self.draft.model, head=head, vocab_limit=limit, name=name,
                                    stop_below=self.stop_below)
            self.confident_drafters["dense"] = confident("dense")
            if self.flash_head is not None:
                self.confident_drafters["flash"] = confident("flash", self.flash_head)
                self.confident_drafters["hybrid"] = HybridDrafter(confident("hybrid", self.flash_head), pad=False)
        self.sample_drafters = {}
        if self.sampler is not None:
            from .sampling import SamplingModelDrafter

            self.sample_drafters["dense"] = SamplingModelDrafter(self.draft.model, self.sampler, vocab_limit=limit)
            if self.flash_head is not None:
                self.sample_drafters["flash"] = SamplingModelDrafter(self.draft.model, self.sampler,
                                                                     flash_head=self.flash_head, vocab_limit=limit)

    @property
    def drafter(self) -> ModelDrafter:
        return self.drafters["dense"]

    @property
    def flash_drafter(self) -> ModelDrafter | None:
        return self.drafters.get("flash")

    def run(self, mode: str, ids: Sequence[int]) -> Generation:
        draft, schedule = split_mode(mode)
        common = dict(max_new_tokens=self.max_new_tokens, eos_ids=self.eos)
        if draft == "hf":
            return self._hf(mode, ids)
        if self.profile:
            self.target_forward.reset()
        if draft == "baseline":
            gen = greedy_generate(self.t_state, ids, **common)
        elif draft == "sample":
            gen = self._sample(schedule, ids)
        else:
            confident = k_policy_of(mode) == "confidence"
            drafter = (self.confident_drafters if confident else self.drafters).get(draft)
            if drafter is None:
                raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...))" +
                                  (f" and a confidence threshold (stop_below) with a draft of "
                                   f"{', '.join(CONFIDENCE_DRAFTS)}." if confident else "."))
            state = getattr(drafter, "state", None)  # a prompt-lookup drafter has no model
            clock = PhaseClock([self.t_state.device, state.device if state is not None else self.t_state.device])
            if self.profile:
                drafter.clock = clock
            before = _counters(drafter)
            gen = speculative_generate(self.t_state, drafter, ids, k=self.k_max if confident else self.k,
                                       schedule=schedule, clock=clock,
                                       k_policy=self._k_policy(mode, draft, schedule, ids), **common)
            gen.extra.update({k: v - before[k] for k, v in _counters(drafter).items()})
            if "probes_used" in gen.extra:
                gen.extra["mean_probes"] = gen.extra.pop("probes_used") / max(1, gen.extra.pop("head_rows"))
        if self.profile:
            gen.stats.phase_s["target_forward"] = self.target_forward.seconds()
        return gen

    def _k_policy(self, mode: str, draft: str, schedule: str, ids: Sequence[int]):
        from . import adaptive

        policy = k_policy_of(mode)
        if policy in ("fixed", "confidence"):  # confidence: the drafter ends its blocks itself
            return None
        if policy == "cost" and self.k_costs is None:  # measured once, at the first prompt that needs it
            models = {n: d for n, d in self.drafters.items() if n in ("dense", "flash", "adaflash", "freq")}
            self.k_costs = adaptive.measure_costs(self.t_state, models, ids, k_max=self.k_max)
        step_of = {"hybrid": "flash", "ngram": "ngram"}.get(draft, draft)
        costs = dict(self.k_costs or {}, ngram_step_s=0.0)
        return adaptive.make_policy(policy, self.k, costs, deferred=schedule == "deferred", draft=step_of,
                                    k_max=self.k_max)

    def _sample(self, which: str, ids: Sequence[int]) -> Generation:
        """Target-only sampling (``which == "baseline"``) or speculative sampling with the dense or FlashHead
        draft (deferred schedule). Each prompt's draws are seeded from the run's seed and the prompt, so a
        run is reproducible whatever the order of modes."""
        import zlib

        from .sampling import sample_generate, speculative_sample

        if self.sampler is None:
            raise ConfigError("The sample_* modes need a sampler (Runner(..., sampler=Sampler(...))).")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(repr(list(ids)).encode()))
        common = dict(max_new_tokens=self.max_new_tokens, eos_ids=self.eos, sampler=self.sampler, generator=g)
        if which == "baseline":
            return sample_generate(self.t_state, ids, **common)
        drafter = self.sample_drafters.get(which)
        if drafter is None:
            raise ConfigError(f"mode sample_{which} needs a FlashHead head (Runner(..., flash_head=...)).")
        return speculative_sample(self.t_state, drafter, ids, k=self.k, schedule="deferred", **common)

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


def _counters(drafter) -> dict:
    """What a drafter counts about itself (prompt lookups, model rounds, probes used), for the record."""
    out = {}
    for name in ("matched", "rounds", "lookup_rounds", "model_rounds", "stopped_early"):
        if hasattr(drafter, name):
            out[{"matched": "lookup_matched", "rounds": "lookup_tried"}.get(name, name)] = getattr(drafter, name)
    head = getattr(getattr(drafter, "state", None), "head", None)
    if hasattr(head, "probes_used"):
        out["probes_used"], out["head_rows"] = head.probes_used, head.calls
    return out


def sample_record(prompt: Prompt, mode: str, gen: Generation, reference: list[int] | None, *,
                  iteration: int = 0) -> dict:
    """One JSON-able record per prompt x iteration x mode: every metric of the protocol and the tokens."""
    st = gen.stats
    rec = {"iteration": iteration, "question_id": prompt.question_id, "category": prompt.category, "mode": mode,
           "k": st.k, "new_tokens": st.new_tokens, "decode_tokens": max(st.new_tokens - st.first_emit, 0),
           "ttft_s": st.ttft_s, "decode_s": st.decode_s, "decode_tokens_per_s": st.decode_tokens_per_s,
           "tpot_s": st.tpot_s, "e2e_tokens_per_s": st.e2e_tokens_per_s, "first_emit": st.first_emit,
           "stopped_by": st.stopped_by, "verify_calls": st.verify_calls, "append_calls": st.append_calls,
           "phase_s": st.phase_s,
           "matches_baseline": None if reference is None else gen.tokens == reference, "tokens": gen.tokens}
    rec.update(gen.extra)
    if st.drafted:
        rec.update(acceptance=st.acceptance, mean_emitted=st.mean_emitted, rounds=st.rounds,
                   drafted=sum(st.drafted), accepted=sum(st.accepted), emitted=sum(st.emitted),
                   skipped=st.skipped, zero_accept_rounds=st.zero_accept_rounds,
                   full_accept_rounds=st.full_accept_rounds, tail_tokens=st.tail_tokens,
                   accepted_per_round=list(st.accepted), drafted_per_round=list(st.drafted))
    return rec


def sample_key(rec: dict) -> tuple[int, str, str]:
    """What identifies a sample in a run: (iteration, question_id, mode)."""
    return int(rec.get("iteration", 0)), str(rec["question_id"]), str(rec["mode"])


def execute(runner: Runner, prompts: Sequence[Prompt], modes: Sequence[str], *, iterations: int = 1,
            warmup: int = 1, chat: bool = True, turns: str = "first", costs: bool = True, seed: int = 0,
            progress: bool = True, done: dict[tuple, dict] | None = None,
            on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """The measured set, prompts x iterations, every mode on each (order alternated), after ``warmup``
    untimed rounds of every mode; returns the records of the samples run here (``done`` ones are skipped).

    With ``costs``, the component costs are measured right after each sample's modes, on that prompt, and
    each speculative record gets the decode tok/s they predict: prediction and measurement then share the
    machine's state (this shared machine drifts by tens of percent over a long run)."""
    from tqdm.auto import tqdm

    modes = check_modes(modes)
    if "baseline" not in modes:
        modes = ("baseline", *modes)  # every ratio is taken against it
    if any(m in SAMPLE_MODES for m in modes) and "sample_baseline" not in modes:
        modes = (*modes, "sample_baseline")  # the sampling modes' ratios are taken against it
    if not prompts:
        raise ConfigError("No prompts selected.")
    if iterations < 1 or warmup < 0:
        raise ConfigError(f"iterations must be >= 1 and warmup >= 0 (got {iterations}, {warmup}).")
    done = dict(done or {})
    random.seed(seed)
    torch.manual_seed(seed)
    encoded = [encode(runner.target.tokenizer, prompt_text(p, turns), chat=chat) for p in prompts]
    todo = [(it, i) for it in range(iterations) for i in range(len(prompts))
            if any((it, prompts[i].question_id, m) not in done for m in modes)]
    records: list[dict] = []
    if not todo:
        return records
    n_warm = warmup * len(modes)
    with tqdm(total=n_warm + len(todo) * len(modes), desc="bench", unit="gen", disable=not progress) as bar:
        for w in range(warmup):
            for mode in modes:
                bar.set_postfix_str(f"warm-up {mode}")
                runner.run(mode, encoded[w % len(encoded)])
                bar.update()
        for n, (it, i) in enumerate(todo):
            prompt, ids = prompts[i], encoded[i]
            sample = it * len(prompts) + i  # the order alternates by position in the measured set
            order = list(modes) if sample % 2 == 0 else list(reversed(modes))
            gens: dict[str, Generation] = {}
            for mode in order:
                if (it, prompt.question_id, mode) in done:
                    bar.update()
                    continue
                bar.set_postfix_str(f"{prompt.question_id} #{it} {mode}")
                gens[mode] = runner.run(mode, ids)
                bar.update()
            ref = gens["baseline"].tokens if "baseline" in gens else done[(it, prompt.question_id, "baseline")]["tokens"]
            sampling_ref = None  # sampled text is random: it is not compared with greedy output
            prompt_costs = component_costs(runner, ids, reps=3) if costs else None
            for mode in modes:
                if mode not in gens:
                    continue
                rec = sample_record(prompt, mode, gens[mode], sampling_ref if mode in SAMPLE_MODES else ref, iteration=it)
                rec["run_order"] = order.index(mode)  # position of this mode in the sample's (alternated) order
                if prompt_costs:
                    rec["component_costs_s"] = prompt_costs
                    rec["predicted_tokens_per_s"] = predicted_tokens_per_s(rec, prompt_costs)
                records.append(rec)
                if on_record:
                    on_record(rec)
    return records


def compare(runner: Runner, prompts: Sequence[Prompt], modes: Sequence[str] = DEFAULT_MODES, *, chat: bool = True,
            warmup: int = 1, progress: bool = True, costs: bool = True,
            on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """``thesis-lib compare``: one iteration of :func:`execute`, records in memory (the protocol's run
    folders, iterations and resuming are ``thesis-lib bench``)."""
    return execute(runner, prompts, modes, warmup=warmup, chat=chat, costs=costs, progress=progress,
                   on_record=on_record)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _quantiles(xs) -> dict | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"min": xs[0], "p25": q[0], "p50": q[1], "p75": q[2], "max": xs[-1]}


def summarize(records: Sequence[dict]) -> dict[str, dict]:
    """Per mode: medians over samples (and the spread of decode tok/s), pooled totals as the thesis reports
    them (decode tok/s = all decode tokens / all decode time), and the median per-sample ratio of decode
    tok/s against ``baseline`` on the same prompt and iteration."""
    def base_key(r):
        return int(r.get("iteration", 0)), r["question_id"]

    bases = {b: {base_key(r): r for r in records if r["mode"] == b} for b in ("baseline", "sample_baseline")}
    out: dict[str, dict] = {}
    for mode in dict.fromkeys(r["mode"] for r in records):
        rs = [r for r in records if r["mode"] == mode]
        base = bases[baseline_of(mode)]

        def ratios(key):
            return [r[key] / base[base_key(r)][key] for r in rs if r[key] and base.get(base_key(r), {}).get(key)]

        drafted = sum(r.get("drafted", 0) for r in rs)
        decode_s = sum(r["decode_s"] for r in rs)
        decode_tokens = sum(r.get("decode_tokens", r["new_tokens"] - r.get("first_emit", 1)) for r in rs)
        out[mode] = {
            "samples": len(rs),
            "decode_tokens_per_s": _median(r["decode_tokens_per_s"] for r in rs),
            "decode_tokens_per_s_spread": _quantiles(r["decode_tokens_per_s"] for r in rs),
            "decode_tokens_per_s_pooled": decode_tokens / decode_s if decode_s else None,
            "ttft_s": _median(r["ttft_s"] for r in rs),
            "tpot_s": _median(r["tpot_s"] for r in rs),
            "speedup_vs_baseline": _median(ratios("decode_tokens_per_s")),
            "speedup_vs_baseline_spread": _quantiles(ratios("decode_tokens_per_s")),
            "e2e_tokens_per_s": _median(r["e2e_tokens_per_s"] for r in rs),
            "e2e_speedup_vs_baseline": _median(ratios("e2e_tokens_per_s")),
            # pooled over all rounds of all samples; per-sample values are in the records
            "acceptance": (sum(r.get("accepted", 0) for r in rs) / drafted) if drafted else None,
            "mean_emitted": (sum(r["emitted"] for r in rs) / sum(r["rounds"] for r in rs)) if drafted else None,
            "matches_baseline": (None if mode in SAMPLE_MODES else sum(bool(r["matches_baseline"]) for r in rs)),
            "predicted_over_measured": _median(r["predicted_tokens_per_s"] / r["decode_tokens_per_s"] for r in rs
                                               if r.get("predicted_tokens_per_s") and r["decode_tokens_per_s"]),
        }
    return out


def component_costs(runner: Runner, ids: Sequence[int], *, reps: int = 5) -> dict[str, float]:
    """Median seconds of the loop's building blocks at the prompt's context length (the terms of the
    thesis' TPOT_spec model, section 2.2): one draft step, one target step, a target verify forward over
    K and K + 1 tokens, and the draft's prefill of the prompt (which the loops do inside the first proposal,
    so it falls in the decode phase); with a FlashHead draft also its step (``flash_draft_step_s``)."""
    out = {}
    with torch.inference_mode():
        d_state = runner.drafter.state
        steps = [("target", runner.t_state), ("draft", d_state)]
        if runner.flash_drafter is not None:
            steps.append(("flash_draft", runner.flash_drafter.state))
        for name, state in steps:
            state.reset()
            state.greedy(ids, last_only=True)
            out[f"{name}_step_s"] = statistics.median(state.timed_forward([ids[-1]]) for _ in range(reps))
        prefills = []
        for _ in range(3):
            d_state.reset()
            t0 = time.perf_counter()
            d_state.greedy(ids, last_only=True).tolist()
            prefills.append(time.perf_counter() - t0)
        out["draft_prefill_s"] = statistics.median(prefills)
        for n in (runner.k, runner.k + 1):
            out[f"target_verify_{n}_s"] = statistics.median(runner.t_state.timed_forward(ids[-n:]) for _ in range(reps))
    return out


def predicted_tokens_per_s(rec: dict, costs: dict[str, float]) -> float | None:
    """Decode tok/s that the component costs predict for one speculative sample, given what it did:
    the draft's prompt prefill once, each drafted token a draft step, each verify call a K-token (deferred:
    K+1) target forward, each standalone append a target step. Python, cache cropping and the second token
    the draft feeds after a fully accepted block are left out."""
    if "rounds" not in rec or rec["new_tokens"] < 2:
        return None
    if rec["mode"] in SAMPLE_MODES or k_policy_of(rec["mode"]) != "fixed" or split_mode(rec["mode"])[0] not in ("dense", "flash", "shared"):
        return None  # the model below knows one fixed K and the dense/FlashHead step costs only
    k = rec["k"]
    verify = costs[f"target_verify_{k + 1}_s"] if rec["mode"].endswith("deferred") else costs[f"target_verify_{k}_s"]
    step = costs["flash_draft_step_s"] if rec["mode"].startswith("flash") else costs["draft_step_s"]
    if rec["mode"].endswith("pipelined"):
        return None  # the model has no overlap term
    t = (costs["draft_prefill_s"] + rec["drafted"] * step + rec["verify_calls"] * verify
         + rec["append_calls"] * costs["target_step_s"])
    return (rec["new_tokens"] - rec["first_emit"]) / t
