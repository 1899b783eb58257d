"""The static book's explorer: the measured :func:`states` of the K sweep and explorer grid, switched in the page
without a kernel by one self-contained :func:`html` block (data, controls, plain JavaScript; nothing fetched)."""

from __future__ import annotations

import html as _html
import json

MODES = {"flash_deferred": "FlashHead, deferred", "dense_deferred": "dense, deferred"}


def _state(run, mode: str, k: int, probes: int | None) -> dict | None:
    """One state from the run's own summary (:mod:`thesis_lib.bench.metrics`): speed, speedup over the same run's
    baseline, acceptance, tokens per round, outputs equal to the baseline's, and the run with its date and revision."""
    m = (run.summary or {}).get(mode)
    if not m or "baseline" not in run.summary:
        return None
    env = run.environment or {}
    git = env.get("git") or {}
    return {"mode": mode, "k": k, "probes": probes, "tok_s": m["decode_tokens_per_s"],
            "speedup": m["speedup_vs_baseline"], "acceptance": m["acceptance"], "tokens_per_round": m["mean_emitted"],
            "equal": m["matches_baseline"], "prompts": m["samples"], "run": run.path.name,
            "measured": f"{str(env.get('recorded_at', '?'))[:10]}, revision {str(git.get('commit', '?'))[:7]}"
                        + (" (uncommitted changes)" if git.get("dirty") else "")}


def states(sweep: dict, grid: dict) -> list[dict]:
    """One state per (mode, K, probes) in ``sweep`` (:func:`~thesis_lib.book.shared.sweep_runs`) and ``grid``
    (:func:`~thesis_lib.book.shared.explorer_runs`), probes as each run recorded them; the sweep's run wins ties."""
    out, seen = [], set()
    for k, run in list(sweep.items()) + [(k, run) for (k, _), run in grid.items()]:
        n = ((run.environment or {}).get("flashhead") or {}).get("n_probes")
        for mode in MODES:
            key = (mode, k, n if mode == "flash_deferred" else None)
            if key in seen:
                continue
            s = _state(run, *key)
            if s:
                out.append(s)
                seen.add(key)
    return out


def all_lossless(states_: list[dict]) -> bool:
    """Whether every output of every state equalled target-only output."""
    return all(s["equal"] == s["prompts"] for s in states_)


_JS = """
(function () {
  var root = document.getElementById('%(id)s');
  var data = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  var k = root.querySelector('select[name=k]'), p = root.querySelector('select[name=probes]');
  var modes = root.querySelectorAll('input[name=%(id)s-mode]'), out = root.querySelector('.tc-static-state');
  function fmt(x, d) { return (x === null || x === undefined) ? 'n/a' : x.toFixed(d); }
  function show() {
    var mode = Array.prototype.filter.call(modes, function (m) { return m.checked; })[0].value;
    p.disabled = (mode !== 'flash_deferred');
    var want = {mode: mode, k: +k.value, probes: mode === 'flash_deferred' ? +p.value : null};
    var s = data.filter(function (d) { return d.mode === want.mode && d.k === want.k && d.probes === want.probes; })[0];
    out.setAttribute('data-k', want.k); out.setAttribute('data-probes', want.probes === null ? '' : want.probes);
    out.setAttribute('data-mode', mode);
    if (!s) { out.setAttribute('data-found', 'no');
      out.innerHTML = '<i>Not measured: no run of this combination in the book\\'s run folders.</i>'; return; }
    out.setAttribute('data-found', 'yes');
    out.innerHTML = '<b>measured</b>: ' + fmt(s.tok_s, 2) + ' tok/s decode, <b class="tc-speedup">' +
      fmt(s.speedup, 2) + 'x</b> the decode speed of target-only decoding in the same run (median over ' + s.prompts +
      ' prompts); acceptance ' + fmt(s.acceptance, 3) + ' (accepted / drafted), ' + fmt(s.tokens_per_round, 2) +
      ' tokens per round; outputs equal to target-only: ' + s.equal + '/' + s.prompts + '<br><small>run folder <code>' + s.run +
      '</code>, measured ' + s.measured + '</small>';
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
            f'<script type="application/json">{data}</script>'
            f'<script>{_JS % {"id": element_id}}</script></div>')
