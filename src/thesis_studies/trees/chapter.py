"""The token-tree chapter's data (chapter 8): a saved ``tree-bench`` document (``TREE_FILE``) or the same measurement
made here at the ``TREE_*`` sizes and cached like every other document."""

from __future__ import annotations

from thesis_studies.trees import bench as trees
from thesis_lib.bench.prompts import encode, held_out, load_prompts, prompt_text, select
from thesis_lib.bench.runner import Runner
from thesis_lib.models import loading
from thesis_lib.book.params import Params
from thesis_lib.book.shared import pair, saved_or_measured


def tree_document(p: Params) -> tuple[dict, str]:
    """The tree-bench document and a label saying where it comes from."""
    source = load_prompts(p.prompt_file)
    found = select(source, None, None, p.tree_per_category)
    calib = held_out(source, found, p.tree_calibration)
    key = {"target": p.target, "draft": p.draft, "k": p.k, "prompts": [q.question_id for q in found],
           "calibration": [q.question_id for q in calib], "calibration_tokens": p.tree_calibration_tokens,
           "tokens": p.tree_tokens, "iterations": p.tree_iterations, "probes": p.probes, "clusters": p.clusters,
           "assets": p.assets, "flash_path": p.flash_path}

    def compute():
        target, draft, head = pair(p)
        loading.probe_rows(target, 1 + trees.MAX_NODES)
        runner = Runner(target, draft, k=p.k, max_new_tokens=p.tree_tokens, flash_head=head)
        calib_ids = [encode(target.tokenizer, prompt_text(q), chat=True, thinking=p.thinking) for q in calib]
        doc = trees.measure(runner, calib_ids, found, calibration_tokens=p.tree_calibration_tokens,
                            iterations=p.tree_iterations, thinking=p.thinking, progress=p.progress)
        doc.update(prompts_used=key["prompts"], calibration_prompts=key["calibration"],
                   rows_exact=target.info.get("rows_exact"), rows_probed=target.info.get("rows_probed"))
        return doc

    return saved_or_measured(p, "TREE_FILE", "trees", key, compute)
