"""Chapter 6, beyond the thesis: adaptive probes and block lengths, the co-designed head, the frequency-truncated
head and lookahead, measured on held-out calibration prompts and judged on the benchmark's
(:mod:`.experiments`); :mod:`.tables` and :mod:`.verdicts` read them, :mod:`.figures` draws them;
:mod:`.codesign` and :mod:`.lookahead` judge settings without a decoding run each. Its drafts' heads
(:mod:`.heads`: :mod:`.adaptive`, :mod:`.truncated`) and block-length policies (:mod:`.policies`) plug into the
core's runs."""

from functools import partial

from thesis_lib import extensions

from . import experiments, heads, policies, verdicts

extensions.add_rules(verdicts.RULES)
extensions.BOOK_RUNS.append(experiments.k_sweep_config)
extensions.DRAFT_HEADS.update(adaflash=heads.adaptive_head, freq=heads.truncated_head)
extensions.K_POLICIES.update(heuristic=extensions.KPolicy(partial(policies.make_policy, "heuristic")),
                             cost=extensions.KPolicy(partial(policies.make_policy, "cost"), needs_costs=True))
