"""Model-only measurements of the draft: FlashHead's quality and the thesis' Tables 4.1 to 4.4 (section 4.3).

What this module knows:

- :func:`collect_hidden_states`: real final hidden states of a model, gathered while it decodes a prompt set
  greedily with its dense head (one state per decode step: the state from which that step's token is chosen).
- :func:`quality_curve`: over a list of probe counts, FlashHead's top-1 agreement with the dense head (the
  head actually run, fast path) and the recall of the dense top-1 and top-5 among its candidates (computed
  from the cluster ranking). In exact arithmetic top-1 agreement equals top-1 recall (if the dense winner is
  a candidate it also wins among the candidates); a gap would point at rounding or a bug.
- :func:`head_latency` (Tables 4.1 and 4.2): one greedy head call on the same hidden states, dense head vs
  FlashHead, modes interleaved per state with the order alternating, warm-up calls excluded.
- :func:`step_latency` (Tables 4.3 and 4.4): one complete draft decode step (one token through the body,
  then the head) at the context of a real prompt, for the dense draft, the "dense shared" control (the
  FlashHead draft's body with the dense head; for the embedded pair the FlashHead draft is built from the
  dense draft itself, so this control runs the very same body, and it becomes informative with an official
  FlashHead checkpoint whose body differs) and the FlashHead draft; plus the body alone, so the head's share
  is measured rather than inferred.

Statistics are the thesis' (mean, P50, P95, tokens/s = 1 / mean) plus the median; speedups are ratios of
means (the thesis' definition) and of medians. Timing is :mod:`thesis_lib.bench.timing`'s.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..decoding.state import ModelState
from .. import extensions
from ..errors import ConfigError
from ..heads.dense import DenseGreedyHead
from ..heads.flashhead import check_probes
from ..models.cache import write_atomic
from ..progress import note
from .prompts import Prompt, encode
from .disturbance import Watch, judge_timed
from .timing import interleaved, stats_ms


@dataclass
class HiddenStates:
    states: torch.Tensor  # [N, D]
    question_ids: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    dense_tokens: list[int] = field(default_factory=list)


@torch.inference_mode()
def collect_hidden_states(loaded, prompts: Sequence[Prompt], *, max_new_tokens: int = 128, chat: bool = True,
                          progress: bool = True, thinking: bool | None = None) -> HiddenStates:
    """Decode each prompt greedily with the model's dense head and keep the hidden state of every step."""
    from ..progress import tqdm

    if not prompts:
        raise ConfigError("No prompts selected.")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1 (got {max_new_tokens}).")
    state = ModelState(loaded.model, vocab_limit=loaded.vocab_limit)
    eos = set(loaded.eos_ids)
    rows, qids, cats, toks = [], [], [], []
    bar = tqdm(total=len(prompts) * max_new_tokens, desc="hidden states", unit="tok", disable=not progress)
    for p in prompts:
        state.reset()
        feed = encode(loaded.tokenizer, p.text, chat=chat, thinking=thinking)
        for _ in range(max_new_tokens):
            h = state.hidden(feed)[-1:]
            tok = int(state.head(h)[0])
            rows.append(h.float().cpu())
            qids.append(p.question_id)
            cats.append(p.category)
            toks.append(tok)
            bar.update()
            if tok in eos:
                break
            feed = [tok]
    bar.close()
    return HiddenStates(torch.cat(rows), qids, cats, toks)


def cached_hidden_states(loaded, prompts: Sequence[Prompt], path: str | None, *, max_new_tokens: int, chat: bool = True,
                         progress: bool = True, thinking: bool | None = None) -> tuple[HiddenStates, bool]:
    """:func:`collect_hidden_states`, read from ``path`` if it holds states of the same model, prompts and
    length (else collected and written there). Returns the states and whether they were read."""
    from pathlib import Path

    key = {"model": str(loaded.info.get("gguf_sha256") or loaded.spec), "prompts": [p.question_id for p in prompts],
           "texts": [p.text for p in prompts], "max_new_tokens": max_new_tokens, "chat": chat}
    if thinking is not None:
        key["thinking"] = thinking
    if path and Path(path).is_file():
        saved = torch.load(path, weights_only=True)
        if saved.get("key") == json.dumps(key, sort_keys=True):
            return HiddenStates(saved["states"], saved["question_ids"], saved["categories"], saved["dense_tokens"]), True
        raise ConfigError(f"{path} holds hidden states of another model, prompt set or length; choose another --states file.")
    hs = collect_hidden_states(loaded, prompts, max_new_tokens=max_new_tokens, chat=chat, progress=progress,
                               thinking=thinking)
    if path:
        buffer = io.BytesIO()
        torch.save({"key": json.dumps(key, sort_keys=True), "states": hs.states, "question_ids": hs.question_ids,
                    "categories": hs.categories, "dense_tokens": hs.dense_tokens}, buffer)
        write_atomic(path, buffer.getvalue())
    return hs, False


def _dense_topk(weight: torch.Tensor, limit: int, states: torch.Tensor, k: int = 5, chunk: int = 256) -> torch.Tensor:
    """The dense head's top-``k`` token ids per state (on the weight's device)."""
    states = states.to(weight.device)
    w = weight[:limit].to(states.dtype)
    out = []
    for s in range(0, states.shape[0], chunk):
        logits = states[s : s + chunk] @ w.T
        # top-k by value; the top-1 column re-taken by argmax so ties go to the lowest id as in the heads
        top = logits.topk(k, dim=1).indices
        top[:, 0] = logits.argmax(dim=1)
        out.append(top)
    return torch.cat(out)


@torch.inference_mode()
def quality_curve(head, weight: torch.Tensor, states: torch.Tensor, probes: Sequence[int], *,
                  categories: Sequence[str] | None = None, progress: bool = True) -> list[dict]:
    """Top-1 agreement and top-1/top-5 recall of FlashHead against the dense head, per probe count. Everything
    is computed on the head's device (the states are moved there); only the counts come back."""
    from ..progress import tqdm

    states = states.to(head.device)
    top5 = _dense_topk(weight, head.vocab_limit, states).to(head.device)
    dense1 = top5[:, 0]
    cluster_of = head.assignments
    special = torch.zeros(head.vocab_size, dtype=torch.bool, device=head.device)
    special[head.special_ids] = True
    ranks = {}
    for name, cen in (("reference", head.unit_centroids), ("fast", head.fast_centroids)):
        scores = (states.to(cen.dtype) @ cen.T).float()
        order = scores.argsort(dim=1, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(head.n_clusters, device=order.device).expand_as(order).contiguous())
        ranks[name] = rank.gather(1, cluster_of[top5])  # [N, 5]: rank of each dense top-5 token's cluster
    saved = head.n_probes
    rows = []
    try:
        for p in tqdm(list(probes), desc="quality over n_probes", disable=not progress):
            head.with_probes(p)
            chosen = torch.cat([head(states[i : i + 1]) for i in range(states.shape[0])])
            r = {"n_probes": int(p), "candidates": head.candidates_per_step(),
                 "agreement": float((chosen == dense1).float().mean()), "states": int(states.shape[0])}
            if categories is not None:
                same = (chosen == dense1).tolist()
                r["agreement_by_category"] = {
                    c: sum(x for x, k in zip(same, categories) if k == c) / sum(1 for k in categories if k == c)
                    for c in dict.fromkeys(categories)}
            for name, rank in ranks.items():
                inside = (rank < p) | special[top5]
                r[f"recall_top1_{name}"] = float(inside[:, 0].float().mean())
                r[f"recall_top5_{name}"] = float(inside.float().mean())
            rows.append(r)
    finally:
        head.with_probes(saved)
    return rows


def _speedups(stats: dict[str, dict], base: str) -> dict[str, dict]:
    b = stats[base]
    return {name: {"speedup_mean": b["mean_ms"] / s["mean_ms"], "speedup_p50": b["p50_ms"] / s["p50_ms"]}
            for name, s in stats.items() if name != base}


def say_if_disturbed(part: dict, what: str) -> None:
    """A note on the terminal where a timed part's CPU counters say something else ran beside it."""
    said = judge_timed(part)
    if said["disturbed"]:
        note(f"{what} was disturbed: {said['why']}; its timings are not the method's alone")


def _raw(times: dict[str, list[float]], items: int) -> dict:
    """Every timing in ms, in the timer's order (repetition-major over ``items``), for the intervals of the ratios."""
    return {"items": items, "times_ms": {name: [round(1e3 * t, 6) for t in ts] for name, ts in times.items()}}


@torch.inference_mode()
def head_latency(heads: dict[str, torch.nn.Module], states: torch.Tensor, *, reps: int = 5, warmup: int = 10,
                 base: str = "dense", progress: bool = True) -> dict:
    """Tables 4.1/4.2: per head, latency of one greedy call on one hidden state (``[1, D]``), same states, on
    the heads' device (its clock: CUDA events on a GPU)."""
    device = next(iter(heads.values())).device
    if any(h.device != device for h in heads.values()):
        raise ConfigError("head_latency compares heads on one device; these are on "
                          f"{', '.join(sorted({str(h.device) for h in heads.values()}))}.")
    states = states.to(device)
    rows = [states[i : i + 1].contiguous() for i in range(states.shape[0])]
    fns = {name: (lambda i, h=h: h(rows[i])) for name, h in heads.items()}
    with Watch() as machine:
        times = interleaved(fns, len(rows), reps=reps, warmup=warmup, desc="head latency", progress=progress,
                            device=device)
    stats = {name: stats_ms(ts) for name, ts in times.items()}
    return {"stats": stats, "speedups": _speedups(stats, base), "base": base, **_raw(times, len(rows)),
            "machine": machine.record}


@torch.inference_mode()
def step_latency(model, heads: dict[str, torch.nn.Module | None], contexts: Sequence[Sequence[int]], *,
                 vocab_limit: int, reps: int = 10, warmup: int = 3, base: str = "dense",
                 progress: bool = True) -> dict:
    """Tables 4.3/4.4: one complete decode step (body + head) per configuration, at each context's length.

    ``heads`` maps a configuration name to its head; ``None`` means the body alone (no head at all).
    Each configuration keeps its own KV cache, prefilled with the context once; a timed step feeds the
    context's last token, reads the token id back (the loop's host sync), and the cache entry is dropped.
    """
    states = {}
    for name, head in heads.items():
        states[name] = [ModelState(model, head=head if head is not None else DenseGreedyHead.from_model(model, vocab_limit),
                                   vocab_limit=vocab_limit) for _ in contexts]
        for st, ctx in zip(states[name], contexts):
            st.greedy(list(ctx)[:-1], last_only=True)

    def step(name: str, i: int) -> None:
        st, ctx = states[name][i], contexts[i]
        if heads[name] is None:
            st.hidden([ctx[-1]])
        else:
            int(st.greedy([ctx[-1]], last_only=True)[0])
        st.crop(1)

    fns = {name: (lambda i, n=name: step(n, i)) for name in heads}
    with Watch() as machine:
        times = interleaved(fns, len(contexts), reps=reps, warmup=warmup, desc="decode step", progress=progress,
                            device=next(model.parameters()).device)
    stats = {name: stats_ms(ts) for name, ts in times.items()}
    return {"stats": stats, "speedups": _speedups({k: v for k, v in stats.items() if heads[k] is not None}, base),
            "base": base, "context_lengths": [len(c) for c in contexts], **_raw(times, len(contexts)),
            "machine": machine.record}


PARTS = ("quality", "head", "step")


def known_parts() -> tuple[str, ...]:
    """The thesis' parts and those the studies add (:data:`thesis_lib.extensions.MODEL_BENCH_PARTS`), run only
    when asked for."""
    return PARTS + tuple(extensions.MODEL_BENCH_PARTS)


def default_probe_list(n_clusters: int) -> list[int]:
    """Probe counts for the curves: powers of two up to C/4, Embedl's default C/16, and C (= dense)."""
    ps = {p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048) if p <= n_clusters // 4}
    ps |= {max(1, n_clusters // 16), n_clusters}
    return sorted(ps)


def run(loaded, flash_head, prompts: Sequence[Prompt], *, parts: Sequence[str] = PARTS,
        probes: Sequence[int] | None = None, state_tokens: int = 128, head_reps: int = 3, step_reps: int = 5,
        curve_reps: int = 1, chat: bool = True, progress: bool = True, states_file: str | None = None,
        thinking: bool | None = None) -> dict:
    """All model-only measurements on one draft: returns one JSON-able document (the data of Tables 4.1-4.4).

    ``parts``: any of "quality" (agreement/recall curves), "head" (Tables 4.1/4.2, plus the latency curve
    over ``probes``), "step" (Tables 4.3/4.4), or a study's part (:func:`known_parts`). Hidden states are
    collected once and shared by all parts.
    """
    known = known_parts()
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise ConfigError(f"unknown part(s) {unknown}; use some of {', '.join(known)}.")
    studies = {name: extensions.MODEL_BENCH_PARTS[name] for name in parts if name not in PARTS}
    probes = default_probe_list(flash_head.n_clusters) if probes is None else [check_probes(p, flash_head.n_clusters) for p in probes]
    doc: dict = {"flashhead": {"n_clusters": flash_head.n_clusters, "cluster_size": flash_head.cluster_size,
                               "n_probes": flash_head.n_probes, "candidates": flash_head.candidates_per_step(),
                               "special_tokens": int(flash_head.special_ids.numel()),
                               "centroid_dtype": str(flash_head.centroid_dtype).replace("torch.", ""),
                               "path": flash_head.path,
                               "clustering": {k: v for k, v in flash_head.clustering_info.items() if k != "history"}},
                 "probes": list(probes), "parts": list(parts)}
    t0 = time.perf_counter()
    hs, reused = cached_hidden_states(loaded, prompts, states_file, max_new_tokens=state_tokens, chat=chat,
                                      progress=progress, thinking=thinking)
    doc["hidden_states"] = {"n": int(hs.states.shape[0]), "prompts": len(prompts), "max_new_tokens": state_tokens,
                            "seconds": round(time.perf_counter() - t0, 1), "reused_from_file": reused}
    dense = DenseGreedyHead.from_model(loaded.model, loaded.vocab_limit)
    states = hs.states.to(flash_head.device)  # kept on the CPU between runs; measured where the head lives
    if "quality" in parts or any(part.needs_weight for part in studies.values()):
        weight = loaded.model.get_output_embeddings().weight.detach()  # a dense copy if the layer is packed: once
        if "quality" in parts:
            doc["quality"] = quality_curve(flash_head, weight, states, probes, categories=hs.categories,
                                           progress=progress)
        for name, part in studies.items():
            if part.needs_weight:
                doc[name] = part.run(flash_head, states, dense=dense, weight=weight, reps=head_reps, progress=progress)
        del weight
    if "head" in parts:
        flash_head(states[:1])  # compile before timing
        heads = {"dense": dense, "flashhead": flash_head}
        doc["head"] = head_latency(heads, states, reps=head_reps, progress=progress)
        doc["head"]["flashhead_path"] = flash_head.active_path
        doc["head"]["flashhead_compile_error"] = flash_head.compile_error
        say_if_disturbed(doc["head"], "the head latency (Tables 4.1/4.2)")
        curve = []
        saved = flash_head.n_probes
        try:
            for p in probes:
                flash_head.with_probes(p)
                flash_head(states[:1])
                r = head_latency({"dense": dense, "flashhead": flash_head}, states[:200], reps=curve_reps,
                                 warmup=5, progress=False)
                curve.append({"n_probes": p, "flashhead": r["stats"]["flashhead"], "dense": r["stats"]["dense"],
                              **r["speedups"]["flashhead"]})
        finally:
            flash_head.with_probes(saved)
        doc["head_curve"] = curve
    for name, part in studies.items():
        if not part.needs_weight:
            doc[name] = part.run(flash_head, states, dense=dense, weight=None, reps=head_reps, progress=progress)
    if "step" in parts:
        contexts = [encode(loaded.tokenizer, p.text, chat=chat, thinking=thinking) for p in prompts]
        heads = {"dense": dense, "dense_shared": DenseGreedyHead.from_model(loaded.model, loaded.vocab_limit),
                 "flashhead": flash_head, "body_only": None}
        doc["step"] = step = step_latency(loaded.model, heads, contexts, vocab_limit=loaded.vocab_limit,
                                          reps=step_reps, progress=progress)
        say_if_disturbed(step, "the decode step (Tables 4.3/4.4)")
        st = step["stats"]
        # what the head costs inside a step, and the best step speedup any head could give (a free head)
        for key in ("mean_ms", "p50_ms"):
            dense_ms, body_ms = st["dense"][key], st["body_only"][key]
            step[f"head_share_{key[:-3]}"] = (dense_ms - body_ms) / dense_ms
            step[f"head_only_ceiling_{key[:-3]}"] = dense_ms / body_ms
    return doc
