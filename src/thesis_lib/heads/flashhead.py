"""The FlashHead LM head: cluster-first retrieval, then exact scores for the candidates (thesis sections 2.5, 3.4).

- **Greedy** (:meth:`FlashHead.forward`): score the ``C`` centroids as ``h . c / |c|`` (Embedl's convention), keep
  the ``n_probes`` best clusters, compute the exact logits of their tokens plus the special tokens (always
  candidates), return the argmax, ties to the lowest token id. With ``n_probes = C`` it is the dense argmax.
- **Sampling** (:meth:`FlashHead.sample`): draw ``n_probes`` clusters without replacement from
  ``softmax(h . c / T)``, then a token from the candidates' softmax; returns the token *and* the exact
  candidate-restricted distribution it was drawn from (lossless speculative sampling's draft distribution ``q``).
- **No host synchronisation**: every result is a tensor; nothing calls ``.item()`` or branches on values.
- **Layout**: the head's rows are copied once into a pre-permuted ``[C, b, D]`` tensor, so the candidates are
  ``n_probes`` contiguous blocks; slots that must never win (padding, rows past the tokenizer, special tokens,
  scored separately) carry a ``-inf`` bias. This costs a second copy of the head.
- **Paths** (``path=``): ``"compiled"`` fuses gather, dot products and the tie-breaking argmax in one
  ``torch.compile``d function (the candidate rows are read once, never copied); ``"eager"`` gathers and
  multiplies; ``"reference"`` is the plain float32 computation the tests compare against; ``"triton"`` is the
  GPU's (:mod:`thesis_lib.heads.gpu_kernels`), ``"kernel"`` the CPU's greedy head in one C++ call
  (:mod:`thesis_lib.heads.cpu_kernels`; its other calls compiled). ``"auto"``: triton on CUDA, the kernel on a CPU
  where it builds (greedy; compiled for the rest), else compiled, else eager.
- **Precision**: centroids rank in bfloat16 where the CPU has fast bf16 (``centroid_dtype="auto"``); candidates
  score from the head's own rows in at least float32 (:func:`score_dtype`), so two candidates tie only when
  their float32 logits do.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..errors import ClusteringAssetError, ConfigError
from ..models.cpu import fast_bf16
from .clustering import Clustering
from . import cpu_kernels, gpu_kernels
from .dense import ranked, top_probability
from .draws import multinomial

PATHS = ("auto", "compiled", "eager", "reference", "triton", "kernel")


def default_probes(n_clusters: int) -> int:
    """Embedl's default probe count: C / 16 (at least 1)."""
    return max(1, n_clusters // 16)


def check_probes(n_probes: int, n_clusters: int) -> int:
    n_probes = int(n_probes)
    if not 1 <= n_probes <= n_clusters:
        raise ConfigError(f"n_probes={n_probes} is out of range: use 1..{n_clusters} (the number of clusters); "
                          f"FlashHead's default is C/16 = {default_probes(n_clusters)}.")
    return n_probes


def _select(scores: torch.Tensor, ids: torch.Tensor, sentinel: int) -> torch.Tensor:
    """Argmax over the last dim, ties to the lowest id: ``scores, ids [S, n] -> [S]``."""
    best = scores.amax(dim=-1, keepdim=True)
    return torch.where(scores == best, ids, torch.full_like(ids, sentinel)).amin(dim=-1)


def score_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype candidates are scored in: float32 for 16-bit rows (widened as they are read), else the rows' own
    (float32, float64): no two candidates tie merely by a 16-bit rounding of their logits."""
    return torch.promote_types(weight_dtype, torch.float32)


def _torch_cluster_scores(h: torch.Tensor, weight_perm: torch.Tensor, top: torch.Tensor,
                          slot_bias: torch.Tensor) -> torch.Tensor:
    """The probed clusters' rows scored in torch (what ``torch.compile`` fuses): ``[S, p, b]`` float32, products
    and sums in :func:`score_dtype`."""
    acc = score_dtype(weight_perm.dtype)
    return (weight_perm[top].to(acc) * h.to(acc)[:, None, None, :]).sum(-1).float() + slot_bias[top]


def _candidates_fused(h: torch.Tensor, centroids: torch.Tensor, weight_perm: torch.Tensor, slot_bias: torch.Tensor,
                      tokens: torch.Tensor, special_w: torch.Tensor, special_b: torch.Tensor,
                      special_ids: torch.Tensor, n_probes: int,
                      cluster_scores=_torch_cluster_scores) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast path's candidate scores and their token ids, ``[S, p * b + ns]`` each. ``cluster_scores`` scores
    the probed clusters' rows: torch by default, :func:`thesis_lib.heads.gpu_kernels.cluster_scores` on a GPU."""
    s = h.shape[0]
    cs = torch.matmul(h.to(centroids.dtype), centroids.T)  # [S, C]
    # unsorted: the probes' order does not matter (ties go to the lowest id, not to probe rank), and on a GPU a
    # sorted top-593 of 9,496 costs more than the rest of the head
    top = torch.topk(cs, n_probes, dim=-1, sorted=False).indices  # [S, p]
    logits = cluster_scores(h, weight_perm, top, slot_bias)  # [S, p, b]
    acc = score_dtype(weight_perm.dtype)  # like the clusters' rows
    sp = torch.matmul(h.to(acc), special_w.to(acc).T).float() + special_b  # [S, ns]
    scores = torch.cat([logits.reshape(s, -1), sp], dim=1)
    ids = torch.cat([tokens[top].reshape(s, -1), special_ids.expand(s, -1)], dim=1)
    return scores, ids


def _greedy_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids, n_probes: int,
                  sentinel: int, cluster_scores=_torch_cluster_scores) -> torch.Tensor:
    """The whole greedy head as one function (compiled by ``torch.compile`` on the fast path)."""
    scores, ids = _candidates_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids,
                                    n_probes, cluster_scores)
    return _select(scores, ids, sentinel)


def _confidence_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids, n_probes: int,
                      sentinel: int, cluster_scores=_torch_cluster_scores) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_greedy_fused` plus the softmax probability of the chosen token among the candidates."""
    scores, ids = _candidates_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids,
                                    n_probes, cluster_scores)
    return _select(scores, ids, sentinel), top_probability(scores)


def _top_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids, n_probes: int,
               sentinel: int, r: int, cluster_scores=_torch_cluster_scores) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``r`` best candidates, greedy token first, and their log-probabilities among the candidates."""
    scores, ids = _candidates_fused(h, centroids, weight_perm, slot_bias, tokens, special_w, special_b, special_ids,
                                    n_probes, cluster_scores)
    return ranked(scores, ids, _select(scores, ids, sentinel), r)


@dataclass
class FlashHeadSample:
    """One sampled token and the exact distribution it was drawn from (over ``candidates``; zero elsewhere)."""

    token: torch.Tensor  # [] long
    candidates: torch.Tensor  # [n] long token ids (slots with probability 0 may repeat ids)
    probs: torch.Tensor  # [n] float32 (float64 with a sampler), sums to 1
    clusters: torch.Tensor  # [n_probes] long, the clusters drawn

    def dense(self, vocab_size: int) -> torch.Tensor:
        """The distribution as a ``[vocab_size]`` vector."""
        q = torch.zeros(vocab_size, dtype=self.probs.dtype, device=self.probs.device)
        inside = self.candidates < vocab_size  # padding rows past the tokenizer have probability 0
        if bool((self.probs[~inside] > 0).any()):
            raise ValueError(f"a candidate at or past vocab_size={vocab_size} has probability > 0")
        return q.index_add_(0, self.candidates[inside], self.probs[inside])


class FlashHead(nn.Module):
    """A drop-in greedy (and sampling) head built from a model's output embedding and a clustering."""

    def __init__(self, weight: torch.Tensor, clustering: Clustering, *, n_probes: int | None = None,
                 special_ids: Sequence[int] = (), vocab_limit: int | None = None, bias: torch.Tensor | None = None,
                 path: str = "auto", centroid_dtype: str | torch.dtype = "auto"):
        super().__init__()
        v, d = weight.shape
        if clustering.vocab_size != v or clustering.hidden_size != d:
            raise ClusteringAssetError(
                f"FlashHead assets were built for a {clustering.vocab_size} x {clustering.hidden_size} head; "
                f"this model's head is {v} x {d}.")
        if path not in PATHS:
            raise ConfigError(f"unknown FlashHead path {path!r}: use one of {', '.join(PATHS)}.")
        self.n_clusters = clustering.n_clusters
        self.n_probes = check_probes(default_probes(self.n_clusters) if n_probes is None else n_probes, self.n_clusters)
        self.configured_probes = self.n_probes  # what it was built with (a checkpoint's config, or C/16)
        self.vocab_size = v
        self.vocab_limit = v if vocab_limit is None else min(int(vocab_limit), v)
        self.clustering_info = dict(clustering.info)
        w = weight.detach()
        device = w.device
        tokens, real = clustering.cluster_table()
        tokens, real = tokens.to(device), real.to(device)
        self.cluster_size = int(tokens.shape[1])
        special = sorted({int(i) for i in special_ids if 0 <= int(i) < self.vocab_limit})
        special_t = torch.tensor(special, dtype=torch.long, device=device)
        is_special = torch.zeros(v, dtype=torch.bool, device=device)
        is_special[special_t] = True
        keep = real & (tokens < self.vocab_limit) & ~is_special[tokens]
        bias_v = torch.zeros(v, dtype=torch.float32, device=device) if bias is None else bias.detach().float().to(device)
        slot_bias = torch.where(keep, bias_v[tokens], torch.full_like(bias_v[tokens], float("-inf")))

        raw = clustering.centroids.to(device=device, dtype=torch.float32)
        unit = raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)
        if centroid_dtype == "auto":
            fast = device.type == "cuda" or (device.type == "cpu" and fast_bf16())
            centroid_dtype = torch.bfloat16 if fast else torch.float32
        elif isinstance(centroid_dtype, str):
            centroid_dtype = getattr(torch, centroid_dtype)
        self.centroid_dtype = centroid_dtype
        self.register_buffer("centroids", raw, persistent=False)  # raw means (sampling)
        self.register_buffer("unit_centroids", unit, persistent=False)  # float32, normalised (reference)
        self.register_buffer("fast_centroids", unit.to(centroid_dtype).contiguous(), persistent=False)
        self.register_buffer("tokens", tokens.contiguous(), persistent=False)
        self.register_buffer("assignments", clustering.assignments.to(device), persistent=False)  # [V]
        self.register_buffer("slot_bias", slot_bias.contiguous(), persistent=False)
        self.register_buffer("weight_perm", w[tokens].contiguous(), persistent=False)  # [C, b, D]
        self.register_buffer("special_ids", special_t, persistent=False)
        self.register_buffer("special_weight", w[special_t].contiguous(), persistent=False)
        self.register_buffer("special_bias", bias_v[special_t].contiguous(), persistent=False)
        if path == "triton" and not gpu_kernels.serves(device, tokens.shape[1], d):
            raise ConfigError("FlashHead path 'triton' needs a CUDA device with Triton and a power-of-two cluster "
                              f"size (here: {device}, cluster size {tokens.shape[1]}, hidden size {d}).")
        if path == "kernel" and not cpu_kernels.serves(device, self.fast_centroids.dtype, self.weight_perm.dtype):
            raise ConfigError("FlashHead path 'kernel' needs CPU tensors in bfloat16 or float32 and the project's "
                              f"kernel module (here: {device}, centroids {self.fast_centroids.dtype}, rows "
                              f"{self.weight_perm.dtype}).")
        self.path = path
        self._compiled = None
        self._compiled_conf = None
        self._active_path = None
        self.compile_error: str | None = None
        self.compile_mode: str | None = None  # torch.compile's mode ("reduce-overhead": CUDA graphs on a GPU)
        self.checkpoint: str | None = None  # an Embedl checkpoint whose assets and settings it uses
        self.body = None  # the checkpoint's own loaded model, when it replaces the dense draft's body
        self.recompile_resets = 0

    def extra_repr(self) -> str:
        return (f"V={self.vocab_size}, C={self.n_clusters}, b={self.cluster_size}, n_probes={self.n_probes}, "
                f"specials={self.special_ids.numel()}, path={self.path}, centroids={self.centroid_dtype}")

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def candidates_per_step(self) -> int:
        return self.n_probes * self.cluster_size + int(self.special_ids.numel())

    def with_probes(self, n_probes: int) -> "FlashHead":
        """Set the probe count (checked) and return self."""
        self.n_probes = check_probes(n_probes, self.n_clusters)
        return self

    # ---------------------------------------------------------------- greedy
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden: [S, D] -> token ids [S]`` (greedy)."""
        if self.path == "reference":
            return self.reference(hidden)
        return self._fast(_greedy_fused, "_compiled", hidden)

    def greedy_confidence(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [S, D] -> (token ids [S], probability [S])``: the greedy token and the probability the
        softmax over the candidates (probed clusters and specials) gives it. The same path as ``forward``
        (the reference computation for a ``reference`` head, else compiled where that works), so the tokens are
        the greedy head's."""
        if self.path == "reference":
            return self.reference(hidden, confidence=True)
        return self._fast(_confidence_fused, "_compiled_conf", hidden)

    def top(self, hidden: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [S, D] -> (token ids [S, r], log-probabilities [S, r])``: the greedy token (``forward``'s), then
        the next best candidates; probabilities under the softmax over the candidates (a token tree's ranks)."""
        if self.path == "reference":
            out = []
            for h in hidden.float():
                scores, ids = self._candidate_scores(h, self.top_clusters(h[None])[0])
                out.append(ranked(scores[None], ids[None], _select(scores[None], ids[None], self.vocab_size), r))
            return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        return self._fast(_top_fused, f"_compiled_top{r}", hidden, r)

    def greedy_shared(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden: [S, D] -> token ids [S]`` with the rows' probed clusters read once for all rows: the union of
        the clusters any row probes is scored against every row in one product, then each row's argmax is taken
        over its own probed clusters and the specials only (eager torch). The candidates are the fast path's; the
        scores are the same products summed in another order."""
        h = hidden
        s = h.shape[0]
        top = torch.topk(h.to(self.fast_centroids.dtype) @ self.fast_centroids.T, self.n_probes, dim=-1,
                         sorted=False).indices  # [S, p], as the fast path ranks
        union = torch.unique(top)  # [U]
        own = torch.zeros(s, self.n_clusters, dtype=torch.bool, device=h.device).scatter_(1, top, True)[:, union]
        acc = score_dtype(self.weight_perm.dtype)
        rows = self.weight_perm[union].reshape(-1, self.weight_perm.shape[-1])  # [U * b, D]
        scores = (h.to(acc) @ rows.to(acc).T).float().reshape(s, union.numel(), -1) + self.slot_bias[union]
        scores = scores.masked_fill(~own[:, :, None], float("-inf")).reshape(s, -1)
        sp = torch.matmul(h.to(acc), self.special_weight.to(acc).T).float() + self.special_bias
        ids = torch.cat([self.tokens[union].reshape(1, -1).expand(s, -1), self.special_ids.expand(s, -1)], dim=1)
        return _select(torch.cat([scores, sp], dim=1), ids, self.vocab_size)

    def _fast(self, fn, compiled_attr: str, hidden: torch.Tensor, *extra):
        """``fn`` on the fast path: compiled (kept in ``compiled_attr``) where ``path`` allows, else eager.

        Only a failure of compilation itself demotes an "auto" head to eager, loudly and for good: when the
        compiled call fails, the same call runs eagerly; if that fails too the error is the caller's and is
        raised, the head's path unchanged. ``compile_error`` keeps what failed. Hitting dynamo's recompile limit
        (many probe counts in a sweep) resets the compiled cache and compiles again, counted in
        ``recompile_resets``, instead of running uncompiled behind the compiled path's name."""
        args = (hidden, *self.fast_arguments(), *extra)
        if self.path == "triton" or (self.path == "auto" and gpu_kernels.serves(self.device, self.cluster_size,
                                                                                 self.weight_perm.shape[-1])):
            # on a GPU "auto" takes the Triton kernels (torch.compile's code for this head is not trusted there)
            self._active_path = "triton"
            if fn is _greedy_fused:  # the whole greedy head in Triton kernels
                return gpu_kernels.greedy(*args)
            return fn(*args, cluster_scores=gpu_kernels.cluster_scores)
        # the kernel is no torch.compile product: an "auto" head demoted to eager keeps it for greedy calls
        auto = self.path == "auto" or self.path == "eager" and self.compile_error is not None
        if fn is _greedy_fused and (self.path == "kernel" or auto and cpu_kernels.ENABLED and cpu_kernels.serves(
                self.device, self.fast_centroids.dtype, self.weight_perm.dtype)):
            self._active_path = "kernel"
            return cpu_kernels.greedy(*args)
        if self.path in ("auto", "compiled", "kernel"):
            if getattr(self, compiled_attr, None) is None:
                compile_settings()
                setattr(self, compiled_attr, torch.compile(fn, dynamic=False, mode=self.compile_mode))
            try:
                out = self._compiled_call(compiled_attr, args)
                self._active_path = "compiled"
                return out
            except Exception as e:  # noqa: BLE001 - sorted out below: compile failure or the caller's error
                if self.path != "auto":
                    raise
                out = fn(*args)  # raises if the error is not compilation's (bad input, a device mix-up)
                self.compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
                msg = f"FlashHead: torch.compile failed ({self.compile_error}); using the eager path from now on."
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
                logging.getLogger("thesis_lib").warning(msg)
                self.path = "eager"
                self._active_path = "eager"
                return out
        self._active_path = "eager"
        return fn(*args)

    def fast_arguments(self) -> tuple:
        """What the fast path's functions take after the hidden states."""
        return (self.fast_centroids, self.weight_perm, self.slot_bias, self.tokens, self.special_weight,
                self.special_bias, self.special_ids, self.n_probes, self.vocab_size)

    def _compiled_call(self, compiled_attr: str, args: tuple):
        try:
            return getattr(self, compiled_attr)(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            torch._dynamo.reset()  # every compiled function of this process compiles again on its next call
            self.recompile_resets += 1
            return getattr(self, compiled_attr)(*args)

    @property
    def active_path(self) -> str | None:
        """The path the last call took ("compiled", "eager", "reference", "triton" or "kernel")."""
        return self._active_path

    def top_clusters(self, hidden: torch.Tensor, n_probes: int | None = None, *, reference: bool = True) -> torch.Tensor:
        """The probed clusters ``[S, n_probes]`` (float32 ranking if ``reference``, else the fast path's dtype)."""
        p = self.n_probes if n_probes is None else check_probes(n_probes, self.n_clusters)
        cen = self.unit_centroids if reference else self.fast_centroids
        return torch.topk(hidden.to(cen.dtype) @ cen.T, p, dim=-1).indices

    def _candidate_scores(self, h: torch.Tensor, clusters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain float32 logits and ids of one position's candidates: the clusters' slots, then the specials."""
        b = self.cluster_size
        slots = (clusters[:, None] * b + torch.arange(b, device=clusters.device)).reshape(-1)
        flat_w = self.weight_perm.reshape(-1, self.weight_perm.shape[-1])
        logits = flat_w.index_select(0, slots).float() @ h + self.slot_bias.reshape(-1)[slots]
        sp = self.special_weight.float() @ h + self.special_bias
        return torch.cat([logits, sp]), torch.cat([self.tokens.reshape(-1)[slots], self.special_ids])

    def reference(self, hidden: torch.Tensor, confidence: bool = False):
        """The plain computation, one position at a time, in float32: what the fast paths must reproduce; with
        ``confidence``, also each chosen token's probability among the candidates (as :meth:`greedy_confidence`)."""
        self._active_path = "reference"
        out, probs = [], []
        for h in hidden.float():
            scores, ids = self._candidate_scores(h, self.top_clusters(h[None])[0])
            out.append(_select(scores[None], ids[None], self.vocab_size))
            probs.append(top_probability(scores[None]))
        return (torch.cat(out), torch.cat(probs)) if confidence else torch.cat(out)

    def candidate_ids(self, hidden: torch.Tensor, n_probes: int | None = None, *, reference: bool = False) -> torch.Tensor:
        """``[S, n_probes * b]`` token ids in the probed clusters (padding repeats ids); specials not included."""
        return self.tokens[self.top_clusters(hidden, n_probes, reference=reference)].reshape(hidden.shape[0], -1)

    # ---------------------------------------------------------------- sampling
    def sample(self, hidden: torch.Tensor, *, temperature: float = 1.0, generator: torch.Generator | None = None,
               sampler=None) -> FlashHeadSample:
        """Sample one token for one position (``hidden: [D]`` or ``[1, D]``); see the module docstring.
        With a :class:`thesis_studies.sampling.loop.Sampler` its temperature, top-k and top-p shape the distribution
        over the candidates (and its temperature the cluster draw)."""
        if sampler is not None:
            temperature = sampler.temperature
        if temperature <= 0:
            raise ConfigError("temperature must be > 0 for sampling; use the greedy head for temperature 0.")
        h = hidden.reshape(-1).float()
        cluster_p = torch.softmax((self.centroids @ h) / temperature, dim=-1)
        clusters = multinomial(cluster_p, self.n_probes, generator)
        scores, cand = self._candidate_scores(h, clusters)
        probs = torch.softmax(scores / temperature, dim=-1) if sampler is None else sampler.probs(scores)
        pick = multinomial(probs, 1, generator)[0]
        return FlashHeadSample(token=cand[pick], candidates=cand, probs=probs, clusters=clusters)


_COMPILE_SET = False


def compile_settings(n: int = 64) -> None:
    """Dynamo's settings for this project's compiled functions, applied once before the first ``torch.compile``
    (not at import: importing dynamo is slow, and a process that never compiles should not pay for it). Each (probe
    count, batch) pair compiles once; allow enough of them (a sweep uses ~10), and make hitting the limit an error (:meth:`FlashHead._fast` recompiles) instead of a silent
    fall-back to eager code."""
    global _COMPILE_SET
    if _COMPILE_SET:
        return
    cfg = torch._dynamo.config
    if cfg.recompile_limit < n:
        cfg.recompile_limit = n
    cfg.fail_on_recompile_limit_hit = True
    _COMPILE_SET = True
