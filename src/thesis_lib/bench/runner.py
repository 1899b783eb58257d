"""The runner: a loaded target/draft pair bound to every mode (thesis section 3.7).

``Runner(target, draft, k, max_new_tokens, ...).run(mode, ids)`` returns a
:class:`~thesis_lib.decoding.stats.Generation`. It builds each drafter once (dense, FlashHead, dense-shared, the
studies' drafts' heads and drafters, the confidence-stopped ones, each study loop's), picks the loop a mode names
(the thesis' chain loop, or a study's: :data:`thesis_lib.extensions.LOOPS`), and runs transformers' ``generate()``
for the peers on the same (packed) models. With ``profile=True`` the model drafters are
:class:`~thesis_lib.decoding.drafters.ProfiledDrafter` and the target's forwards are timed on their own: a diagnostic
run (Tables 4.7/4.8), not a headline one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import extensions
from ..decoding import costs
from ..decoding.clocks import ForwardTimer, PhaseClock
from ..decoding.drafters import ModelDrafter, ProfiledDrafter
from ..decoding.greedy import greedy_generate, speculative_generate
from ..decoding.state import ModelState
from ..decoding.rounds import check_request
from ..decoding.stats import DecodeStats, Generation
from ..errors import ConfigError
from ..heads.dense import DenseGreedyHead
from ..models.loading import LoadedModel, output_rows
from .modes import DEFAULTS_PEER, Mode, declared, parse


class _Stamps:
    """A ``generate()`` streamer that timestamps the first generated token and counts what it is given."""

    def __init__(self):
        self.calls = 0
        self.first_token_at: float | None = None
        self.first_count = 1

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt, call 2 the first new token(s)
            value.tolist()  # on a GPU, wait until the token exists (a host read), then stamp the time
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
    #: what the studies' modes read: the heads of their drafts (:data:`thesis_lib.extensions.DRAFT_HEADS`); the
    #: sampling warp; the largest K (and the measured step costs, found on first use) of the K policies; the seed of
    #: sampled runs; the confidence threshold of the ``*_sk`` modes; the token trees' width, shape (an object of the
    #: trees study) and measured rank tables
    extra_heads: dict | None = None
    sampler: object | None = None
    k_max: int = 12
    k_costs: dict | None = None
    seed: int = 0
    stop_below: float | None = None
    tree_width: int = 3
    tree_shape: object | None = None
    tree_tables: dict | None = None

    def __post_init__(self):
        self.eos = self.target.eos_ids
        self.t_state = ModelState(self.target.model, vocab_limit=self.target.vocab_limit)
        self.target_forward = None
        if self.profile:
            self.target_forward = ForwardTimer(self.t_state.hidden, self.t_state.device)
            self.t_state.hidden = self.target_forward
        #: the FlashHead draft's body: an Embedl checkpoint's own (``flash_head.body``), else the dense draft's
        body = getattr(self.flash_head, "body", None)
        self.flash_model = body.model if body is not None else self.draft.model
        self.drafters = {name: self.model_drafter(name, model, head) for name, (model, head) in self.bodies().items()}
        # the control: the FlashHead draft's body with the dense head, its own drafter (the thesis' "dense shared";
        # without a checkpoint body it is the dense draft again and can only show code-path effects)
        self.drafters["shared"] = self.model_drafter(
            "shared", self.flash_model, DenseGreedyHead.from_model(self.flash_model, self.draft.vocab_limit))
        for name, head in (self.extra_heads or {}).items():
            on_flash = getattr(head, "on_flash_body", False)
            self.drafters[name] = self.model_drafter(name, self.flash_model if on_flash else self.draft.model, head)
        #: the ``sk`` modes' drafters: same heads, a block that ends at the first unsure token
        self.confident_drafters = {} if self.stop_below is None else {
            name: self.model_drafter(name, model, head, self.stop_below) for name, (model, head) in self.bodies().items()}
        for make in extensions.DRAFTERS:
            self.drafters.update(make(self, None))
            if self.stop_below is not None:
                self.confident_drafters.update(make(self, self.stop_below))
        #: each study loop's drafters (:data:`thesis_lib.extensions.LOOPS`), by family
        self.loop_drafters = {name: loop.drafters(self) for name, loop in extensions.LOOPS.items()}

    def bodies(self) -> dict:
        """The thesis' two drafts as ``name -> (body, head)``: ``dense`` (its dense head: None) and, with a FlashHead
        head, ``flash``."""
        flash = {"flash": (self.flash_model, self.flash_head)} if self.flash_head is not None else {}
        return {"dense": (self.draft.model, None), **flash}

    def model_drafter(self, name: str, model, head: torch.nn.Module | None = None,
                      stop_below: float | None = None) -> ModelDrafter:
        """A model drafter (profiled where the runner profiles) on ``model`` with ``head`` (None: the dense head)."""
        cls = ProfiledDrafter if self.profile else ModelDrafter
        return cls(model, head=head, vocab_limit=self.draft.vocab_limit, name=name, stop_below=stop_below)

    def run(self, mode: str | Mode, ids: Sequence[int], clock: PhaseClock | None = None) -> Generation:
        """One generation of ``mode`` (a name is parsed here; a variant runs at its own K and probe count: the
        runner's K and the FlashHead head's probes are set for this call and restored after it); ``clock``: the
        phases' clock (default: a new one)."""
        mode = parse(mode)
        k, probes = mode.k, mode.probes
        if k is None and probes is None:
            return self._run(mode, ids, clock)
        if probes is not None and self.flash_head is None:
            raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
        k0, p0 = self.k, getattr(self.flash_head, "n_probes", None)
        try:
            self.k = k if k is not None else k0
            if probes is not None:
                self.flash_head.with_probes(probes)
            gen = self._run(mode, ids, clock)
        finally:
            self.k = k0
            if probes is not None:
                self.flash_head.with_probes(p0)
        if probes is not None:
            gen.extra["probes"] = probes
        return gen

    def _run(self, mode: Mode, ids: Sequence[int], clock: PhaseClock | None) -> Generation:
        check_request(self.max_new_tokens, ids, self.k)
        context = getattr(self.target.model.config, "max_position_embeddings", None)
        if context and len(ids) + self.max_new_tokens + self.k + 1 > context:
            raise ConfigError(f"{len(ids)} prompt tokens, {self.max_new_tokens} new ones and a block of {self.k + 1} "
                              f"do not fit the target's context of {context} tokens.")
        if mode.draft == "hf":
            return self._hf(mode, ids)
        if self.profile:
            self.target_forward.reset()
        if mode.draft == "baseline":
            gen = greedy_generate(self.t_state, ids, max_new_tokens=self.max_new_tokens, eos_ids=self.eos, clock=clock)
        else:  # a study's mode family decodes with its own loop; every other mode with the thesis' chain loop
            family = next((loop for loop in extensions.LOOPS.values() if loop.claims(mode.draft, mode.schedule)), None)
            gen = family.run(self, mode, ids, clock) if family else self._chain(mode, ids, clock)
        if self.profile:
            gen.stats.phase_s["target_forward"] = self.target_forward.seconds()
        return gen

    def _chain(self, mode: Mode, ids: Sequence[int], clock: PhaseClock | None) -> Generation:
        """Greedy speculative decoding with one of the chain drafters (:func:`speculative_generate`)."""
        confident = mode.policy == "confidence"
        drafter = (self.confident_drafters if confident else self.drafters).get(mode.draft)
        if drafter is None:
            raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...))" +
                              (f" and a confidence threshold (stop_below) with a draft of "
                               f"{', '.join(declared('confidence_drafts'))}." if confident else "."))
        state = getattr(drafter, "state", None)  # a prompt-lookup drafter has no model
        clock = clock or PhaseClock([self.t_state.device, state.device if state is not None else self.t_state.device])
        if self.profile:
            drafter.clock = clock
        before = drafter_counters(drafter)
        gen = speculative_generate(self.t_state, drafter, ids, k=self.k_max if confident else self.k,
                                   max_new_tokens=self.max_new_tokens, eos_ids=self.eos, schedule=mode.schedule,
                                   clock=clock, k_policy=self._k_policy(mode, drafter, ids))
        gen.extra.update({k: v - before[k] for k, v in drafter_counters(drafter).items()})
        if "probes_used" in gen.extra:
            gen.extra["mean_probes"] = gen.extra.pop("probes_used") / max(1, gen.extra.pop("head_rows"))
        return gen

    def _k_policy(self, mode: Mode, drafter, ids: Sequence[int]):
        policy = mode.policy
        if policy in ("fixed", "confidence"):  # confidence: the drafter ends its blocks itself
            return None
        if policy not in extensions.K_POLICIES:
            raise ConfigError(f"mode {mode}: no study provides the K policy {policy!r}.")
        spec = extensions.K_POLICIES[policy]
        if spec.needs_costs and self.k_costs is None:  # measured once, at the first prompt that needs it
            states = {n: self.drafters[n].state for n in ("dense", "flash", *extensions.DRAFT_HEADS) if n in self.drafters}
            self.k_costs = costs.measure_costs(self.t_state, states, ids, verify_sizes=range(1, self.k_max + 2))
            self.k_costs["draft_step_s"] = self.k_costs.get("dense_step_s", 0.0)
        return spec.make(self.k, self.k_costs, deferred=mode.schedule == "deferred", draft=drafter.name, k_max=self.k_max)

    @torch.inference_mode()
    def _hf(self, mode: Mode, ids: Sequence[int]) -> Generation:
        model = self.target.model
        inp = torch.tensor([list(ids)], device=model.device)
        kwargs = dict(max_new_tokens=self.max_new_tokens, do_sample=False, eos_token_id=self.eos,
                      pad_token_id=self.target.tokenizer.pad_token_id, attention_mask=torch.ones_like(inp),
                      temperature=None, top_p=None, top_k=None)
        rows = output_rows(model)
        if self.target.vocab_limit < rows:  # padding rows past the tokenizer: never chosen, as in our loops
            kwargs["suppress_tokens"] = list(range(self.target.vocab_limit, rows))
        mode = mode.base
        if mode in ("hf_assisted", DEFAULTS_PEER):
            gc = self.draft.model.generation_config
            if mode == DEFAULTS_PEER:  # unset: generate() fills in its own defaults
                gc.num_assistant_tokens = gc.num_assistant_tokens_schedule = gc.assistant_confidence_threshold = None
            else:
                gc.num_assistant_tokens = self.k
                gc.num_assistant_tokens_schedule = "constant"
                gc.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = self.draft.model
        stamps = _Stamps()
        t0 = time.perf_counter()
        out = model.generate(inp, streamer=stamps, **kwargs)
        tokens = out[0, inp.shape[1]:].tolist()  # a host read: the device's work is done before t2
        t2 = time.perf_counter()
        t1 = stamps.first_token_at or t2
        st = DecodeStats(mode=mode, k=self.k if mode == "hf_assisted" else 0, new_tokens=len(tokens),
                         ttft_s=t1 - t0, decode_s=t2 - t1, first_emit=min(stamps.first_count, len(tokens)),
                         stopped_by="eos" if tokens and tokens[-1] in self.eos else "max_new_tokens")
        gen = Generation(tokens, st)
        if mode == DEFAULTS_PEER:
            from transformers.utils import is_sklearn_available

            gen.extra["threshold_adapts"] = is_sklearn_available()  # transformers adapts it only with scikit-learn
        return gen


def drafter_counters(drafter) -> dict:
    """What a drafter counts about itself (its ``counters()``: blocks cut short, prompt lookups) and its head's
    probes, for the record."""
    out = dict(drafter.counters()) if hasattr(drafter, "counters") else {}
    head = getattr(getattr(drafter, "state", None), "head", None)
    if hasattr(head, "probes_used"):
        out["probes_used"], out["head_rows"] = head.probes_used, head.calls
    return out
