"""Chapter 6's figures ("Beyond the thesis"): adaptive probes' trade-off, the co-design Pareto front, the block
policies' walk and the per-category bars; each returned as a ``Figure`` for :func:`thesis_lib.book.figures.save`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from thesis_lib.book.figures import COLORS

def margin_tradeoff(rows: list[dict], chosen: float | None = None):
    """Adaptive probing: agreement and acceptance against mean probes per token; the fixed setting as a star."""
    fig, ax = plt.subplots(figsize=(6.8, 3.4))
    fixed = [r for r in rows if r["margin"] is None]
    ada = sorted((r for r in rows if r["margin"] is not None), key=lambda r: r["mean_probes"])
    ax.plot([r["mean_probes"] for r in ada], [100 * r["agreement"] for r in ada], marker="o", color=COLORS["flash"],
            label="adaptive: agreement with dense head")
    ax.plot([r["mean_probes"] for r in ada], [100 * r["alpha"] for r in ada], marker="s", color=COLORS["target"],
            label="adaptive: per-token acceptance")
    for r in ada:
        ax.annotate(f"{r['margin']:g}", (r["mean_probes"], 100 * r["agreement"]), fontsize=7,
                    textcoords="offset points", xytext=(3, 3))
    for r in fixed:
        ax.scatter([r["mean_probes"]], [100 * r["agreement"]], marker="*", s=140, color=COLORS["accent"], zorder=5,
                   label="fixed probes (default)")
        ax.scatter([r["mean_probes"]], [100 * r["alpha"]], marker="*", s=140, color=COLORS["accent"], zorder=5)
    if chosen is not None:
        pick = [r for r in ada if r["margin"] == chosen]
        if pick:
            ax.axvline(pick[0]["mean_probes"], color="grey", ls=":", lw=1)
    _log_x(ax)
    ax.set_xlabel("mean probed clusters per token (log)"), ax.set_ylabel("%")
    ax.legend(fontsize=8, loc="center right")
    return fig


def _log_x(ax) -> None:
    """A log x axis labelled at its decades only (minor labels collide)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def pareto(rows: list[dict], front: list[dict], freq: list[dict] | None = None, dense: dict | None = None,
           default: dict | None = None, chosen: dict | None = None):
    """Co-design: head latency against modelled decode tok/s per (clusters, probes), the Pareto front, other heads."""
    import matplotlib as mpl

    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    sizes = sorted({r["clusters"] for r in rows})
    cmap = mpl.colormaps["viridis"]
    for i, c in enumerate(sizes):
        pts = [r for r in rows if r["clusters"] == c]
        ax.scatter([r["head_ms"] for r in pts], [r["tokens_per_s"] for r in pts], color=cmap(i / max(1, len(sizes) - 1)),
                   s=28, label=f"FlashHead C = {c} (b = {pts[0]['cluster_size']})")
    ax.plot([r["head_ms"] for r in front], [r["tokens_per_s"] for r in front], color="black", lw=1, ls="--",
            label="Pareto front")
    if freq:
        ax.scatter([r["head_ms"] for r in freq], [r["tokens_per_s"] for r in freq], marker="x", color=COLORS["accent"],
                   label="frequency-truncated head")
    if dense:
        ax.scatter([dense["head_ms"]], [dense["tokens_per_s"]], marker="D", color=COLORS["draft"], label="dense head")
    for r, mark, name in ((default, "*", "default"), (chosen, "P", "chosen")):
        if r:
            ax.scatter([r["head_ms"]], [r["tokens_per_s"]], marker=mark, s=160, facecolor="none",
                       edgecolor="black", zorder=6, label=f"{name}: C = {r['clusters']}, p = {r['probes']}")
    _log_x(ax)
    ax.set_xlabel("draft head latency per token (ms, log)"), ax.set_ylabel("predicted decode tok/s (best K)")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def policy_curve(sim: dict):
    """Block-length policies: modelled speedup over the confidence threshold and over fixed K, with oracle bounds."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.0, 3.4), sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    for lookup, color, name in ((False, COLORS["flash"], "confidence stop"), (True, COLORS["target"], "+ free lookup")):
        pts = [r for r in sim["thresholds"] if r["lookup"] == lookup]
        ax.plot([r["stop_below"] for r in pts], [r["speedup"] for r in pts], marker="o", color=color, label=name)
    fixed = sim["fixed"]
    bx.plot([r["k"] for r in fixed], [r["speedup"] for r in fixed], marker="s", color=COLORS["draft"], label="fixed K")
    for a in (ax, bx):
        for key, ls, name in (("oracle", "--", "clairvoyant K"), ("oracle_lookup", ":", "clairvoyant K + lookup")):
            a.axhline(sim["oracles"][key]["speedup"], color="black", ls=ls, lw=1, label=name if a is ax else None)
        a.axhline(sim["best_fixed"]["speedup"], color=COLORS["draft"], lw=0.8, ls="-.",
                  label="best fixed K" if a is ax else None)
        a.axhline(1, color="grey", lw=0.8)
    ax.axvline(sim["tuned_stop_below"], color="grey", ls=":", lw=1)
    ax.set_xlabel("stop below draft probability tau"), ax.set_ylabel("modelled decode speedup")
    bx.set_xlabel("fixed block length K")
    from matplotlib.ticker import MaxNLocator

    bx.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, loc="lower center")
    return fig


def category_bars(table, value_name: str = "decode speedup over target-only"):
    """Grouped bars: one group per prompt category, one bar per setting (rows of ``table``)."""
    cats = [c for c in table.columns if c != "Setting"]
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    n = len(table)
    width = 0.8 / max(1, n)
    x = np.arange(len(cats))
    for i, (_, row) in enumerate(table.iterrows()):
        ax.bar(x + i * width - 0.4 + width / 2, [row[c] for c in cats], width, label=row["Setting"])
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x, cats, rotation=20, fontsize=8)
    ax.set_ylabel(value_name)
    ax.legend(fontsize=7, ncol=2)
    return fig


def tree_accepted(doc: dict, draft: str = "flash"):
    """Chapter 8: tokens per target forward against the tree's nodes: the model's grown trees (line), the shapes run on
    the measured prompts (dots; beams and the chain marked), and the model's best tree."""
    search = doc["calibration"]["drafts"][draft]["search"]
    fig, ax = plt.subplots(figsize=(6.8, 3.4))
    grown = search["grown"]
    ax.plot([r["nodes"] for r in grown], [r["expected_emitted"] for r in grown], color=COLORS["flash"], lw=1.2,
            label="grown trees, model")
    ran = [r for r in doc["shapes"] if r["draft"] == draft]
    for kind, pick, marker in (("grown, measured", lambda r: r["label"].startswith("n"), "o"),
                               ("beams, measured", lambda r: "w" in r["label"], "s"),
                               ("chain, measured", lambda r: r["label"].startswith("k") and "w" not in r["label"], "D")):
        rows = [r for r in ran if pick(r)]
        if rows:
            ax.scatter([r["nodes"] for r in rows], [r["emitted_per_round"] for r in rows], marker=marker, s=36,
                       color=COLORS["target"] if marker == "o" else COLORS["accent"], zorder=4, label=kind)
            for r in rows:
                ax.annotate(r["label"], (r["nodes"], r["emitted_per_round"]), fontsize=7, textcoords="offset points",
                            xytext=(3, -9))
    best = search["best"]["grown"]
    ax.axvline(best["nodes"], color="grey", ls=":", lw=1)
    ax.set_xlabel("nodes verified per round"), ax.set_ylabel("tokens per target forward")
    ax.legend(fontsize=8, loc="lower right")
    return fig
