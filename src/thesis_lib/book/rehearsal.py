"""The GPU-host path rehearsed on a CPU: the thesis' three hub repos as tiny random stand-ins, on two virtual GPUs.

``params/rehearsal.yaml`` takes ``gpu-thesis``'s code path on any machine. :func:`prepare` writes a Hugging Face cache
holding a tiny bfloat16 Qwen3 target (not AWQ: its loader gptqmodel does not install beside this project's torch,
so that path is checked up to its missing-package error), a tied draft, and an Embedl-layout FlashHead checkpoint whose
body differs a little from the draft's (so "dense shared" shows something). :func:`environment` sets the hub
offline and virtual CUDA devices (:mod:`thesis_lib.models.virtual`), so device mix-ups raise as on two GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..heads.assets import save_assets
from ..heads.clustering import default_clusters, spherical_kmeans
from ..models import tiny
from ..models.cache import cache_dir
from ..models.virtual import ENV as VIRTUAL_ENV

TARGET, DRAFT, FLASHHEAD = "Qwen/Qwen3-32B-AWQ", "Qwen/Qwen3-0.6B", "embedl/Qwen3-0.6B-FlashHead"
REVISION = "0" * 40
FORMAT = 1  # bump when what prepare() writes changes
THINKING_TEMPLATE = tiny.CHAT_TEMPLATE + ("{% if add_generation_prompt and enable_thinking is not false %}"
                                          "<think>\n{% endif %}")


def root() -> Path:
    return cache_dir() / "rehearsal-hf"


def _snapshot(home: Path, repo: str) -> Path:
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(REVISION)
    snap = folder / "snapshots" / REVISION
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def prepare(home: Path | None = None) -> Path:
    """Write the three stand-in repos into a Hugging Face cache (once); returns the ``HF_HOME``."""
    import torch

    home = home or root()
    marker = home / "thesis_lib_rehearsal.json"
    if marker.is_file() and json.loads(marker.read_text()).get("format") == FORMAT:
        return home
    tmp = home.with_name(home.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = tiny.tiny_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    target = tiny.tiny_model("qwen3", seed=0, dtype=torch.bfloat16)
    draft = tiny.noisy_copy(tiny.tiny_model("qwen3", seed=0, tied=True), 0.02, seed=3).to(torch.bfloat16)
    body = tiny.noisy_copy(draft, 0.01, seed=11)
    tiny.save_tiny(target, tok, _snapshot(tmp, TARGET))
    tiny.save_tiny(draft, tok, _snapshot(tmp, DRAFT))
    snap = tiny.save_tiny(body, tok, _snapshot(tmp, FLASHHEAD))
    weight = body.get_output_embeddings().weight.detach().float()
    n_clusters = default_clusters(weight.shape[0])
    save_assets(spherical_kmeans(weight, n_clusters, iterations=8, seed=0, progress=False), snap / "flash_head_assets")
    config = json.loads((snap / "config.json").read_text())
    config.update(model_type="flash_head_qwen3", architectures=["FlashHeadQwen3ForCausalLM"], n_clusters=n_clusters,
                  n_probes=max(1, n_clusters // 4), flash_head_cache_dir="flash_head_assets",
                  flash_head_special_token_ids=sorted(set(tok.all_special_ids)), enforce_equal_cluster_sizes=True)
    (snap / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "thesis_lib_rehearsal.json").write_text(json.dumps({"format": FORMAT, "repos": [TARGET, DRAFT, FLASHHEAD]}))
    shutil.rmtree(home, ignore_errors=True)
    os.replace(tmp, home)
    return home


def real_devices(devices) -> bool:
    """Whether every CUDA device in ``devices`` exists in this process (then no virtual ones are needed)."""
    import torch

    wanted = [torch.device(d).index or 0 for d in devices if str(d).startswith("cuda")]
    return torch.cuda.is_available() and all(i < torch.cuda.device_count() for i in wanted)


def environment(home: Path | None = None, gpus: int = 2, devices=()) -> dict[str, str]:
    """The variables a rehearsal process needs: the stand-in hub, no network, and ``gpus`` virtual CUDA devices
    unless the ``devices`` the set names are real ones here (a GPU host runs the rehearsal on its own GPUs)."""
    env = {"HF_HOME": str(home or root()), "HF_HUB_OFFLINE": "1"}
    if not real_devices(devices):
        env[VIRTUAL_ENV] = str(gpus)
    return env
