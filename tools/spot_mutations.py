"""Hand mutations: each test below is run with the function it is named after replaced by a constant or by its
inverse, and must fail (issue 45's spot check; `make mutation` is the systematic version over the decoding core).

    python tools/spot_mutations.py          # every case, one pytest process each; exit 1 if any test still passes

Run as a pytest plugin (``-p spot_mutations``), it applies the case named by ``SPOT_CASE`` before the tests run.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _uniform(self, logits):
    import torch

    return torch.full(logits.shape, 1.0 / logits.shape[-1], dtype=torch.float64)


def _worst_k(orig):
    from thesis_lib.decoding import costs

    return lambda alpha, step, verify, ks, **kw: min(ks, key=lambda k: costs.rate(alpha, k, step, verify, **kw))


def _token_zero(orig):
    import torch

    return lambda self, h: torch.zeros(h.shape[0], dtype=torch.long)


#: (test node id, "module:attribute", what replaces it, factory: original -> replacement)
CASES = [
    ("tests/test_sampling.py::test_accept_or_resample_matches_the_rule",
     "thesis_studies.sampling.loop:accept_or_resample", "constant: always keep the draft's token",
     lambda orig: lambda *a, **k: None),
    ("tests/test_sampling.py::test_warp_applies_temperature_top_k_and_top_p",
     "thesis_studies.sampling.loop:Sampler.probs", "constant: the uniform distribution",
     lambda orig: _uniform),
    ("tests/test_costs.py::test_best_k_is_the_block_with_the_most_simulated_tokens_per_second",
     "thesis_lib.decoding.costs:best_k", "constant: K = 1", lambda orig: lambda *a, **k: 1),
    ("tests/test_costs.py::test_best_k_is_the_block_with_the_most_simulated_tokens_per_second",
     "thesis_lib.decoding.costs:best_k", "inverse: the K with the fewest tokens per second",
     _worst_k),
    ("tests/test_costs.py::test_verify_cost_pads_to_the_cheapest_larger_size",
     "thesis_lib.decoding.costs:verify_cost", "inverse: the dearest larger size",
     lambda orig: lambda verify: lambda n: max(v for m, v in verify.items() if m >= n)),
    ("tests/test_costs.py::test_expected_emitted_matches_a_simulated_acceptance_process",
     "thesis_lib.decoding.costs:expected_emitted", "constant: one token a round",
     lambda orig: lambda alpha, k: 1.0),
    ("tests/test_attention.py::test_the_row_probe_passes_a_row_exact_layer_and_fails_a_batch_dependent_one",
     "thesis_lib.models.attention:rows_exact_by_size", "constant: every size exact",
     lambda orig: lambda model, sizes=range(2, 14), *a, **k: {n: True for n in sizes}),
    ("tests/test_attention.py::test_the_row_probe_passes_a_row_exact_layer_and_fails_a_batch_dependent_one",
     "thesis_lib.models.attention:rows_exact_by_size", "constant: no size exact",
     lambda orig: lambda model, sizes=range(2, 14), *a, **k: {n: False for n in sizes}),
    ("tests/test_protocol.py::test_the_largest_block_covers_every_mode_s_k_and_the_carried_token",
     "thesis_lib.bench.protocol:BenchConfig.largest_block", "constant: 4", lambda orig: lambda self: 4),
    ("tests/test_beyond.py::test_tuned_margin_is_the_cheapest_within_tolerance_else_the_widest",
     "thesis_studies.beyond.tables:tuned_margin", "constant: 0.05", lambda orig: lambda curve: 0.05),
    ("tests/test_beyond.py::test_pareto_front_keeps_only_undominated_settings",
     "thesis_studies.beyond.codesign:pareto", "constant: every setting", lambda orig: lambda rows, **k: list(rows)),
    ("tests/test_beyond.py::test_truncated_head_scores_only_its_tokens_and_breaks_ties_low",
     "thesis_studies.beyond.truncated:TruncatedHead.forward", "constant: token 0",
     _token_zero),
    ("tests/test_book.py::test_the_research_question_answers_read_both_ways",
     "thesis_lib.analysis.verdicts:rq_end_to_end", "constant: cannot tell",
     lambda orig: lambda lo, hi: "Cannot tell from this run"),
    ("tests/test_book.py::test_the_remaining_verdict_rules_read_both_ways",
     "thesis_lib.analysis.verdicts:lift", "inverse: lowers where it lifts",
     lambda orig: lambda after, before: "lowers" if after > before else "lifts"),
    ("tests/test_prompts.py::test_selection_by_category_and_count",
     "thesis_lib.bench.prompts:select", "constant: no prompts", lambda orig: lambda *a, **k: []),
    ("tests/test_flashhead.py::test_all_probes_reproduce_the_dense_argmax_exactly",
     "thesis_lib.heads.dense:DenseGreedyHead.forward", "inverse: the lowest-scoring token",
     lambda orig: lambda self, hidden: self.logits(hidden).argmin(-1)),
]


def _resolve(target: str):
    module, _, attr = target.partition(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def pytest_configure(config):  # the plugin side: apply SPOT_CASE's replacement
    case = os.environ.get("SPOT_CASE")
    if case is None:
        return
    _, target, _, factory = CASES[int(case)]
    owner, name = _resolve(target)
    setattr(owner, name, factory(getattr(owner, name)))


def main() -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])}
    passed = []
    for i, (test, target, what, _) in enumerate(CASES):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p",
                              "spot_mutations", test], cwd=ROOT, env={**env, "SPOT_CASE": str(i)},
                             capture_output=True, text=True)
        # caught: the test failed an assertion (not an error of the replacement itself, e.g. a bad signature)
        caught = run.returncode == 1 and ("AssertionError" in run.stdout or "DID NOT RAISE" in run.stdout)
        fate = "fails (caught)" if caught else ("PASSES" if run.returncode == 0 else "error, see below")
        if not caught:
            passed.append(test)
            if run.returncode:
                print(run.stdout[-2000:], file=sys.stderr)
        print(f"| `{test.split('::')[1]}` | `{target}` | {what} | {fate} |", flush=True)
    return 1 if passed else 0


if __name__ == "__main__":
    sys.exit(main())
