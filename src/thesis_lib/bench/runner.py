"""The runner: a loaded target/draft pair bound to every mode (thesis section 3.7).

``Runner(target, draft, k, max_new_tokens, ...).run(mode, ids)`` returns a
:class:`~thesis_lib.decoding.stats.Generation`. It builds each drafter once (dense, FlashHead, dense-shared,
prompt lookup, the extra heads of chapter 6, the confidence-stopped and sampling drafters), picks the loop a
mode names, and runs transformers' ``generate()`` for the peers on the same (packed) models. With
``profile=True`` the drafters are :class:`~thesis_lib.decoding.drafters.ProfiledDrafter` and the target's
forwards are timed on their own: a diagnostic run (Tables 4.7/4.8), not a headline one.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import extensions
from ..decoding import costs
from ..decoding.clocks import ForwardTimer, PhaseClock
from ..decoding.drafters import HybridDrafter, ModelDrafter, NgramDrafter, ProfiledDrafter
from ..decoding.greedy import greedy_generate, speculative_generate
from ..decoding.sampling import SamplingModelDrafter, sample_generate, speculative_sample
from ..decoding.state import ModelState
from ..decoding.stats import DecodeStats, Generation
from ..decoding.trees import PRIOR, TreeDrafter, TreeShape, tree_generate
from ..errors import ConfigError
from ..heads.dense import DenseGreedyHead
from ..models.loading import LoadedModel, output_rows
from .modes import DEFAULTS_PEER, confidence_drafts, k_policy_of, split_mode, tree_of, variant_of


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
    #: heads of the drafts ``adaflash`` and ``freq``; the sampling warp of the ``sample_*`` modes;
    #: the largest K (and the measured step costs, found on first use) of the adaptive-K modes
    extra_heads: dict | None = None
    sampler: object | None = None
    k_max: int = 12
    k_costs: dict | None = None
    seed: int = 0
    stop_below: float | None = None
    #: the tree modes' shape: ``tree_shape`` where given, else K deep and ``tree_width`` wide (a variant: its own K
    #: and width, or its node count), its nodes chosen by ``tree_tables[draft]`` (the measured rank probabilities of
    #: :mod:`thesis_studies.trees.shapes`; none: :data:`thesis_lib.decoding.trees.PRIOR`)
    tree_width: int = 3
    tree_shape: TreeShape | None = None
    tree_tables: dict | None = None

    def __post_init__(self):
        self.eos = self.target.eos_ids
        self.t_state = ModelState(self.target.model, vocab_limit=self.target.vocab_limit)
        self.target_forward = None
        if self.profile:
            self.target_forward = ForwardTimer(self.t_state.hidden, self.t_state.device)
            self.t_state.hidden = self.target_forward
        cls = ProfiledDrafter if self.profile else ModelDrafter
        limit = self.draft.vocab_limit
        dense_model = self.draft.model
        #: the FlashHead draft's body: an Embedl checkpoint's own (``flash_head.body``), else the dense draft's
        body = getattr(self.flash_head, "body", None)
        flash_model = body.model if body is not None else dense_model
        self.drafters = {"dense": cls(dense_model, vocab_limit=limit, name="dense")}
        if self.flash_head is not None:
            self.drafters["flash"] = cls(flash_model, head=self.flash_head, vocab_limit=limit, name="flash")
        # the control: the FlashHead draft's body with the dense head, its own drafter (the thesis' "dense shared";
        # without a checkpoint body it is the dense draft again and can only show code-path effects)
        self.drafters["shared"] = cls(flash_model, head=DenseGreedyHead.from_model(flash_model, limit),
                                      vocab_limit=limit, name="shared")
        self.drafters["ngram"] = NgramDrafter()
        for name, head in (self.extra_heads or {}).items():
            model = flash_model if getattr(head, "on_flash_body", False) else dense_model
            self.drafters[name] = cls(model, head=head, vocab_limit=limit, name=name)
        if self.flash_head is not None:
            self.drafters["hybrid"] = HybridDrafter(cls(flash_model, head=self.flash_head, vocab_limit=limit,
                                                        name="hybrid"))
        #: the ``sk`` modes' drafters: same heads, a block that ends at the first unsure token
        self.confident_drafters = {}
        if self.stop_below is not None:
            def confident(name, model, head=None):
                return cls(model, head=head, vocab_limit=limit, name=name, stop_below=self.stop_below)
            self.confident_drafters["dense"] = confident("dense", dense_model)
            if self.flash_head is not None:
                self.confident_drafters["flash"] = confident("flash", flash_model, self.flash_head)
                self.confident_drafters["hybrid"] = HybridDrafter(confident("hybrid", flash_model, self.flash_head),
                                                                  pad=False)
        self.tree_drafters = {"dense": TreeDrafter(dense_model, vocab_limit=limit, name="dense")}
        if self.flash_head is not None:
            self.tree_drafters["flash"] = TreeDrafter(flash_model, head=self.flash_head, vocab_limit=limit, name="flash")
        self.sample_drafters = {}
        if self.sampler is not None:
            self.sample_drafters["dense"] = SamplingModelDrafter(dense_model, self.sampler, vocab_limit=limit)
            if self.flash_head is not None:
                self.sample_drafters["flash"] = SamplingModelDrafter(flash_model, self.sampler,
                                                                     flash_head=self.flash_head, vocab_limit=limit)

    def run(self, mode: str, ids: Sequence[int]) -> Generation:
        """One generation of ``mode`` (a variant at its own K and probe count: the runner's K and the FlashHead
        head's probes are set for this call and restored after it)."""
        base, k, probes = variant_of(mode)
        width, nodes = tree_of(mode)
        if k is None and probes is None and width is None and nodes is None:
            return self._run(mode, ids)
        if probes is not None and self.flash_head is None:
            raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
        k0, p0, w0, s0 = self.k, getattr(self.flash_head, "n_probes", None), self.tree_width, self.tree_shape
        try:
            self.k = k if k is not None else k0
            if probes is not None:
                self.flash_head.with_probes(probes)
            if nodes is not None:  # the grown tree of that many nodes, at most K deep (or k_max)
                table = (self.tree_tables or {}).get(split_mode(base)[0]) or [PRIOR]
                self.tree_shape = TreeShape.grown(nodes, table, max_depth=k or self.k_max, max_rank=len(table[0]))
            elif k is not None or width is not None:  # a variant's tree is K deep and its width wide
                self.tree_width, self.tree_shape = width or w0, None
            gen = self._run(base, ids)
        finally:
            self.k, self.tree_width, self.tree_shape = k0, w0, s0
            if probes is not None:
                self.flash_head.with_probes(p0)
        if probes is not None:
            gen.extra["probes"] = probes
        return gen

    def shape(self, draft: str = "flash") -> TreeShape:
        """The tree the tree modes of ``draft`` grow now (see the fields)."""
        return self.tree_shape or TreeShape.beam(self.k, self.tree_width, (self.tree_tables or {}).get(draft))

    def _run(self, mode: str, ids: Sequence[int]) -> Generation:
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
        elif schedule == "tree":
            drafter = self.tree_drafters.get(draft)
            if drafter is None:
                raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...)).")
            shape = self.shape(draft)
            gen = tree_generate(self.t_state, drafter, ids, shape=shape, **common)
            gen.extra.update(tree=str(shape), tree_size=shape.size)
        else:
            confident = k_policy_of(mode) == "confidence"
            drafter = (self.confident_drafters if confident else self.drafters).get(draft)
            if drafter is None:
                raise ConfigError(f"mode {mode} needs a FlashHead head (Runner(..., flash_head=...))" +
                                  (f" and a confidence threshold (stop_below) with a draft of "
                                   f"{', '.join(confidence_drafts())}." if confident else "."))
            state = getattr(drafter, "state", None)  # a prompt-lookup drafter has no model
            clock = PhaseClock([self.t_state.device, state.device if state is not None else self.t_state.device])
            if self.profile:
                drafter.clock = clock
            before = drafter_counters(drafter)
            gen = speculative_generate(self.t_state, drafter, ids, k=self.k_max if confident else self.k,
                                       schedule=schedule, clock=clock,
                                       k_policy=self._k_policy(mode, draft, schedule, ids), **common)
            gen.extra.update({k: v - before[k] for k, v in drafter_counters(drafter).items()})
            if "probes_used" in gen.extra:
                gen.extra["mean_probes"] = gen.extra.pop("probes_used") / max(1, gen.extra.pop("head_rows"))
        if self.profile:
            gen.stats.phase_s["target_forward"] = self.target_forward.seconds()
        return gen

    def _k_policy(self, mode: str, draft: str, schedule: str, ids: Sequence[int]):
        policy = k_policy_of(mode)
        if policy in ("fixed", "confidence"):  # confidence: the drafter ends its blocks itself
            return None
        extensions.load()
        if policy not in extensions.K_POLICIES:
            raise ConfigError(f"mode {mode}: no study provides the K policy {policy!r}.")
        spec = extensions.K_POLICIES[policy]
        if spec.needs_costs and self.k_costs is None:  # measured once, at the first prompt that needs it
            states = {n: getattr(d, "state", None) for n, d in self.drafters.items()
                      if n in ("dense", "flash", "adaflash", "freq")}
            self.k_costs = costs.measure_costs(self.t_state, states, ids, verify_sizes=range(1, self.k_max + 2))
            self.k_costs["draft_step_s"] = self.k_costs.get("dense_step_s", 0.0)
        step_of = {"hybrid": "flash", "ngram": "ngram"}.get(draft, draft)
        measured = dict(self.k_costs or {}, ngram_step_s=0.0)
        return spec.make(self.k, measured, deferred=schedule == "deferred", draft=step_of, k_max=self.k_max)

    def _sample(self, which: str, ids: Sequence[int]) -> Generation:
        """Target-only sampling (``which == "baseline"``) or speculative sampling with the dense or FlashHead
        draft (deferred schedule). Each prompt's draws are seeded from the run's seed and the prompt, so a
        run is reproducible whatever the order of modes."""
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
    """What a drafter counts about itself (prompt lookups, model rounds, probes used), for the record."""
    out = {}
    for name in ("matched", "rounds", "lookup_rounds", "model_rounds", "stopped_early"):
        if hasattr(drafter, name):
            out[{"matched": "lookup_matched", "rounds": "lookup_tried"}.get(name, name)] = getattr(drafter, name)
    head = getattr(getattr(drafter, "state", None), "head", None)
    if hasattr(head, "probes_used"):
        out["probes_used"], out["head_rows"] = head.probes_used, head.calls
    return out
