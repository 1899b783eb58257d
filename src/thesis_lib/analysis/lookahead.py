"""What a block-length policy can gain, judged from one pass over the target's own output.

In greedy speculative decoding every round starts after a prefix of the target's greedy output: after
``out[:t]`` the draft continues greedily and the target accepts the longest prefix of that continuation
that equals ``out[t:]``. Which tokens the draft proposes there, and how sure its head was of each, depend
on ``t`` alone, not on the policy that led there. So one pass (:func:`draft_lookahead`) records, at every
position, the draft's greedy continuation up to ``depth`` tokens with each token's probability under the
draft head, and the prompt-lookup proposal there; with measured costs (one draft step; the target's
forward over ``n`` tokens) any block-length policy's rounds and decode time follow by walking the output
(:func:`simulate`), without a decoding run per policy:

- :func:`fixed_policy`: K tokens every round, the thesis' loop;
- :func:`threshold_policy`: stop at the first token whose probability is below ``tau`` (that token still
  proposed), at most ``cap`` tokens -- what :class:`thesis_lib.decoding.drafters.ModelDrafter`'s ``stop_below`` does;
- :func:`oracle`: the clairvoyant schedule, by dynamic programming over positions: each round drafts
  exactly as many tokens as pay off, knowing what the target will accept (or none, and takes a plain
  target step). No policy that only chooses block lengths beats it at these costs; with ``lookup=True``
  a round may also take the lookup's proposal at no draft cost, bounding the lookup + draft hybrids too.

The walk costs a deferred round with :mod:`thesis_lib.decoding.costs` (``k`` draft steps plus one verify forward
over ``k + 1`` tokens, at the cheapest measured size of at least ``k + 1``), and the last token alone as one
target step; Python and cache work are left out (the chapter sets measured runs beside it).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..decoding.costs import round_cost, verify_cost
from ..decoding.drafters import NgramDrafter
from ..decoding.state import ModelState
from ..decoding.stats import accepted_prefix
from ..errors import ConfigError


@torch.inference_mode()
def draft_lookahead(model, head, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int,
                    vocab_limit: int | None = None, min_ngram: int = 2, max_ngram: int = 3,
                    progress: bool = True) -> list[dict]:
    """For each ``(prompt_ids, target_tokens)`` and each position ``t``: the draft's greedy continuation of
    ``prompt + target_tokens[:t]`` (``depth`` tokens, ``tokens[t]``), its head's probability of each
    (``probs[t]``) and the lookup's proposal there (``lookup[t]``, up to ``depth`` tokens, maybe empty).

    Where the target's token equals the continuation's first token, the next position's continuation is the
    same chain one token on, so only one more draft step is needed (the cache already holds the rest)."""
    from ..progress import tqdm

    if depth < 1:
        raise ConfigError(f"depth must be at least 1, got {depth}.")
    if not hasattr(head, "greedy_confidence"):
        raise ConfigError(f"{type(head).__name__} gives no confidence.")
    state = ModelState(model, head=head, vocab_limit=vocab_limit)
    lookup = NgramDrafter(min_ngram=min_ngram, max_ngram=max_ngram, pad=False)
    rows = []

    def step(ids) -> tuple[int, float]:
        tok, prob = head.greedy_confidence(state.hidden(ids)[-1:])
        return int(tok[0]), float(prob[0])

    for prompt, out in tqdm(sequences, desc="draft lookahead", disable=not progress):
        state.reset()
        chain: list[tuple[int, float]] = []  # continuation of the current prefix; the cache holds chain[:-1]
        toks, probs, looks = [], [], []
        feed = list(prompt)
        for t, target_tok in enumerate(out):
            while len(chain) < depth:
                chain.append(step(feed))
                feed = [chain[-1][0]]
            toks.append([c[0] for c in chain])
            probs.append([c[1] for c in chain])
            lookup.begin(list(prompt) + list(out[:t]))
            looks.append(lookup.lookup(depth))
            if chain[0][0] == target_tok:
                chain = chain[1:]  # the prefix grows by chain[0]; the cache already holds it
            else:
                state.crop(depth - 1)  # back to the prefix
                chain, feed = [], [int(target_tok)]
        rows.append({"tokens": toks, "probs": probs, "lookup": looks, "target": list(out)})
    return rows


def fixed_policy(k: int):
    """K tokens every round."""
    if k < 1:
        raise ConfigError(f"K must be at least 1, got {k}.")
    return lambda tokens, probs: k


def threshold_policy(tau: float, cap: int):
    """Up to and including the first token with probability below ``tau``; at most ``cap`` tokens."""
    if not 0 < tau < 1:
        raise ConfigError(f"tau is a probability threshold in (0, 1), got {tau!r}.")

    def policy(tokens, probs):
        for j, p in enumerate(probs[:cap]):
            if p < tau:
                return j + 1
        return min(cap, len(probs))
    return policy


def simulate(rows: Sequence[dict], policy, *, step_ms: float, verify_ms: dict, lookup: bool = False,
             max_new_tokens: int | None = None) -> dict:
    """Walk each output with ``policy(tokens, probs) -> k``; returns modelled decode ms (``ms``, of which
    ``draft_ms`` drafting and ``verify_ms`` the target's forwards), tokens after the first, rounds, drafted and
    accepted tokens. With ``lookup`` a position with a lookup match proposes that block (cut to the tokens still
    allowed, less one) at no draft cost, as the unpadded hybrid drafter does. A round's block is capped as the loop caps it, at the
    tokens still allowed less one: ``max_new_tokens`` (the loop's limit) less the tokens so far; without it, the
    output's own length less them, which is the same for an output the limit ended, but near the end of one that
    EOS ended it caps the blocks the loop (not knowing the end) would draft in full."""
    cost = verify_cost(verify_ms)
    total = {"ms": 0.0, "draft_ms": 0.0, "verify_ms": 0.0, "tokens": 0, "rounds": 0, "drafted": 0, "accepted": 0}
    for r in rows:
        out, n_tok = r["target"], len(r["target"])
        if max_new_tokens is not None and n_tok > max_new_tokens:
            raise ConfigError(f"An output of {n_tok} tokens is longer than the limit it is walked with "
                              f"({max_new_tokens}).")
        t = 1
        while t < n_tok:
            rem = (n_tok if max_new_tokens is None else max_new_tokens) - t
            if rem == 1:
                total["ms"] += cost(1)
                total["verify_ms"] += cost(1)
                break
            look = r["lookup"][t] if lookup else []
            if look:
                y, draft_steps = look[:rem - 1], 0
            else:
                k = max(1, min(policy(r["tokens"][t], r["probs"][t]), rem - 1))
                y = r["tokens"][t][:k]
                draft_steps = len(y)
            n = accepted_prefix(y, out[t:])
            total["ms"] += round_cost(draft_steps, step_ms, cost(len(y) + 1))
            total["draft_ms"] += draft_steps * step_ms
            total["verify_ms"] += cost(len(y) + 1)
            total["rounds"] += 1
            total["drafted"] += len(y)
            total["accepted"] += n
            t += n + 1
        total["tokens"] += max(0, n_tok - 1)
    return total


def oracle(rows: Sequence[dict], *, step_ms: float, verify_ms: dict, k_max: int, lookup: bool = False) -> dict:
    """The clairvoyant schedule's modelled decode ms: at every position the cheapest of a plain target step,
    a draft block of any length 1..``k_max`` (and, with ``lookup``, any prefix of the lookup's block),
    knowing how many tokens each would get accepted."""
    cost = verify_cost(verify_ms)
    total_ms, tokens = 0.0, 0
    for r in rows:
        out, n_tok = r["target"], len(r["target"])
        run = [accepted_prefix(r["tokens"][t], out[t:]) for t in range(n_tok)]
        run_lookup = [accepted_prefix(r["lookup"][t], out[t:]) if lookup else 0 for t in range(n_tok)]

        best = [0.0] * (n_tok + 1)  # best[t]: the least time to emit out[t:] (filled from the end)
        for t in range(n_tok - 1, 0, -1):
            options = [cost(1) + best[t + 1]]
            for k in range(1, min(k_max, n_tok - t - 1) + 1):
                options.append(round_cost(k, step_ms, cost(k + 1)) + best[t + min(run[t], k) + 1])
            for k in range(1, min(run_lookup[t], n_tok - t - 1) + 1):
                options.append(round_cost(0, step_ms, cost(k + 1)) + best[t + k + 1])
            best[t] = min(options)
        total_ms += best[1] if n_tok > 1 else 0.0
        tokens += max(0, n_tok - 1)
    return {"ms": total_ms, "tokens": tokens}


__all__ = ["draft_lookahead", "fixed_policy", "threshold_policy", "simulate", "oracle"]
