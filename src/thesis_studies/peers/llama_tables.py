"""What a ``thesis-lib studies llama-bench`` document says: each engine's fastest setting (:func:`fastest`), ours
over llama.cpp's with its paired interval over the prompts, over all of them and per category (:func:`versus`),
which is faster (:func:`verdict`), and the forms it takes: chapter 2's glued values and tables (:func:`book_glued`,
:func:`book_rows`, :func:`category_rows`), the README's row (:func:`readme_row`) and the command's printout
(:func:`text`)."""

from __future__ import annotations

import pandas as pd

from thesis_lib.analysis.uncertainty import bootstrap, which_faster


def fastest(doc: dict, engine: str) -> str:
    """The setting of ``engine`` ("llama.cpp" or "ours") with the highest pooled decode speed in the document."""
    names = [n for n in doc["summary"] if n.startswith(engine)]
    return max(names, key=lambda n: doc["summary"][n]["decode_tokens_per_s"])


def versus(doc: dict, a: str, b: str) -> dict:
    """Setting ``a``'s pooled decode speed over ``b``'s with its paired bootstrap interval over the prompts, over all
    of them (``"all"``) and per prompt category where the document names them."""
    import numpy as np

    def ratio(rows):
        cells = [np.array([[len(r[a]["tokens"]) - 1, r[a]["decode_s"], len(r[b]["tokens"]) - 1, r[b]["decode_s"]]])
                 for r in rows]
        return bootstrap(cells, lambda v: (v[0] / v[1]) / (v[2] / v[3]))

    cats = doc.get("categories") or ["all"] * len(doc["rows"])
    return {"all": ratio(doc["rows"]), **{c: ratio([r for r, rc in zip(doc["rows"], cats) if rc == c])
                                          for c in sorted(set(cats) - {"all"})}}


def verdict(lo: float, hi: float) -> str:
    """Which engine decodes faster at its best, by the interval of ours over llama.cpp's; "not measured" without one."""
    if lo != lo or hi != hi:
        return "not measured"
    return which_faster(lo, hi, "this project at its best", "llama.cpp at its best")


def _best(doc: dict) -> tuple[str, str, dict]:
    ours, theirs = fastest(doc, "ours"), fastest(doc, "llama.cpp")
    return ours, theirs, versus(doc, ours, theirs)["all"]


def _interval(ci: dict) -> str:
    return f"{ci['value']:.2f}x [{ci['lo']:.2f}, {ci['hi']:.2f}]"


def _kind(doc: dict, between: str = ", ") -> str:
    return f"{doc['processor']} ({doc.get('cpu_capability')}){between}{doc['ours_precision']}"


def book_glued(docs: list[tuple[dict, str]]) -> dict:
    """Chapter 2's values from the first of ``LLAMA_FILES``' documents (``docs``: each with its label): both engines'
    fastest settings and ours over theirs with its interval, llama.cpp's tuned drafting over its plain decoding, the
    target-only steps and their bytes; and the kinds of machine all the documents were measured on."""
    if not docs:
        said = "ours theirs spec_setting ngram_type spec_equal".split()
        numbers = "ratio lo hi spec_over_plain ngram_over_plain step_ms_ours step_ms_theirs byte_ratio".split()
        return {"llama_source": "no llama.cpp document named (LLAMA_FILES)", "llama_kinds": "none", "llama_prompts": 0,
                **{f"llama_{k}": "not measured" for k in said}, **{f"llama_{k}": float("nan") for k in numbers}}
    doc, label = docs[0]
    s, best, b = doc["summary"], doc["tuning"]["best"], doc["bytes_per_step"]
    ours, theirs, ci = _best(doc)
    plain = s["llama.cpp target-only"]["decode_tokens_per_s"]
    return {"llama_source": label, "llama_kinds": "; ".join(_kind(d, " with ours in ") for d, _ in docs),
            "llama_prompts": doc["prompts"], "llama_ours": ours, "llama_theirs": theirs, "llama_ratio": ci["value"],
            "llama_lo": ci["lo"], "llama_hi": ci["hi"],
            "llama_spec_over_plain": s["llama.cpp speculative"]["decode_tokens_per_s"] / plain,
            "llama_spec_setting": "up to {draft_max} draft tokens, each above probability {draft_p_min}".format(
                **best["speculative"]),
            "llama_ngram_over_plain": s["llama.cpp n-gram"]["decode_tokens_per_s"] / plain,
            "llama_ngram_type": best["n-gram"]["type"],
            "llama_spec_equal": f"{s['llama.cpp speculative']['equal_to_llama_target_only']} of {doc['prompts']}",
            "llama_step_ms_ours": 1e3 / s["ours target-only"]["decode_tokens_per_s"], "llama_step_ms_theirs": 1e3 / plain,
            "llama_byte_ratio": b["ours target"] / b["llama.cpp target"]}


def book_rows(docs: list[tuple[dict, str]]) -> pd.DataFrame:
    """One row per document: the machine and our target's precision, every setting's decode tokens/s, and ours at
    best over llama.cpp at best with its interval over the prompts and which is faster."""
    if not docs:
        return pd.DataFrame({"llama.cpp document": ["none named (LLAMA_FILES)"]})
    return pd.DataFrame([{"machine, ours in": _kind(doc), "prompts": doc["prompts"],
                          **{name: v["decode_tokens_per_s"] for name, v in doc["summary"].items()},
                          "ours best / llama.cpp best": _interval(ci), "verdict": verdict(ci["lo"], ci["hi"])}
                         for doc, _ in docs for _, _, ci in [_best(doc)]])


def category_rows(docs: list[tuple[dict, str]]) -> pd.DataFrame:
    """Per document and prompt category (and over all prompts), a row: ours at best over llama.cpp at best, and
    llama.cpp's tuned speculative decoding over its plain decoding (where its drafting pays), each with its interval
    (a row per document and category, so that more documents add rows, not columns wider than a page)."""
    rows = []
    for doc, _ in docs:
        ours, theirs, _ = _best(doc)
        mine, its = versus(doc, ours, theirs), versus(doc, "llama.cpp speculative", "llama.cpp target-only")
        rows += [{"machine, ours in": _kind(doc), "category": c, "ours / llama.cpp": _interval(ci),
                  "its drafting / its plain": _interval(its[c])} for c, ci in mine.items()]
    return pd.DataFrame(rows or {"llama.cpp document": ["none named (LLAMA_FILES)"]})


def readme_row(doc: dict, path: str) -> str:
    """The README's row for a document (``path``, linked): decode tokens/s of each setting, ours at best over
    llama.cpp at best with its interval, and which is faster."""
    _, _, ci = _best(doc)
    speeds = " | ".join(f"{v['decode_tokens_per_s']:.1f}" for v in doc["summary"].values())
    return (f"| [{doc['processor']}, {doc.get('cpu_capability')}]({path}) | {doc['ours_precision']} | {speeds} | "
            f"{ci['value']:.2f}x ({ci['lo']:.2f}-{ci['hi']:.2f}): {verdict(ci['lo'], ci['hi'])} |")


def text(doc: dict) -> str:
    """The document as the command prints it: the setting, the bytes a step, llama.cpp's tuned settings, the table,
    the comparison per category and where llama.cpp's texts part from ours."""
    b = doc["bytes_per_step"]
    parts = [r["parts_from_ours_at"] for r in doc["rows"]]
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.precision", 2):
        return "\n".join([
            f"{doc['processor']}, {doc['threads']} threads; {doc['prompts']} prompts x {doc['max_new_tokens']} new "
            f"tokens, K = {doc['k']}; llama.cpp from {doc['llama_cpp_source']}; ours in {doc['ours_precision']}",
            "bytes per step (GB): " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in b.items()),
            "llama.cpp's best on the calibration prompts: " + "; ".join(
                f"{kind} {', '.join(f'{k}={v}' for k, v in s.items() if k != 'decode_tokens_per_s')}"
                for kind, s in doc["tuning"]["best"].items()),
            "decode tokens/s:", book_rows([(doc, "")]).T.to_string(header=False),
            category_rows([(doc, "")]).to_string(index=False),
            "llama.cpp's text parts from ours at token: " + "; ".join(f"{n}: {[p[n] for p in parts]}" for n in parts[0])])


#: chapter 2's verdict on the two engines, computed from its glued values
RULES = {"ch2_theory": {"llama_verdict": (verdict, dict(lo="llama_lo", hi="llama_hi"))}}
