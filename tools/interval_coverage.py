"""How often the book's paired bootstrap interval holds the true ratio, on this project's own runs (issue 80): a
committed profiled run's per-prompt samples of two modes become a population whose pooled ratio is made exactly 1
(one mode's decode seconds scaled), samples of N prompts are drawn from it with replacement, and each sample's 95 %
interval is computed as the book computes it, and as a plain percentile interval.

    python tools/interval_coverage.py --simulations 600          # 7 and 35 prompts, both settings' runs

It prints one line per (setting, pair of modes, N): the share of samples whose interval held 1, each way.
"""

from __future__ import annotations

import argparse

import numpy as np

from thesis_lib.analysis import headline, uncertainty
from thesis_lib.bench.metrics import decode_tokens

PAIRS = (("shared_ordinary", "dense_ordinary"), ("flash_ordinary", "baseline"))


def population(run, a: str, b: str) -> np.ndarray:
    """Per prompt: a's decode tokens and seconds, b's; a's seconds scaled so that the pooled ratio is 1."""
    by = {m: {r["question_id"]: r for r in run.of(m)} for m in (a, b)}
    x = np.array([[decode_tokens(by[a][q]), by[a][q]["decode_s"], decode_tokens(by[b][q]), by[b][q]["decode_s"]]
                  for q in by[a] if q in by[b]], float)
    x[:, 1] *= (x[:, 0].sum() / x[:, 1].sum()) / (x[:, 2].sum() / x[:, 3].sum())
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulations", type=int, default=600)
    ap.add_argument("--prompts", type=int, nargs="+", default=[7, 35])
    args = ap.parse_args()
    rng = np.random.default_rng(2)

    def ratio(v):
        return (v[0] / v[1]) / (v[2] / v[3])

    book = uncertainty.expanded_level
    for label, (folder, set_name) in {"default": (None, None), "regime": (headline.REGIME, headline.REGIME_SET)}.items():
        profiled = headline.committed(folder, set_name)[1]
        for a, b in PAIRS:
            pop = population(profiled, a, b)
            for n in args.prompts:
                held = {"expanded": 0, "percentile": 0}
                for sim in range(args.simulations):
                    cells = [row[None, :] for row in pop[rng.integers(0, len(pop), n)]]
                    for way in held:
                        uncertainty.expanded_level = book if way == "expanded" else (lambda level, n: level)
                        ci = uncertainty.bootstrap(cells, ratio, resamples=1000, seed=sim)
                        held[way] += ci["lo"] <= 1 <= ci["hi"]
                uncertainty.expanded_level = book
                print(f"{label} {a}/{b}, {n} of {len(pop)} prompts: expanded {held['expanded'] / args.simulations:.3f}, "
                      f"percentile {held['percentile'] / args.simulations:.3f} ({args.simulations} samples)", flush=True)


if __name__ == "__main__":
    main()
