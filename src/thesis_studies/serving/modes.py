"""The serving questions' modes on one loaded pair (``thesis-lib studies serving-bench``): a mode name runs one prompt
(:meth:`Pair.one_row`) or a batch of prompts (:meth:`Pair.batched`), and the longer-generations and memory parts
run those modes (:mod:`.lengths`, :mod:`.memory`; batched decoding: :mod:`.batched`).

Mode names: ``baseline`` (target-only greedy), ``<draft>_<schedule>`` with draft ``dense`` or ``flash`` (the
FlashHead head on the dense draft's body, or on an Embedl checkpoint's own body) and schedule ``ordinary`` or
``deferred``.
"""

from __future__ import annotations

from typing import Sequence

from thesis_studies.serving.loops import batched_greedy, batched_speculative
from thesis_lib.decoding.drafters import ModelDrafter
from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
from thesis_lib.decoding.state import ModelState
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.progress import tqdm
from thesis_studies.serving import heads as batched_mod
from thesis_studies.serving import lengths as lengths_mod
from thesis_studies.serving import memory


class Pair:
    """A loaded target and draft, the FlashHead head, K and the end-of-sequence ids: what every mode needs."""

    def __init__(self, target, draft, head, *, k: int):
        self.target, self.draft, self.head, self.k = target, draft, head, k
        self.body = head.body.model if head.body is not None else draft.model
        self.eos = target.eos_ids
        self.state = ModelState(target.model, vocab_limit=target.vocab_limit)
        self.drafts = {"dense": ModelState(draft.model, vocab_limit=draft.vocab_limit),
                       "flash": ModelState(self.body, head=head, vocab_limit=draft.vocab_limit)}

    def describe(self) -> dict:
        """What a document records of the pair: specs, device, precision and kernels, attention, FlashHead."""
        t, h = self.target, self.head
        return {"target": t.spec, "draft": self.draft.spec, "device": t.device, "dtype": t.dtype,
                "precision": t.info.get("dtype_requested"), "cpu_kernels": t.info.get("cpu_kernels"),
                "attention": t.info.get("attention"), "rows_exact": t.info.get("rows_exact"),
                "flashhead": {"clusters": h.n_clusters, "probes": h.n_probes, "path": h.active_path}}

    def one_row(self, mode: str, ids: Sequence[int], n: int):
        if mode == "baseline":
            return greedy_generate(self.state, ids, max_new_tokens=n, eos_ids=self.eos)
        draft, schedule = mode.split("_")
        model, head = (self.draft.model, None) if draft == "dense" else (self.body, self.head)
        drafter = ModelDrafter(model, head=head, vocab_limit=self.draft.vocab_limit, name=draft)
        return speculative_generate(self.state, drafter, ids, k=self.k, max_new_tokens=n, eos_ids=self.eos,
                                    schedule=schedule)

    def batched(self, mode: str, group: Sequence[Sequence[int]], n: int):
        if mode == "baseline":
            return batched_greedy(self.state, group, max_new_tokens=n, eos_ids=self.eos)
        draft, schedule = mode.split("_")
        return batched_speculative(self.state, self.drafts[draft], group, k=self.k, max_new_tokens=n,
                                   eos_ids=self.eos, schedule=schedule, name=draft)


def filler(prompts: Sequence[Sequence[int]], n: int) -> list[int]:
    """``n`` real tokens: the prompts one after another, repeated as needed (a context whose length is what counts)."""
    out: list[int] = []
    while len(out) < n:
        for p in prompts:
            out += list(p)
    return out[:n]


def lengths_part(pair: Pair, prompts: Sequence[Sequence[int]], lengths: Sequence[int], *,
                 context_prompts: Sequence[Sequence[int]], progress: bool = True) -> dict:
    """Speedup and acceptance by length on ``prompts`` (:func:`.lengths.by_length`), and the draft head's share of a
    step after the longest prompt of ``prompts`` plus each length (:func:`.lengths.head_share_by_context`)."""
    doc = lengths_mod.by_length(pair.one_row, prompts, lengths=lengths, progress=progress)
    first = max(map(len, prompts))
    contexts = [first + n for n in lengths]
    heads = {"dense": DenseGreedyHead.from_model(pair.draft.model, pair.draft.vocab_limit), "flashhead": pair.head}
    state = ModelState(pair.draft.model, vocab_limit=pair.draft.vocab_limit)
    doc["head_share"] = lengths_mod.head_share_by_context(state, heads, filler(context_prompts, max(contexts)),
                                                          contexts)
    return doc


def memory_part(pair: Pair, prompts: Sequence[Sequence[int]], *, longest: int, batch: int, batch_tokens: int,
                progress: bool = True) -> dict:
    """Bytes of both models and of FlashHead's tensors against the dense head; KV bytes per token of each model
    (read from real caches after ``longest`` tokens of context); the peak resident memory of each one-row mode
    over ``longest`` new tokens on the first prompt, and of batched target-only and FlashHead deferred decoding of
    ``batch`` prompts (``batch_tokens`` new tokens each)."""
    context = filler(prompts, longest)
    doc = {"models": {"target": memory.tensor_bytes(pair.target.model), "draft": memory.tensor_bytes(pair.draft.model)},
           "flashhead": memory.flashhead_bytes(pair.head, pair.draft.model.get_output_embeddings()),
           "kv": {"target": memory.kv_bytes(ModelState(pair.target.model), context),
                  "draft": memory.kv_bytes(ModelState(pair.draft.model), context)},
           "peak": {}}
    if pair.head.body is not None:
        doc["models"]["flashhead_body"] = memory.tensor_bytes(pair.body)
    group = list(prompts[:batch])
    runs = [(m, 1, longest, lambda m=m: pair.one_row(m, prompts[0], longest)) for m in lengths_mod.LENGTH_MODES]
    runs += [(f"batched_{m}", len(group), batch_tokens, lambda m=m: pair.batched(m, group, batch_tokens))
             for m in ("baseline", "flash_deferred")]
    for name, rows, new, run in tqdm(runs, desc="peak memory per mode", unit="run", disable=not progress):
        doc["peak"][name] = {"rows": rows, "new_tokens": new, **memory.peak_rss(run, pair.target.device)}
    return doc


def mixed(prompts: Sequence, per_category: int, count: int | None):
    """``per_category`` prompts of each category, taken in turn across the categories (a served batch mixes
    requests), then the first ``count``."""
    from thesis_lib.bench.prompts import select

    kept = select(list(prompts), None, None, per_category)
    order = {c: i for i, c in enumerate(dict.fromkeys(p.category for p in kept))}
    rank: dict[str, int] = {}
    turns = []
    for p in kept:
        rank[p.category] = rank.get(p.category, 0) + 1
        turns.append((rank[p.category], order[p.category], p))
    return select([p for *_, p in sorted(turns, key=lambda t: t[:2])], None, count)


def measure(pair: Pair, parts: Sequence[str], prompts: Sequence[Sequence[int]], *, long_prompts=(),
            max_new_tokens: int, batches: Sequence[int], modes: Sequence[str], reps: int,
            lengths: Sequence[int], progress: bool = True) -> dict:
    """The ``parts`` of ``serving-bench`` (``decode``, ``lengths``, ``memory``) on a pair: batched decoding of
    ``prompts``, longer generations of ``long_prompts``, memory; one document, with the pair's description."""
    doc = {"parts": list(parts)}
    if "decode" in parts:
        doc["decode"] = batched_mod.decode_by_batch(pair, prompts, max_new_tokens=max_new_tokens, batch_sizes=batches,
                                                    modes=modes, reps=reps, progress=progress)
    if "lengths" in parts:
        doc["lengths"] = lengths_part(pair, long_prompts, lengths, context_prompts=prompts, progress=progress)
    if "memory" in parts:
        doc["memory"] = memory_part(pair, prompts, longest=max(lengths), batch=max(batches),
                                    batch_tokens=max_new_tokens, progress=progress)
    doc.update(pair.describe())
    return doc
