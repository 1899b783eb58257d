"""The static book's explorer: the measured :func:`states` of the K sweep and explorer grid, switched in the page
without a kernel by one self-contained :func:`html` block (data, controls, plain JavaScript; nothing fetched). Beside
the numbers, the script draws the chosen draft and probe count's measured speedup over K as an SVG figure, the chosen
K marked and target-only decoding's speed as a line at 1."""

from __future__ import annotations

import html as _html
import json

from ..analysis.uncertainty import ratio_interval

MODES = {"flash_deferred": "FlashHead, deferred", "dense_deferred": "dense, deferred"}


def _state(run, mode: str, k: int, probes: int | None) -> dict | None:
    """One state from the run's own summary (:mod:`thesis_lib.bench.metrics`): speed, speedup over the same run's
    baseline (the pooled ratio, as chapter 4 computes it, with its 95 % interval; the median of per-prompt ratios
    beside it), acceptance, tokens per round, outputs equal to the baseline's, and the run with its date and
    revision."""
    m = (run.summary or {}).get(mode)
    if not m or "baseline" not in run.summary:
        return None
    env = run.environment or {}
    git = env.get("git") or {}
    ci = ratio_interval(run, mode, "baseline")
    return {"mode": mode, "k": k, "probes": probes, "tok_s": m["decode_tokens_per_s"],
            "speedup": ci["ratio"], "median": m["speedup_vs_baseline"], "lo": ci["lo"], "hi": ci["hi"],
            "acceptance": m["acceptance"], "tokens_per_round": m["mean_emitted"],
            "equal": m["matches_baseline"], "prompts": m["samples"], "run": run.path.name,
            "measured": f"{str(env.get('recorded_at', '?'))[:10]}, revision {str(git.get('commit', '?'))[:7]}"
                        + (" (uncommitted changes)" if git.get("dirty") else "")}


def states(sweep: dict, grid: dict, main=None) -> list[dict]:
    """One state per (mode, K, probes) in ``main`` (chapter 4's run, at its K and probes: its numbers, over its
    prompts, are the ones the explorer shows there), ``sweep`` (:func:`~thesis_lib.book.shared.sweep_runs`) and
    ``grid`` (:func:`~thesis_lib.book.shared.explorer_runs`), probes as each run recorded them; earlier runs win ties.
    The main run's states come last, so the explorer opens on the sweep's first K."""
    out, seen = [], set()
    first = [(main.config["k"], main)] if main is not None else []
    for k, run in first + list(sweep.items()) + [(k, run) for (k, _), run in grid.items()]:
        n = ((run.environment or {}).get("flashhead") or {}).get("n_probes")
        for mode in MODES:
            key = (mode, k, n if mode == "flash_deferred" else None)
            if key in seen:
                continue
            s = _state(run, *key)
            if s:
                out.append(s)
                seen.add(key)
    mains = [s for s in out if main is not None and s["run"] == main.path.name]
    return [s for s in out if s not in mains] + mains


def all_lossless(states_: list[dict]) -> bool:
    """Whether every output of every state equalled target-only output."""
    return all(s["equal"] == s["prompts"] for s in states_)


_JS = """
(function () {
  var root = document.getElementById('%(id)s');
  var data = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  var k = root.querySelector('select[name=k]'), p = root.querySelector('select[name=probes]');
  var modes = root.querySelectorAll('input[name=%(id)s-mode]'), out = root.querySelector('.tc-static-state');
  var fig = root.querySelector('.tc-static-figure');
  function fmt(x, d) { return (x === null || x === undefined) ? 'n/a' : x.toFixed(d); }
  function show() {
    var mode = Array.prototype.filter.call(modes, function (m) { return m.checked; })[0].value;
    p.disabled = (mode !== 'flash_deferred');
    var want = {mode: mode, k: +k.value, probes: mode === 'flash_deferred' ? +p.value : null};
    var s = data.filter(function (d) { return d.mode === want.mode && d.k === want.k && d.probes === want.probes; })[0];
    out.setAttribute('data-k', want.k); out.setAttribute('data-probes', want.probes === null ? '' : want.probes);
    out.setAttribute('data-mode', mode);
    plot(want);
    if (!s) { out.setAttribute('data-found', 'no');
      out.innerHTML = '<i>Not measured: no run of this combination in the book\\'s run folders.</i>'; return; }
    out.setAttribute('data-found', 'yes');
    out.innerHTML = '<b>measured</b>: ' + fmt(s.tok_s, 2) + ' tok/s decode, <b class="tc-speedup">' +
      fmt(s.speedup, 2) + 'x</b> the decode speed of target-only decoding in the same run (pooled over ' + s.prompts +
      ' samples: <span class="tc-interval">' + fmt(s.speedup, 2) + 'x, 95 %% interval ' + fmt(s.lo, 2) + '-' +
      fmt(s.hi, 2) + 'x</span>; median of per-prompt ratios ' + fmt(s.median, 2) + 'x); acceptance ' + fmt(s.acceptance, 3) + ' (accepted / drafted), ' + fmt(s.tokens_per_round, 2) +
      ' tokens per round; outputs equal to target-only: ' + s.equal + '/' + s.prompts + '<br><small>run folder <code>' + s.run +
      '</code>, measured ' + s.measured + '</small>';
  }
  function plot(want) {
    var pts = data.filter(function (d) { return d.mode === want.mode && d.probes === want.probes; })
                  .sort(function (a, b) { return a.k - b.k; });
    var W = 520, H = 250, L = 52, R = 14, T = 14, B = 40, svg = [];
    var ks = pts.map(function (d) { return d.k; }), ys = pts.map(function (d) { return d.speedup; }).concat([1])
      .concat(pts.map(function (d) { return d.lo; })).concat(pts.map(function (d) { return d.hi; }));
    var k0 = Math.min.apply(null, ks.concat([want.k])), k1 = Math.max.apply(null, ks.concat([want.k]));
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys), pad = 0.1 * (y1 - y0 || 1);
    y0 -= pad; y1 += pad; k0 -= 0.4; k1 += 0.4;
    function x(v) { return L + (v - k0) / (k1 - k0) * (W - L - R); }
    function y(v) { return T + (y1 - v) / (y1 - y0) * (H - T - B); }
    svg.push('<line x1="' + L + '" y1="' + y(1) + '" x2="' + (W - R) + '" y2="' + y(1) +
             '" stroke="#888" stroke-dasharray="4 3"/><text x="' + (W - R) + '" y="' + (y(1) - 4) +
             '" font-size="11" text-anchor="end" fill="#666">target-only</text>');
    svg.push('<line x1="' + L + '" y1="' + (H - B) + '" x2="' + (W - R) + '" y2="' + (H - B) + '" stroke="#333"/>' +
             '<line x1="' + L + '" y1="' + T + '" x2="' + L + '" y2="' + (H - B) + '" stroke="#333"/>');
    ks.forEach(function (v) { svg.push('<text x="' + x(v) + '" y="' + (H - B + 15) + '" font-size="11" text-anchor="middle">' + v + '</text>'); });
    [y0 + pad, (y0 + y1) / 2, y1 - pad].forEach(function (v) {
      svg.push('<text x="' + (L - 6) + '" y="' + (y(v) + 4) + '" font-size="11" text-anchor="end">' + v.toFixed(2) + 'x</text>'); });
    svg.push('<text x="' + ((L + W - R) / 2) + '" y="' + (H - 6) + '" font-size="12" text-anchor="middle">K (draft tokens per round)</text>');
    svg.push('<text x="12" y="' + ((T + H - B) / 2) + '" font-size="12" text-anchor="middle" transform="rotate(-90 12 ' +
             ((T + H - B) / 2) + ')">speedup</text>');
    if (pts.length > 1) svg.push('<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="' +
      pts.map(function (d) { return x(d.k) + ',' + y(d.speedup); }).join(' ') + '"/>');
    pts.forEach(function (d) {  // the pooled ratio's 95 %% interval as a bar
      svg.push('<line class="tc-bar" x1="' + x(d.k) + '" x2="' + x(d.k) + '" y1="' + y(d.lo) + '" y2="' + y(d.hi) +
               '" stroke="#1f77b4" stroke-width="1.5"/>');
    });
    pts.forEach(function (d) {
      var on = d.k === want.k;
      svg.push('<circle class="' + (on ? 'tc-chosen' : 'tc-point') + '" data-k="' + d.k + '" cx="' + x(d.k) + '" cy="' +
               y(d.speedup) + '" r="' + (on ? 7 : 4) + '" fill="' + (on ? '#d62728' : '#1f77b4') + '"/>');
    });
    fig.setAttribute('data-points', pts.length);
    fig.innerHTML = '<svg xmlns="http://www.w3.org/2000/svg" width="' + W + '" height="' + H + '" role="img">' +
      svg.join('') + '</svg><div style="font-size:0.85em;color:#555">Measured speedup over K for ' +
      (want.mode === 'flash_deferred' ? 'the FlashHead draft at ' + want.probes + ' probes' : 'the dense draft') +
      ', deferred verification; points: the pooled ratio, bars: its 95 %% interval over the prompts; red: the chosen K' +
      (pts.some(function (d) { return d.k === want.k; }) ? '' : ' (not measured)') + '. Each point names its run above ' +
      'when chosen: at the K and probe count of the book itself it is the main run of chapter 4, elsewhere the sweep run.</div>';
  }
  k.addEventListener('change', show); p.addEventListener('change', show);
  Array.prototype.forEach.call(modes, function (m) { m.addEventListener('change', show); });
  show();
})();
"""


def html(states_: list[dict], *, element_id: str = "tc-static-explorer") -> str:
    """The controls, the data and the script, as one HTML block."""
    ks = sorted({s["k"] for s in states_})
    ps = sorted({s["probes"] for s in states_ if s["probes"] is not None})
    first = next((s for s in states_ if s["mode"] == "flash_deferred"), states_[0] if states_ else None)
    opt = lambda vals, sel: "".join(f'<option value="{v}"{" selected" if v == sel else ""}>{v}</option>' for v in vals)
    radios = "".join(
        f'<label style="margin-right:1em"><input type="radio" name="{element_id}-mode" value="{m}"'
        f'{" checked" if first and m == first["mode"] else ""}> {_html.escape(label)}</label>' for m, label in MODES.items())
    data = json.dumps(states_).replace("</", "<\\/")
    return (f'<div id="{element_id}" class="tc-static-explorer" style="border:1px solid #ccc;padding:8px;border-radius:4px">'
            f'<div style="margin-bottom:6px"><label>K <select name="k">{opt(ks, first and first["k"])}</select></label> '
            f'<label style="margin-left:1em">probes <select name="probes">{opt(ps, first and first["probes"])}</select></label> '
            f'<span style="margin-left:1em">{radios}</span></div>'
            f'<div class="tc-static-state" data-found="no"><i>This explorer needs JavaScript.</i></div>'
            f'<div class="tc-static-figure" style="margin-top:8px"></div>'
            f'<script type="application/json">{data}</script>'
            f'<script>{_JS % {"id": element_id}}</script></div>')
