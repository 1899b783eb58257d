"""llama.cpp beside this project, as a peer: the same GGUF files the embedded pair is converted from, decoded by the
reference implementation of that format (PyPI ``llama-cpp-python``, the optional extra ``llama``; built from its
source distribution, since PyPI has no wheel of it).

What this module knows:

- :func:`check`: llama-cpp-python is installed (a clear error naming the extra otherwise), before any model loads.
- :func:`gguf_bytes_per_step`: the bytes of a GGUF file's tensors one decode step reads (every tensor but the token
  embedding, of which a step reads one row), from the file's own tensor table (``gguf``).
- :class:`GgufDraft`: a llama.cpp model as llama-cpp-python's draft model (its ``draft_model`` hook): it proposes
  ``k`` greedy tokens after the ids it is given, reusing its cache for their common prefix. llama-cpp-python then
  verifies the proposal in one batched forward of the target and keeps the tokens its own greedy choice agrees with.
- :func:`run`: per prompt, in alternating order, llama.cpp's greedy target-only decoding, llama.cpp's speculative
  decoding with the 0.5B draft, and this project's target-only and FlashHead deferred decoding on the pair as
  ``DTYPE`` loads it; seconds per generation (prefill included), tokens, and where llama.cpp's tokens part from ours.

llama.cpp computes with the quantised blocks as stored (Q4_K, Q5_0, Q6_K, Q8_0 with 8-bit activations), this
project with the de-quantised weights (rounded to bfloat16 or int8 again), so the two greedy texts are of slightly
different models and part somewhere; the document records where.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from thesis_lib.decoding.clocks import alternating
from thesis_lib.errors import ConfigError

INSTALL = ("pip install -e '.[llama]' (llama-cpp-python 0.3.36, compiled from its source distribution: "
           "CMake and a C++ compiler, several minutes on two cores)")


def check() -> None:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(f"llama.cpp's Python binding is not installed: {INSTALL}.")


def gguf_bytes_per_step(path) -> int:
    """Bytes of the tensors a one-token step reads: all of the file's tensors but ``token_embd.weight``."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name != "token_embd.weight")


def load(path, threads: int):
    """A llama.cpp model of ``path`` on ``threads`` threads (prompt and generation alike), quiet."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)


def _draft_class():
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GgufDraft(LlamaDraftModel):
        """``k`` greedy tokens of a llama.cpp model after the given ids (its cache reused for their common prefix)."""

        def __init__(self, llm, k: int):
            self.llm, self.k = llm, k

        def __call__(self, input_ids, /, **kwargs):
            out = []
            for tok in self.llm.generate([int(t) for t in input_ids], top_k=1, temp=0.0):
                out.append(int(tok))
                if len(out) == self.k:
                    break
            return np.array(out, dtype=np.intc)

    return GgufDraft


def greedy(llm, ids: Sequence[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], float]:
    """llama.cpp's greedy continuation of ``ids`` (top-1, no penalties), up to ``max_new_tokens`` or an EOS token,
    and the seconds it took (prefill included). The cache is emptied first: every generation starts cold."""
    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(list(ids), top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) >= max_new_tokens or tok in eos:
            break
    return out, time.perf_counter() - t0


def _parting(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(target_lm, draft_lm, prompts: list[list[int]], *, k: int = 4, max_new_tokens: int = 32,
        progress: bool = True) -> dict:
    """``target_lm``, ``draft_lm``: the embedded pair as :func:`thesis_lib.models.loading.load_pair` gives it (this
    project's side). Loads llama.cpp's two models from the same GGUF files and times the four settings per prompt,
    interleaved, after one warm-up each. Returns the document (rows per prompt, a summary per setting)."""
    import torch

    from thesis_lib.heads.for_model import flashhead_for
    from thesis_lib.models.embedded import assemble_gguf
    from thesis_lib.models.specs import resolve
    from thesis_lib.progress import tqdm
    from thesis_lib.bench.runner import Runner

    check()
    threads = torch.get_num_threads()
    files = {role: assemble_gguf(resolve(lm.spec).embedded, progress=progress)
             for role, lm in (("target", target_lm), ("draft", draft_lm))}
    llama_draft = load(files["draft"], threads)
    from llama_cpp import Llama

    llama_spec = Llama(model_path=str(files["target"]), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                       verbose=False, draft_model=_draft_class()(llama_draft, k))
    llama_target = load(files["target"], threads)
    ours = Runner(target_lm, draft_lm, k=k, max_new_tokens=max_new_tokens, flash_head=flashhead_for(draft_lm))
    eos = set(target_lm.eos_ids)
    settings = {
        "llama.cpp target-only": lambda ids: greedy(llama_target, ids, max_new_tokens, eos),
        "llama.cpp speculative": lambda ids: greedy(llama_spec, ids, max_new_tokens, eos),
        "ours target-only": lambda ids: _ours(ours, "baseline", ids),
        "ours FlashHead deferred": lambda ids: _ours(ours, "flash_deferred", ids),
    }
    for fn in settings.values():  # warm-up, not recorded
        fn(prompts[0][:16])
    rows = []
    with tqdm(total=len(prompts) * len(settings), desc="llama.cpp beside ours", disable=not progress,
              unit="run") as bar:
        for i, ids in enumerate(prompts):
            row = {"prompt": i, "prompt_tokens": len(ids)}
            for name in alternating(settings, i):
                tokens, secs = settings[name](ids)
                row[name] = {"seconds": secs, "tokens": tokens}
                bar.update()
            ref = row["ours target-only"]["tokens"]
            row["parts_from_ours_at"] = {n: _parting(row[n]["tokens"], ref) for n in settings if n.startswith("llama")}
            rows.append(row)
    summary = {}
    for name in settings:
        secs = sum(r[name]["seconds"] for r in rows)
        toks = sum(len(r[name]["tokens"]) for r in rows)
        summary[name] = {"tokens_per_s": toks / secs, "ms_per_token": 1e3 * secs / toks,
                         "median_ms_per_token": statistics.median(1e3 * r[name]["seconds"] / len(r[name]["tokens"])
                                                                  for r in rows)}
    summary["llama.cpp speculative"]["equal_to_llama_target_only"] = sum(
        r["llama.cpp speculative"]["tokens"] == r["llama.cpp target-only"]["tokens"] for r in rows)
    summary["ours FlashHead deferred"]["equal_to_ours_target_only"] = sum(
        r["ours FlashHead deferred"]["tokens"] == r["ours target-only"]["tokens"] for r in rows)
    from thesis_studies.precision.bench import step_bytes

    return {"k": k, "max_new_tokens": max_new_tokens, "threads": threads, "prompts": len(prompts), "rows": rows,
            "summary": summary,
            "bytes_per_step": {"llama.cpp target": gguf_bytes_per_step(files["target"]),
                               "llama.cpp draft": gguf_bytes_per_step(files["draft"]),
                               "ours target": step_bytes(target_lm.model), "ours draft": step_bytes(draft_lm.model)},
            "ours_precision": target_lm.info.get("dtype_requested"),
            "llama_cpp_version": _version()}


def _ours(runner, mode: str, ids) -> tuple[list[int], float]:
    g = runner.run(mode, list(ids))
    return list(g.tokens), g.stats.ttft_s + g.stats.decode_s


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("llama-cpp-python")


def text(doc: dict) -> str:
    """The document as the command prints it."""
    b = doc["bytes_per_step"]
    lines = [f"{doc['processor']}, {doc['threads']} threads; {doc['prompts']} prompts x {doc['max_new_tokens']} new "
             f"tokens, K = {doc['k']}; llama-cpp-python {doc['llama_cpp_version']}; ours in {doc['ours_precision']}",
             f"bytes per step: llama.cpp target {b['llama.cpp target'] / 1e9:.2f} GB, draft "
             f"{b['llama.cpp draft'] / 1e9:.2f} GB; ours target {b['ours target'] / 1e9:.2f} GB, draft "
             f"{b['ours draft'] / 1e9:.2f} GB"]
    for name, s in doc["summary"].items():
        extra = "".join(f", {v}/{doc['prompts']} {k.replace('_', ' ')}" for k, v in s.items() if k.startswith("equal"))
        lines.append(f"  {name:<26} {s['tokens_per_s']:6.2f} tokens/s ({s['ms_per_token']:.0f} ms/token pooled){extra}")
    parts = [r["parts_from_ours_at"] for r in doc["rows"]]
    lines.append("  llama.cpp's text parts from ours at token: " + "; ".join(
        f"{n}: {[p[n] for p in parts]}" for n in parts[0]))
    return "\n".join(lines)
