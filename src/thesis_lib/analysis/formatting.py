"""How results are shown: GitHub Markdown for the terminal (``thesis-lib table``), a pandas Styler for the book
(fractions named *share* in %, missing values as an en dash), and the fixed-width reports of
``thesis-lib compare`` / ``bench`` / ``model-bench``."""

from __future__ import annotations

import pandas as pd

from .. import extensions


def to_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub-style Markdown table (no extra dependency); fractions named *share* shown in %."""
    cols = list(df.columns)
    def cell(col, v):
        if v is None or (isinstance(v, float) and v != v):
            return "–"
        if isinstance(v, float):
            return f"{100 * v:.1f}%" if "share" in str(col).lower() else f"{v:.{digits}f}"
        return str(v)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(cell(c, row[c]) for c in cols) + " |")
    return "\n".join(lines)


def styled(df: pd.DataFrame, digits: int = 3, caption: str | None = None):
    """A pandas Styler for the book: floats to ``digits`` places, columns named *share* in %, values whose
    ``Unit`` is *fraction* in % (Table 4.8), no index, missing values as an en dash, optional caption."""
    if {"Value", "Unit"} <= set(df.columns) and (df["Unit"] == "fraction").any():
        df = df.copy()
        frac = df["Unit"] == "fraction"
        for col in [c for c in df.columns if c == "Value" or str(c).endswith(("95 % low", "95 % high"))]:
            df[col] = ["–" if v is None or (isinstance(v, float) and v != v) else f"{100 * v:.1f}%" if f else
                       (f"{v:,.{digits}f}" if isinstance(v, float) else v) for v, f in zip(df[col], frac)]
        df.loc[frac, "Unit"] = "share"
    fmt = {}
    for c in df.columns:
        if pd.api.types.is_float_dtype(df[c]) or df[c].dtype == object:
            fmt[c] = (lambda v: "–" if v is None or v != v else f"{100 * v:.1f}%") if "share" in str(c).lower() else \
                     (lambda v: "–" if v is None or (isinstance(v, float) and v != v) else
                      (f"{v:,.{digits}f}" if isinstance(v, float) else str(v)))
    out = df.style.format(fmt, na_rep="–").hide(axis="index")
    return out.set_caption(caption) if caption else out


def model_bench_text(doc: dict) -> str:
    """``thesis-lib model-bench``'s report: Tables 4.1-4.4 and the quality curve as fixed-width text."""
    lines: list[str] = []
    out = lines.append
    fh = doc["flashhead"]
    out(f"\nFlashHead: C = {fh['n_clusters']}, b = {fh['cluster_size']}, n_probes = {fh['n_probes']}, "
          f"{fh['candidates']} candidates per step; {doc['hidden_states']['n']} real hidden states")
    for part, title in (("head", "Tables 4.1/4.2: single-step head latency"),
                        ("step", "Tables 4.3/4.4: complete single-step decode latency")):
        if part not in doc:
            continue
        out(f"\n{title}")
        out(f"{'mode':<14}{'mean ms':>9}{'P50 ms':>9}{'P95 ms':>9}{'tok/s':>9}{'speedup':>9}")
        for name, s in doc[part]["stats"].items():
            sp = doc[part]["speedups"].get(name, {}).get("speedup_mean")
            out(f"{name:<14}{s['mean_ms']:>9.3f}{s['p50_ms']:>9.3f}{s['p95_ms']:>9.3f}{s['tokens_per_s']:>9.1f}"
                  f"{_fmt(sp, '.3f') if name != doc[part]['base'] else '1.000':>9}")
        if part == "step":
            st = doc["step"]
            out(f"the dense head's share of the step: {100 * st['head_share_mean']:.1f} % (mean); a free head would "
                  f"give at most {st['head_only_ceiling_mean']:.3f}x (mean), {st['head_only_ceiling_p50']:.3f}x (P50)")
    for name, part in extensions.MODEL_BENCH_PARTS.items():
        if name in doc and part.text is not None:
            out(part.text(doc[name]))
    if "quality" in doc:
        out("\nquality over n_probes (agreement: the fast head's top-1 vs the dense head's)")
        curve = {r["n_probes"]: r for r in doc.get("head_curve", [])}
        out(f"{'n_probes':>9}{'cands':>8}{'agree %':>9}{'rec@1 %':>9}{'rec@5 %':>9}{'head ms':>9}{'x dense':>9}")
        for r in doc["quality"]:
            c = curve.get(r["n_probes"])
            out(f"{r['n_probes']:>9}{r['candidates']:>8}{100 * r['agreement']:>9.2f}{100 * r['recall_top1_fast']:>9.2f}"
                  f"{100 * r['recall_top5_fast']:>9.2f}{_fmt(c and c['flashhead']['p50_ms'], '.3f'):>9}"
                  f"{_fmt(c and c['speedup_p50'], '.2f'):>9}")
    out("")
    return "\n".join(lines)


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def summary_text(summary: dict, costs: dict, k: int, max_new_tokens: int) -> str:
    """``thesis-lib compare`` / ``bench``'s report: one line per mode of a run's summary, as fixed-width text."""
    lines: list[str] = []
    out = lines.append
    out(f"\nK = {k}, {max_new_tokens} new tokens, medians over prompts")
    out("component costs (median over prompts): " + ", ".join(f"{name} {v * 1000:.0f} ms" for name, v in costs.items()))
    head = f"{'mode':<16}{'decode tok/s':>13}{'x baseline':>11}{'e2e x base':>11}{'TTFT s':>8}{'accepted/drafted':>18}{'emitted/round':>15}{'pred/meas':>10}{'= baseline':>11}"
    out(head)
    out("-" * len(head))
    for mode, s in summary.items():
        out(f"{mode:<16}{_fmt(s['decode_tokens_per_s']):>13}{_fmt(s['speedup_vs_baseline'], '.3f'):>11}"
              f"{_fmt(s['e2e_speedup_vs_baseline'], '.3f'):>11}"
              f"{_fmt(s['ttft_s']):>8}{_fmt(s['acceptance'], '.3f'):>18}{_fmt(s['mean_emitted']):>15}"
              f"{_fmt(s.get('predicted_over_measured'), '.3f'):>10}{s['matches_baseline']:>8}/{s['samples']}")
    out("accepted/drafted: the thesis' acceptance rate; emitted/round: tau, counting the target's own token.")
    out("pred/meas: decode tok/s predicted from the component costs over the measured value.")
    out("e2e: all new tokens over TTFT + decode time (transformers' assisted loop emits its first draft block inside TTFT).\n")
    return "\n".join(lines)
