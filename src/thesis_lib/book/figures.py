"""The book's figures (matplotlib and seaborn), each returned as a ``Figure`` for :func:`save`, and the marking of
accepted draft tokens in a generation (:func:`token_origins`, :func:`tokens_html`)."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..analysis import theory

COLORS = {"target": "#4C72B0", "draft": "#DD8452", "flash": "#55A868", "neutral": "#8C8C8C", "accent": "#C44E52"}
PHASE_COLORS = {"prefill": "#B0B0B0", "draft_propose": COLORS["draft"], "target_verify": COLORS["target"],
                "finalize_align": "#8172B3", "other": "#DDDDDD"}
MODE_COLORS = {"baseline": COLORS["neutral"], "dense": COLORS["draft"], "flash": COLORS["flash"],
               "shared": "#937860", "hf": "#DA8BC3"}


def style() -> None:
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 130, "savefig.bbox": "tight"})


def save(fig, fig_dir: str | Path, name: str) -> Path:
    """Write ``<fig_dir>/<name>.png`` (the book's ``{figure}`` directives point there)."""
    path = Path(fig_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def mode_color(mode: str) -> str:
    return MODE_COLORS.get(mode.split("_")[0], COLORS["neutral"])


# --- diagrams ---------------------------------------------------------------------------------------------

def _box(ax, x, y, w, h, text, color, fontsize=9, alpha=0.9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="black",
                                lw=0.8, alpha=alpha))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color="black", wrap=True)


def _arrow(ax, a, b, text=None, rad=0.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, lw=1.0, color="black",
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, text, ha="center", fontsize=8)


def _canvas(w=10, h=3.2, xlim=(0, 10), ylim=(0, 3.2)):
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(*xlim), ax.set_ylim(*ylim), ax.axis("off")
    return fig, ax


def diagram_autoregressive(model: str, vocab: int, hidden: int, layers: int):
    """Figure 2.1: one model step per token; the KV cache spares the prefix, not the sequential steps."""
    fig, ax = _canvas()
    _box(ax, 0.1, 1.2, 1.4, 0.8, "prompt\n(prefill,\nall tokens)", "#EEEEEE")
    _box(ax, 2.0, 1.2, 2.0, 0.8, f"{layers} decoder layers\n(last token only)", COLORS["target"], alpha=0.5)
    _box(ax, 4.5, 1.2, 1.8, 0.8, f"LM head\n{vocab:,} x {hidden:,}", COLORS["accent"], alpha=0.45)
    _box(ax, 6.8, 1.2, 1.3, 0.8, "argmax\n(greedy)", "#EEEEEE")
    _box(ax, 8.5, 1.2, 1.3, 0.8, "next\ntoken", "#FFFFFF")
    _box(ax, 2.0, 2.4, 2.0, 0.55, "KV cache (grows by 1)", "#F3E3B3")
    for a, b in (((1.5, 1.6), (2.0, 1.6)), ((4.0, 1.6), (4.5, 1.6)), ((6.3, 1.6), (6.8, 1.6)), ((8.1, 1.6), (8.5, 1.6))):
        _arrow(ax, a, b)
    _arrow(ax, (3.0, 2.0), (3.0, 2.4))
    _arrow(ax, (9.15, 1.2), (3.0, 1.2), "appended: one sequential step per generated token", rad=-0.35)
    ax.set_title(f"Autoregressive decoding ({model})", fontsize=10)
    return fig


def diagram_speculative(k: int = 4):
    """Figure 2.2: the draft proposes K tokens one by one; the target checks them in one forward."""
    fig, ax = _canvas(h=3.4, ylim=(0, 3.4))
    ax.text(0.1, 2.75, "draft", fontsize=10, color=COLORS["draft"], weight="bold")
    ax.text(0.1, 0.85, "target", fontsize=10, color=COLORS["target"], weight="bold")
    x = 1.1
    for i in range(k):
        _box(ax, x + 1.05 * i, 2.5, 0.9, 0.6, f"step {i + 1}\n→ d{i + 1}", COLORS["draft"], alpha=0.55)
        if i:
            _arrow(ax, (x + 1.05 * i - 0.15, 2.8), (x + 1.05 * i, 2.8))
    vx = x + 1.05 * k + 0.4
    _box(ax, vx, 0.55, 2.2, 0.7, f"one verify forward over\nlast token + d1..d{k}", COLORS["target"], alpha=0.55)
    _arrow(ax, (x + 1.05 * k - 0.15, 2.6), (vx + 0.6, 1.25))
    ox = vx + 2.7
    marks = ["✓", "✓", "✗"] + ["·"] * max(0, k - 3)
    for i, m in enumerate(marks[:k]):
        c = COLORS["flash"] if m == "✓" else (COLORS["accent"] if m == "✗" else "#EEEEEE")
        _box(ax, ox + 0.45 * i, 0.65, 0.4, 0.5, m, c, alpha=0.6)
    _arrow(ax, (vx + 2.2, 0.9), (ox, 0.9))
    ax.text(ox, 1.45, "accept the longest agreeing prefix,\nthen the target's own token", fontsize=8)
    ax.text(ox, 0.15, "emitted this round: 2 drafts + 1 target token", fontsize=8)
    ax.set_title(f"Speculative decoding with block length K = {k}", fontsize=10)
    return fig


def diagram_flashhead(vocab: int, n_clusters: int, n_probes: int):
    """Figure 2.3: dense scoring of all V rows vs FlashHead's centroid ranking and candidate scoring."""
    fig, ax = _canvas(h=3.6, ylim=(0, 3.6))
    size = vocab // n_clusters
    ax.text(0.1, 3.2, "dense head", fontsize=10, weight="bold")
    _box(ax, 0.1, 2.3, 1.2, 0.6, "hidden h", "#EEEEEE")
    _box(ax, 1.8, 2.3, 3.0, 0.6, f"score all V = {vocab:,} rows", COLORS["accent"], alpha=0.45)
    _box(ax, 5.3, 2.3, 1.3, 0.6, "argmax", "#EEEEEE")
    _arrow(ax, (1.3, 2.6), (1.8, 2.6)), _arrow(ax, (4.8, 2.6), (5.3, 2.6))
    ax.text(0.1, 1.55, "FlashHead", fontsize=10, weight="bold", color=COLORS["flash"])
    _box(ax, 0.1, 0.5, 1.2, 0.6, "hidden h", "#EEEEEE")
    _box(ax, 1.8, 0.5, 2.0, 0.6, f"rank C = {n_clusters:,}\ncentroids", COLORS["flash"], alpha=0.45)
    _box(ax, 4.2, 0.5, 2.3, 0.6, f"gather top p = {n_probes}\nclusters' ~{n_probes * size:,} tokens", COLORS["flash"], alpha=0.3)
    _box(ax, 6.9, 0.5, 1.6, 0.6, "score\ncandidates", COLORS["flash"], alpha=0.45)
    _box(ax, 8.8, 0.5, 1.1, 0.6, "argmax", "#EEEEEE")
    for a, b in (((1.3, 0.8), (1.8, 0.8)), ((3.8, 0.8), (4.2, 0.8)), ((6.5, 0.8), (6.9, 0.8)), ((8.5, 0.8), (8.8, 0.8))):
        _arrow(ax, a, b)
    rho = theory.work_ratio(n_clusters, n_probes, vocab)
    ax.text(5.0, 1.5, f"rows scored: C + p·V/C = {n_clusters + n_probes * size:,}  (rho = {rho:.3f} of dense)", fontsize=8.5)
    ax.set_title("Dense unembedding vs FlashHead's two-stage retrieval", fontsize=10)
    return fig


# --- theory curves ----------------------------------------------------------------------------------------

def work_ratio_curve(vocab: int, probes=(64, 256, 593, 2048), marks: dict | None = None):
    """rho over the cluster count C for several probe counts (log axes), with the optimum sqrt(pV)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    cs = np.logspace(2, np.log10(vocab / 2), 200)
    for p in probes:
        line, = ax.plot(cs, theory.work_ratio(cs, p, vocab), label=f"p = {p}")
        c_star = theory.best_clusters(p, vocab)
        ax.plot([c_star], [theory.work_ratio(c_star, p, vocab)], "o", color=line.get_color(), ms=4)
    for label, (c, p) in (marks or {}).items():
        ax.plot([c], [theory.work_ratio(c, p, vocab)], "k*", ms=9)
        ax.annotate(label, (c, theory.work_ratio(c, p, vocab)), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("clusters C"), ax.set_ylabel("rho = C/V + p/C (fraction of dense rows)")
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=8)
    return fig


def speedup_model_curves(c: float, verify: float, alphas=(0.4, 0.6, 0.7, 0.8, 0.9), k_max: int = 10, measured=None):
    """Model speedup over K for several acceptances, ordinary (append = 1) and deferred (append = 0)."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6), sharey=True)
    ks = np.arange(1, k_max + 1)
    for ax, (title, append) in zip(axes, (("ordinary (verify + append)", 1.0), ("deferred (verify only)", 0.0))):
        for a in alphas:
            ax.plot(ks, [theory.speedup(a, int(k), c, verify, append) for k in ks], marker=".", label=f"alpha = {a}")
        ax.axhline(1, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10), ax.set_xlabel("block length K")
        if measured:
            for label, (k, s) in measured.items():
                if label.startswith(title.split()[0]):
                    ax.plot([k], [s], "k*", ms=10)
                    ax.annotate(label.split(":", 1)[-1], (k, s), textcoords="offset points", xytext=(5, -12), fontsize=8)
    axes[0].set_ylabel("decode speedup over target-only (model)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"c = {c:.3f} (draft/target step), verify = {verify:.2f} target steps", fontsize=9)
    return fig


def regime_curve(points, thesis: tuple[float, float]):
    """The curve the thesis implies, measured: FlashHead deferred's speedup over target-only decoding against the
    FlashHead draft step in target steps, one point per target precision (:func:`thesis_lib.analysis.headline.
    regime_points`; both 95 % intervals, and each point's absolute decode rates), each point's own cost-model
    prediction (hollow), the cost model at the points' mean acceptance over the range of their measured
    verified-block costs (band) and with a block that costs one step (dashed), and the thesis' point
    ``(c, speedup)``."""
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    alpha, k = points["alpha"].mean(), int(points["k"].iloc[0])
    lo_v, hi_v = points["verify"].min(), points["verify"].max()
    cs = np.linspace(0.02, max(0.35, points["c_hi"].max() * 1.1), 120)
    ax.fill_between(cs, [theory.speedup(alpha, k, c, hi_v) for c in cs], [theory.speedup(alpha, k, c, lo_v) for c in cs],
                    color=COLORS["neutral"], alpha=0.25,
                    label=f"cost model, acceptance {alpha:.2f}, blocks of {k + 1} at {lo_v:.2f}-{hi_v:.2f} steps")
    ax.plot(cs, [theory.speedup(alpha, k, c, 1.0) for c in cs], color=COLORS["neutral"], ls="--", lw=1.0,
            label="cost model, a block that costs one step")
    ax.errorbar(points["c"], points["speedup"], yerr=[points["speedup"] - points["lo"], points["hi"] - points["speedup"]],
                xerr=[points["c"] - points["c_lo"], points["c_hi"] - points["c"]], fmt="o", color=COLORS["flash"],
                capsize=3, label="measured (95 % intervals)")
    ax.plot(points["c"], points["model"], "o", mfc="none", color=COLORS["flash"], label="the model at each run's costs")
    for _, r in points.iterrows():
        ax.annotate(f"{r['precision']}\n{r['base_tok_s']:.1f} -> {r['flash_tok_s']:.1f} tok/s", (r["c"], r["speedup"]),
                    textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.plot([thesis[0]], [thesis[1]], "*", color=COLORS["accent"], ms=13, label="the thesis (two GPUs)")
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("FlashHead draft step / target step (c)")
    ax.set_ylabel("FlashHead deferred over target-only")
    ax.legend(fontsize=7.5, loc="lower left")
    return fig


def placeholder(text: str):
    """A figure that says what is missing (a page whose figure needs a document the parameter set does not name)."""
    fig, ax = plt.subplots(figsize=(7.2, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, wrap=True)
    return fig


def verify_cost_curves(table):
    """The verify-cost curve: a block of n tokens over one step, one line per precision (and the GPU's)."""
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    x = table["block of n tokens"]
    for col in table.columns[1:]:
        style_ = dict(ls="--", color="grey") if col.startswith("GPU") else dict(ls=":" if col.startswith("draft") else "-")
        ax.plot(x, table[col], marker=".", label=col, **style_)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xlabel("tokens in one forward (block of n)"), ax.set_ylabel("cost over one step")
    ax.legend(fontsize=8)
    return fig


# --- methods ----------------------------------------------------------------------------------------------

def timeline(traces: dict[str, tuple[list, int]], max_rounds: int | None = None):
    """Figure 3.1: the phases of real generations in ms from the first proposal; ``traces``: label -> events of a
    :class:`~thesis_lib.decoding.clocks.PhaseClock` with ``trace=True``."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 1.5 * len(traces) + 0.6), sharex=True, squeeze=False)
    lanes = {"draft_propose": 1, "target_verify": 0, "finalize_align": 0}
    for ax, (name, events) in zip(axes[:, 0], traces.items()):
        evs = [e for e in events if e[0] in lanes]
        if not evs:
            continue
        t0 = evs[0][1]
        n_prop = 0
        for ph, a, b in evs:
            if ph == "draft_propose":
                n_prop += 1
                if max_rounds and n_prop > max_rounds:
                    break
            ax.broken_barh([(1000 * (a - t0), 1000 * (b - a))], (lanes[ph] - 0.4, 0.8), color=PHASE_COLORS[ph],
                           edgecolor="black", lw=0.3)
        ax.set_yticks([0, 1], ["target", "draft"])
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms since the first proposal")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[p]) for p in ("draft_propose", "target_verify", "finalize_align")]
    fig.legend(handles, ["draft propose", "target verify", "finalize / append + align"], loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    return fig


def cluster_sizes(assignments, n_clusters: int):
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    sizes = np.bincount(np.asarray(assignments), minlength=n_clusters)
    ax.hist(sizes, bins=np.arange(sizes.min(), sizes.max() + 2) - 0.5, color=COLORS["flash"])
    ax.set_xlabel("tokens per cluster"), ax.set_ylabel("clusters")
    ax.set_title(f"{n_clusters:,} clusters: sizes {sizes.min()}-{sizes.max()} (equal-size k-means)", fontsize=10)
    return fig


def agreement_curve(quality: list[dict], n_clusters: int, default_probes: int | None = None):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ps = [q["n_probes"] for q in quality]
    ax.plot(ps, [100 * q["agreement"] for q in quality], marker="o", label="top-1 agreement with the dense head")
    if "recall_top5" in quality[0]:
        ax.plot(ps, [100 * q["recall_top5"] for q in quality], marker=".", ls="--", label="dense top-5 among candidates")
    if default_probes:
        ax.axvline(default_probes, color="grey", ls=":", lw=1)
        ax.annotate(f"p = C/16 = {default_probes}", (default_probes, 50), fontsize=8, rotation=90)
    ax.set_xscale("log"), ax.set_xlabel("probes p"), ax.set_ylabel("%")
    ax.set_ylim(0, 101), ax.legend(fontsize=8)
    ax.set_title(f"FlashHead quality over probes (C = {n_clusters:,})", fontsize=10)
    return fig


def token_origins(stats) -> list[str]:
    """Per emitted token, from a generation's per-round counts: "draft" (an accepted proposal) or "target"."""
    out = ["target"] * stats.first_emit
    for acc, em in zip(stats.accepted, stats.emitted):
        out += ["draft"] * acc + ["target"] * (em - acc)
    out += ["target"] * stats.tail_tokens
    return out[: stats.new_tokens] + ["target"] * max(0, stats.new_tokens - len(out))


def tokens_html(tokenizer, tokens: list[int], origins: list[str]) -> str:
    """The generated text with accepted draft tokens highlighted (inline styles, no external CSS)."""
    spans = []
    for t, o in zip(tokens, origins):
        text = html.escape(tokenizer.decode([t])).replace("\n", "↵<br>")
        style = "background:#cfe9d4" if o == "draft" else "background:#fbe3cf"
        spans.append(f'<span style="{style};border-radius:2px" title="{o}">{text}</span>')
    legend = ('<div style="font-size:85%;margin-top:4px"><span style="background:#cfe9d4">accepted draft token</span> '
              '<span style="background:#fbe3cf">target token (first, correction or bonus)</span></div>')
    return '<div style="font-family:monospace;white-space:normal;line-height:1.6">' + "".join(spans) + "</div>" + legend


# --- results ----------------------------------------------------------------------------------------------

def latency_distribution(run, modes, labels):
    """Per-sample decode time per token (ms) by mode: the spread behind the pooled tok/s."""
    import pandas as pd
    import seaborn as sns

    rows = [{"mode": labels.get(m, m), "ms per decode token": 1000 * r["tpot_s"], "key": m}
            for m in modes for r in run.of(m) if r.get("tpot_s")]
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(modes) + 1.4))
    sns.boxplot(data=df, y="mode", x="ms per decode token", hue="mode", palette={labels.get(m, m): mode_color(m) for m in modes},
                ax=ax, legend=False, fliersize=0)
    sns.stripplot(data=df, y="mode", x="ms per decode token", color="black", size=3, alpha=0.6, ax=ax)
    ax.set_ylabel("")
    return fig


def phase_shares(shares: dict[str, dict]):
    """Stacked bars: each mode's decode time split into propose / verify / finalize / the rest, with the 95 %
    interval of each boundary as an error bar where the shares carry ``edges``."""
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(shares) + 1.2))
    names = list(shares)
    left = np.zeros(len(names))
    for ph, label in (("draft_propose", "draft propose"), ("target_verify", "target verify"),
                      ("finalize_align", "finalize / align"), ("other", "other")):
        vals = np.array([shares[n].get(ph, 0.0) for n in names])
        ax.barh(names, 100 * vals, left=100 * left, color=PHASE_COLORS[ph], label=label, edgecolor="white")
        for i, v in enumerate(vals):
            if v > 0.06:
                ax.text(100 * (left[i] + v / 2), i, f"{100 * v:.0f}%", ha="center", va="center", fontsize=8)
        left += vals
        for i, n in enumerate(names):
            lo, hi = shares[n].get("edges", {}).get(ph, (np.nan, np.nan))
            if lo == lo and hi == hi:
                ax.errorbar(100 * left[i], i, xerr=[[100 * max(0.0, left[i] - lo)], [100 * max(0.0, hi - left[i])]],
                            fmt="none", ecolor="0.15", elinewidth=1, capsize=3)
    ax.set_xlim(0, 100), ax.set_xlabel("% of decode time"), ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return fig


def accepted_histogram(table, k: int):
    """Rounds per accepted length 0..K, one bar group per speculative mode (fractions of rounds)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    cols = [c for c in table.columns if c != "Mode"]
    width = 0.8 / max(1, len(table))
    for i, (_, row) in enumerate(table.iterrows()):
        total = sum(row[c] for c in cols) or 1
        ax.bar(np.arange(len(cols)) + i * width, [row[c] / total for c in cols], width, label=row["Mode"])
    ax.set_xticks(np.arange(len(cols)) + width * (len(table) - 1) / 2, cols)
    ax.set_xlabel(f"accepted draft tokens in a round (K = {k})"), ax.set_ylabel("fraction of rounds")
    ax.legend(fontsize=8)
    return fig


def speedup_over_k(points: dict[str, dict[int, float]], model: dict[str, dict[int, float]] | None = None,
                   bounds: dict[str, dict[int, tuple[float, float]]] | None = None):
    """Measured decode speedup over target-only decoding against K (solid, with 95 % intervals as error bars
    where ``bounds`` has them), with the model's (dotted)."""
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    for label, pts in points.items():
        ks = sorted(pts)
        line, = ax.plot(ks, [pts[k] for k in ks], marker="o", label=f"{label} (measured, 95 % interval)"
                        if bounds else f"{label} (measured)")
        if bounds and label in bounds:
            lo = [pts[k] - bounds[label][k][0] for k in ks]
            hi = [bounds[label][k][1] - pts[k] for k in ks]
            ax.errorbar(ks, [pts[k] for k in ks], yerr=[lo, hi], fmt="none", ecolor=line.get_color(), capsize=3)
        if model and label in model:
            mk = sorted(model[label])
            ax.plot(mk, [model[label][k] for k in mk], ls=":", color=line.get_color(), label=f"{label} (model)")
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("block length K"), ax.set_ylabel("decode speedup over target-only")
    ax.legend(fontsize=8)
    return fig
