"""What a block-length policy can gain, from one pass over the target's output: under greedy decoding a round after
``out[:t]`` proposes the same draft continuation whatever policy led there. :func:`draft_lookahead` records it per
position; :func:`simulate` walks any policy (:func:`fixed_policy`, :func:`threshold_policy`: ``ModelDrafter``'s
``stop_below``) at measured deferred-round costs, Python and cache work left out; :func:`oracle` bounds them all.
"""

from __future__ import annotations

from typing import Sequence

import torch

from thesis_lib.decoding.costs import round_cost, verify_cost
from thesis_lib.decoding.state import ModelState
from thesis_lib.decoding.rounds import accepted_prefix
from thesis_lib.errors import ConfigError

from .lookup import NgramDrafter


@torch.inference_mode()
def draft_lookahead(model, head, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int,
                    vocab_limit: int | None = None, min_ngram: int = 2, max_ngram: int = 3,
                    progress: bool = True) -> list[dict]:
    """Per ``(prompt_ids, target_tokens)`` and position ``t``: the draft's ``depth``-token greedy continuation of
    ``prompt + target_tokens[:t]`` (``tokens[t]``), the head's probability of each (``probs[t]``) and the lookup's
    proposal (``lookup[t]``, maybe empty). Where the target keeps the chain's first token, the chain is reused."""
    from thesis_lib.progress import tqdm

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
    """Walk each output with ``policy(tokens, probs) -> k``: modelled ``ms`` (``draft_ms`` + ``verify_ms``), tokens
    after the first, rounds, drafted and accepted. With ``lookup`` a lookup match is proposed at no draft cost.
    Blocks are capped as the loop caps them, at the tokens still allowed less one (by ``max_new_tokens``, else by
    the output's length, which is tighter than the loop near an EOS)."""
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
    """The clairvoyant schedule's modelled ms (dynamic programming): per position the cheapest of a target step,
    a draft block of 1..``k_max`` or (``lookup``) a free lookup prefix, knowing what each gets accepted. No policy
    choosing only block lengths beats it at these costs."""
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
