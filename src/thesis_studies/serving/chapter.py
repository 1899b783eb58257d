"""The serving chapter's data (chapter 7: batches, longer generations, memory): a saved ``serving-bench`` document
(``SERVING_FILE``) or the same measurement made here at the ``SERVING_*`` sizes and cached like every other
document; and the heads at batch B, from a saved ``model-bench --parts batch`` document (``BATCH_HEADS_FILE``) or
measured here."""

from __future__ import annotations

from thesis_lib.bench import modelbench
from thesis_lib.bench.prompts import encode, load_prompts, prompt_text, select
from thesis_studies.serving.modes import Pair, measure, mixed
from thesis_lib.book.params import Params, selected_prompts
from thesis_lib.book.shared import pair, saved_or_measured

#: the long-answer categories of the longer-generations part
LONG_CATEGORIES = "coding,math_reasoning"


def serving(p: Params) -> tuple[dict, str]:
    """The serving document and a label saying where it comes from."""
    source = load_prompts(p.prompt_file)
    found = mixed(source, 3, p.serving_prompts)
    long = select(source, LONG_CATEGORIES, None, p.serving_length_prompts)
    key = {"target": p.target, "draft": p.draft, "k": p.k, "prompts": [q.question_id for q in found],
           "long": [q.question_id for q in long], "batches": list(p.serving_batches), "tokens": p.serving_tokens,
           "lengths": list(p.serving_lengths), "reps": p.serving_reps, "probes": p.probes, "clusters": p.clusters,
           "assets": p.assets, "flash_path": p.flash_path}

    def compute():
        target, draft, head = pair(p)
        ids = [encode(target.tokenizer, prompt_text(q), chat=True, thinking=p.thinking) for q in found]
        long_ids = [encode(target.tokenizer, prompt_text(q), chat=True, thinking=p.thinking) for q in long]
        doc = measure(Pair(target, draft, head, k=p.k), ("decode", "lengths", "memory"), ids, long_prompts=long_ids,
                      max_new_tokens=p.serving_tokens, batches=p.serving_batches,
                      modes=("baseline", "dense_deferred", "flash_deferred"), reps=p.serving_reps,
                      lengths=p.serving_lengths, progress=p.progress)
        doc["prompts_used"] = key["prompts"]
        return doc

    return saved_or_measured(p, "SERVING_FILE", "serving", key, compute)


def batch_heads(p: Params) -> tuple[dict, str]:
    """Both heads on B real draft states at once (``model-bench``'s batch part) and a label."""
    prompts = selected_prompts(p)
    key = {"draft": p.draft, "prompts": [q.question_id for q in prompts], "state_tokens": p.state_tokens,
           "reps": p.head_reps, "probes": p.probes, "clusters": p.clusters, "assets": p.assets,
           "flash_path": p.flash_path}

    def compute():
        _, draft, head = pair(p)
        return modelbench.run(draft, head, prompts, parts=("batch",), state_tokens=p.state_tokens,
                              head_reps=p.head_reps, progress=p.progress, thinking=p.thinking)

    doc, label = saved_or_measured(p, "BATCH_HEADS_FILE", "batch-heads", key, compute)
    return doc["batch"], label
