"""Chapter 6's draft heads as a run builds them (registered in :data:`thesis_lib.extensions.DRAFT_HEADS`): FlashHead
with adaptive probes (``adaflash``, :mod:`.adaptive`) and the frequency-truncated head (``freq``, :mod:`.truncated`),
with the token counts behind the latter."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from thesis_lib.bench.modelbench import collect_hidden_states
from thesis_lib.bench.prompts import encode
from thesis_lib.errors import ConfigError
from thesis_lib.heads.assets import clustering_cache_root
from thesis_lib.models.cache import write_atomic

from .adaptive import AdaptiveFlashHead
from .truncated import frequency_head


def count_tokens(loaded, prompts, *, max_new_tokens: int = 48, cache: str | Path | None = None,
                 progress: bool = True) -> tuple[Counter, dict]:
    """Token counts over the prompts' texts (chat-formatted, as the benchmark sends them) and the model's own
    greedy continuations of them; cached in ``cache`` (a JSON file) keyed by model, prompts and length.
    Returns the counts and a description of the corpus."""
    key = {"model": str(loaded.info.get("gguf_sha256") or loaded.spec), "prompts": [p.question_id for p in prompts],
           "texts": hashlib.sha256(json.dumps([p.text for p in prompts]).encode()).hexdigest(),
           "max_new_tokens": max_new_tokens}
    path = Path(cache) if cache else None
    if path is not None and path.is_file():
        doc = json.loads(path.read_text())
        if doc.get("key") == key:
            return Counter({int(t): c for t, c in doc["counts"].items()}), doc["corpus"]
    if not prompts:
        raise ConfigError("No calibration prompts to count tokens on.")
    counts: Counter = Counter()
    for p in prompts:
        counts.update(encode(loaded.tokenizer, p.text, chat=True))
    hs = collect_hidden_states(loaded, prompts, max_new_tokens=max_new_tokens, progress=progress)
    counts.update(hs.dense_tokens)
    corpus = {"prompts": len(prompts), "generated_tokens": len(hs.dense_tokens), "tokens": sum(counts.values()),
              "distinct": len(counts), "source": "calibration prompts (not measured) and the draft's greedy "
              "continuations of them"}
    if path is not None:
        write_atomic(path, json.dumps({"key": key, "corpus": corpus, "counts": {str(t): c for t, c in counts.items()}}))
    return counts, corpus


def token_counts(cfg, draft, *, progress: bool = True):
    """The frequency head's token counts for this configuration (calibration prompts, cached under their texts:
    an edited prompt is counted again)."""
    key = json.dumps([cfg.draft, cfg.prompt_file, cfg.freq_calibration, cfg.freq_tokens_generated,
                      [p.question_id for p in cfg.check_prompts()], [p.text for p in cfg.calibration_prompts()]])
    cache = clustering_cache_root().parent / "token-counts" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    return count_tokens(draft, cfg.calibration_prompts(), max_new_tokens=cfg.freq_tokens_generated, cache=cache,
                        progress=progress)


def adaptive_head(cfg, draft, head, *, progress: bool = True) -> tuple[AdaptiveFlashHead, dict]:
    """The ``adaflash`` draft's head: the run's FlashHead with adaptive probes at the configuration's margin."""
    adaptive = AdaptiveFlashHead(head, margin=cfg.adaptive_margin, min_probes=cfg.adaptive_min_probes,
                                 max_probes=cfg.adaptive_max_probes or head.n_probes)
    return adaptive, {"margin": cfg.adaptive_margin, "min_probes": adaptive.min_probes,
                      "max_probes": adaptive.max_probes}


def truncated_head(cfg, draft, head, *, progress: bool = True):
    """The ``freq`` draft's head: the draft's most frequent tokens (as many as FlashHead's candidates, or
    ``freq_tokens``), counted on the calibration prompts."""
    counts, corpus = token_counts(cfg, draft, progress=progress)
    n = cfg.freq_tokens or head.n_probes * head.cluster_size
    freq = frequency_head(draft, counts, n, head.special_ids.tolist())
    return freq, {"tokens": n, "scored": freq.candidates_per_step(), "corpus": corpus}
