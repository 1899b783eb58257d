"""llama.cpp beside this project, as a peer: the same GGUF files the embedded pair is converted from, decoded by
llama.cpp's own server (``llama-server``), built once from the llama.cpp sources that PyPI's llama-cpp-python source
distribution vendors (no registry has a llama.cpp binary), with the CPU flags of the machine it runs on.

What this module knows:

- :func:`check`: a built server, or the tools to build one (CMake, a C++ compiler), before any model loads.
- :func:`build`: the server, built into the cache on first use (its progress on the terminal).
- :func:`server`: a running server on one model, with a draft model or an n-gram method (``spec``), for one request
  at a time; :func:`complete` one greedy request to it: its tokens, its prefill and decode seconds from llama.cpp's
  own timings (the first token comes with the prefill, so decode speed is the tokens after it over the seconds after
  it, as this project counts) and its drafted and accepted tokens.
- :func:`gguf_bytes_per_step`: the bytes of a GGUF file's tensors one decode step reads (every tensor but the token
  embedding, of which a step reads one row), from the file's own tensor table (``gguf``).
- :func:`tune`: llama.cpp's speculative settings (``--spec-draft-n-max``, ``--spec-draft-p-min``; its n-gram
  methods) swept on calibration prompts, the fastest kept.
- :func:`run`: per prompt, in alternating order, llama.cpp's plain (target-only) decoding, its tuned speculative and n-gram
  decoding, and this project's target-only and FlashHead deferred decoding on the pair as ``DTYPE`` loads it.

llama.cpp computes with the quantised blocks as stored (Q4_K, Q5_0, Q6_K, Q8_0 with 8-bit activations), this
project with the de-quantised weights (rounded to bfloat16 or int8 again), so the two greedy texts are of slightly
different models and part somewhere; the document records where, and whether llama.cpp's speculative text equals
its own plain text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from thesis_lib.decoding.clocks import alternating
from thesis_lib.errors import ConfigError
from thesis_lib.models.cache import build_lock, cache_dir
from thesis_lib.progress import heartbeat

#: The llama-cpp-python source distribution whose vendored llama.cpp is built.
SOURCE = "llama-cpp-python==0.3.36"
#: The n-gram (draft-free) methods of llama.cpp's speculative decoding measured beside its draft model.
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
#: The draft-model settings swept on the calibration prompts: (``--spec-draft-n-max``, ``--spec-draft-n-min``,
#: ``--spec-draft-p-min``); llama.cpp's defaults are 16, 0 and 0.75.
DRAFT_GRID = tuple((n_max, 0, p_min) for n_max in (4, 8, 16) for p_min in (0.0, 0.5, 0.75))


def compile_flags() -> list[str]:
    """What the server is compiled with beyond ggml's own choice for this CPU (``GGML_NATIVE``): on a CPU with AMX,
    ggml's AMX matrix products are left out, because the server they build dies at its first product (a
    segmentation fault) on this project's AMX Xeon (as in ggml-org/llama.cpp#20824); its AVX-512 products and
    weight repacking stay. An explicit ``-mno-`` outlasts ``-march=native`` whatever their order."""
    from thesis_lib.models.cpu import cpu_flags

    if not {"amx_tile", "amx_int8"} & set(cpu_flags()):
        return []
    off = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return [f"-DCMAKE_C_FLAGS={off}", f"-DCMAKE_CXX_FLAGS={off}"]


def server_path() -> Path:
    """Where the server is built: per source, per set of this CPU's flags (it is compiled for them) and the flags
    :func:`compile_flags` adds."""
    import hashlib

    from thesis_lib.models.cpu import cpu_flags

    key = hashlib.sha256(" ".join([*sorted(cpu_flags()), *compile_flags()]).encode()).hexdigest()[:8]
    return cache_dir() / "llama.cpp" / f"{SOURCE.replace('==', '-')}-{key}" / "build" / "bin" / "llama-server"


def check() -> None:
    """A clear error, before any model loads, where no server is built and it cannot be."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing and not server_path().is_file():
        raise ConfigError(f"llama.cpp's server is built from source on first use, which needs {' and '.join(missing)} "
                          f"(for example: apt install cmake g++).")


def build(*, progress: bool = True) -> Path:
    """``llama-server``, built once into the cache: the sdist downloaded by pip, its ``vendor/llama.cpp`` extracted,
    configured for this CPU (``GGML_NATIVE``, :func:`compile_flags`) and compiled, each stage said on stderr with its time."""
    exe = server_path()
    root, t0 = exe.parents[2], time.perf_counter()
    if (root / "built").is_file():  # written after a whole build: a link killed midway leaves none
        return exe
    check()

    def say(text):
        if progress:
            print(f"llama.cpp: {text} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    with build_lock(root, "llama.cpp's server", timeout=3 * 3600):
        if (root / "built").is_file():  # built meanwhile by the process waited for
            return exe
        with tempfile.TemporaryDirectory() as tmp:
            say(f"downloading the sources of {SOURCE}")
            with heartbeat(f"downloading the sources of {SOURCE}"):  # pip prepares the sdist's metadata, silently
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                                SOURCE.split("==")[0], SOURCE, "-d", tmp], check=True)  # its build tools as wheels
            with tarfile.open(next(Path(tmp).glob("*.tar.gz"))) as tar:
                vendored = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
                tar.extractall(tmp, members=vendored, filter="data")
            src = next(Path(tmp).glob("*/vendor/llama.cpp"))
            flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
                     "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF",
                     *compile_flags()]
            say("configuring")
            configured = subprocess.run(["cmake", "-S", str(src), "-B", str(root / "build"), *flags], text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if configured.returncode:
                raise ConfigError("llama.cpp's server could not be configured:\n" + configured.stdout[-2000:])
            say("compiling llama-server (about 15 minutes on two cores)")
            with subprocess.Popen(["cmake", "--build", str(root / "build"), "--target", "llama-server", "-j",
                                   str(os.cpu_count() or 1)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) as proc:
                last, tail = 0.0, []
                for line in proc.stdout:
                    tail = [*tail[-39:], line]
                    if line.startswith("[") and time.perf_counter() - last > 10:  # "[ n%] Building ...": a line every 10 s
                        say(f"compiling {line.split(']')[0]}]")
                        last = time.perf_counter()
            if proc.returncode or not exe.is_file():
                raise ConfigError(f"llama.cpp's server did not build (cmake exited {proc.returncode}):\n" + "".join(tail))
        (root / "built").write_text(SOURCE + "\n")
    say("llama-server ready")
    return exe


@contextlib.contextmanager
def server(model: Path, *, threads: int, draft: Path | None = None, spec: dict | None = None):
    """A llama-server on ``model`` (one request at a time, ``threads`` threads for prompt and generation alike):
    plain decoding, or with ``spec`` either ``{"type": <n-gram method>}`` or ``{"draft_max", "draft_min",
    "draft_p_min"}`` with the ``draft`` model. Yields its URL once it answers; stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [str(build()), "-m", str(model), "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-c", "4096", "-np", "1", "--no-webui"]
    spec = spec or {}
    if "type" in spec:
        args += ["--spec-type", spec["type"]]
    elif spec:
        args += ["--spec-type", "draft-simple", "--spec-draft-model", str(draft), "--spec-draft-threads", str(threads),
                 "--spec-draft-n-max", str(spec["draft_max"]), "--spec-draft-n-min", str(spec["draft_min"]),
                 "--spec-draft-p-min", str(spec["draft_p_min"])]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    if proc.poll() is not None:
                        break
                    time.sleep(0.2)
            else:
                proc.kill()
                proc.wait()
            if proc.poll() is not None:
                log.seek(0)
                raise ConfigError("llama-server did not start: " + log.read().decode(errors="replace")[-600:])
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def complete(url: str, ids: Sequence[int], max_new_tokens: int) -> dict:
    """One greedy generation of up to ``max_new_tokens`` after ``ids`` (no prompt cache: every request starts cold;
    EOS ends it): its tokens, wall seconds, llama.cpp's prefill and decode seconds, drafted and accepted tokens."""
    body = {"prompt": [int(t) for t in ids], "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
            "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True, "seed": 0}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    seconds, t = time.perf_counter() - t0, out["timings"]
    return {"tokens": [int(x) for x in out["tokens"]], "seconds": seconds, "ttft_s": t["prompt_ms"] / 1e3,
            "decode_s": t["predicted_ms"] / 1e3, "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}


def gguf_bytes_per_step(path) -> int:
    """Bytes of the tensors a one-token step reads: all of the file's tensors but ``token_embd.weight``."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name != "token_embd.weight")


def decode_speed(results: list[dict]) -> float:
    """Pooled decode tokens per second: the tokens after each generation's first over the seconds after it."""
    return sum(len(r["tokens"]) - 1 for r in results) / sum(r["decode_s"] for r in results)


def tune(files: dict, prompts: list[list[int]], *, threads: int, max_new_tokens: int,
         progress: bool = True) -> dict:
    """Every setting of :data:`DRAFT_GRID` (the draft model) and :data:`NGRAM_TYPES` on ``prompts`` (calibration
    prompts, not the measured ones): each setting's pooled decode speed, and the fastest of each kind."""
    from thesis_lib.progress import tqdm

    grid = [{"draft_max": a, "draft_min": b, "draft_p_min": c} for a, b, c in DRAFT_GRID]
    grid += [{"type": t} for t in NGRAM_TYPES]
    tried = []
    for spec in tqdm(grid, desc="llama.cpp settings on calibration prompts", disable=not progress, unit="setting"):
        with server(files["target"], threads=threads, draft=files["draft"], spec=spec) as url:
            complete(url, prompts[0][:16], 8)  # warm-up
            speed = decode_speed([complete(url, ids, max_new_tokens) for ids in prompts])
        tried.append({**spec, "decode_tokens_per_s": speed})
    best = {kind: max((t for t in tried if ("type" in t) == (kind == "n-gram")), key=lambda t: t["decode_tokens_per_s"])
            for kind in ("speculative", "n-gram")}
    return {"tried": tried, "best": best}


def _parting(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(target_lm, draft_lm, prompts: list[list[int]], calibration: list[list[int]], *, k: int = 4,
        max_new_tokens: int = 24, progress: bool = True) -> dict:
    """``target_lm``, ``draft_lm``: the embedded pair as :func:`thesis_lib.models.loading.load_pair` gives it (this
    project's side). Tunes llama.cpp's speculative and n-gram settings on ``calibration``, then times llama.cpp's
    plain, tuned speculative and tuned n-gram decoding (three servers on the same GGUF files) and this project's
    target-only and FlashHead deferred decoding per prompt of ``prompts``, interleaved, after one warm-up each.
    Returns the document (rows per prompt, the tuning, a summary per setting)."""
    import torch

    from thesis_lib.bench.runner import Runner
    from thesis_lib.heads.for_model import flashhead_for
    from thesis_lib.models.embedded import assemble_gguf
    from thesis_lib.models.specs import resolve
    from thesis_lib.progress import tqdm

    check()
    build(progress=progress)
    threads = torch.get_num_threads()
    files = {role: assemble_gguf(resolve(lm.spec).embedded, progress=progress)
             for role, lm in (("target", target_lm), ("draft", draft_lm))}
    tuning = tune(files, calibration, threads=threads, max_new_tokens=max_new_tokens, progress=progress)
    ours = Runner(target_lm, draft_lm, k=k, max_new_tokens=max_new_tokens, flash_head=flashhead_for(draft_lm))
    specs = {"llama.cpp target-only": None, "llama.cpp speculative": tuning["best"]["speculative"],
             "llama.cpp n-gram": tuning["best"]["n-gram"]}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(server(files["target"], threads=threads, draft=files["draft"], spec=spec))
                for name, spec in specs.items()}
        settings = {name: (lambda ids, u=url: complete(u, ids, max_new_tokens)) for name, url in urls.items()}
        settings["ours target-only"] = lambda ids: _ours(ours, "baseline", ids)
        settings["ours FlashHead deferred"] = lambda ids: _ours(ours, "flash_deferred", ids)
        for fn in settings.values():  # warm-up, not recorded
            fn(prompts[0][:16])
        rows = []
        with tqdm(total=len(prompts) * len(settings), desc="llama.cpp beside ours", disable=not progress,
                  unit="run") as bar:
            for i, ids in enumerate(prompts):
                row = {"prompt": i, "prompt_tokens": len(ids)}
                for name in alternating(settings, i):
                    row[name] = settings[name](ids)
                    bar.update()
                row["parts_from_ours_at"] = {n: _parting(row[n]["tokens"], row["ours target-only"]["tokens"])
                                             for n in specs}
                row["parts_from_llama_target_only_at"] = {n: _parting(row[n]["tokens"], row["llama.cpp target-only"]["tokens"])
                                                    for n in specs if n != "llama.cpp target-only"}
                rows.append(row)
    summary = {}
    for name in settings:
        secs, toks = sum(r[name]["seconds"] for r in rows), sum(len(r[name]["tokens"]) for r in rows)
        summary[name] = {"decode_tokens_per_s": decode_speed([r[name] for r in rows]), "tokens_per_s": toks / secs,
                         "ms_per_token": 1e3 * secs / toks}
    for name in specs:
        summary[name]["equal_to_llama_target_only"] = sum(r[name]["tokens"] == r["llama.cpp target-only"]["tokens"] for r in rows)
    summary["ours FlashHead deferred"]["equal_to_ours_target_only"] = sum(
        r["ours FlashHead deferred"]["tokens"] == r["ours target-only"]["tokens"] for r in rows)
    from thesis_studies.precision.bench import step_bytes

    return {"k": k, "max_new_tokens": max_new_tokens, "threads": threads, "prompts": len(prompts),
            "calibration_prompts": len(calibration), "tuning": tuning, "rows": rows, "summary": summary,
            "bytes_per_step": {"llama.cpp target": gguf_bytes_per_step(files["target"]),
                               "llama.cpp draft": gguf_bytes_per_step(files["draft"]),
                               "ours target": step_bytes(target_lm.model), "ours draft": step_bytes(draft_lm.model)},
            "ours_precision": target_lm.info.get("dtype_requested"), "llama_cpp_source": SOURCE}


def _ours(runner, mode: str, ids) -> dict:
    g = runner.run(mode, list(ids))
    return {"tokens": list(g.tokens), "seconds": g.stats.ttft_s + g.stats.decode_s, "ttft_s": g.stats.ttft_s,
            "decode_s": g.stats.decode_s}
