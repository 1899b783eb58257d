"""Shared fixtures: tiny in-process Qwen models (fast) and the embedded real pair (marked ``real``)."""

from __future__ import annotations

import pytest
import torch

from thesis_lib.models import tiny

TINY_VOCAB = 259  # the tiny tokenizer's size; the models have 272 embedding rows (padding)


@pytest.fixture(scope="session")
def tok():
    return tiny.tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_models():
    """Targets and drafts in float32, float64, packed float32 ("f32p") and packed float32 with row-exact
    attention ("f32x"). Drafts: identical, close (noisy copy), loose, independent."""
    import copy

    from thesis_lib.models import attention, fused
    from thesis_lib.models.packing import pack_linears
    from thesis_lib.models.weight_only import available as wo_available

    out = {}
    for dtype, tag in ((torch.float32, "f32"), (torch.float64, "f64")):
        for arch in ("qwen2", "qwen3"):
            target = tiny.tiny_model(arch, seed=0, dtype=dtype)
            out[(tag, arch, "target")] = target
            out[(tag, arch, "same")] = target
            out[(tag, arch, "close")] = tiny.noisy_copy(target, 0.02, seed=3)
            out[(tag, arch, "loose")] = tiny.noisy_copy(target, 0.1, seed=4)
            out[(tag, arch, "independent")] = tiny.tiny_model(arch, hidden=32, layers=1, seed=7, dtype=dtype)
    # "f32p": the float32 models with oneDNN-packed linear layers and transformers' batched attention
    for (tag, arch, role), m in list(out.items()):
        if tag == "f32":
            packed = copy.deepcopy(m)
            pack_linears(packed)
            out[("f32p", arch, role)] = packed
    for arch in ("qwen2", "qwen3"):
        out[("f32p", arch, "same")] = out[("f32p", arch, "target")]
    # "f32x": packed float32 with row-exact attention and the fused operations (what the loader gives a CPU model)
    for (tag, arch, role), m in list(out.items()):
        if tag == "f32" and role != "same":
            exact = copy.deepcopy(m)
            pack_linears(exact)
            attention.use(exact)
            if wo_available():
                fused.use(exact)
            out[("f32x", arch, role)] = exact
    for arch in ("qwen2", "qwen3"):
        out[("f32x", arch, "same")] = out[("f32x", arch, "target")]
    return out


@pytest.fixture(scope="session")
def real_pair():
    """The embedded Qwen2.5-Coder 1.5B target and 0.5B draft (converted once into the model cache)."""
    from thesis_lib.models import loading

    return loading.load_pair(progress=False)


def require_rows_exact(ok: bool, dtype: torch.dtype, what: str) -> None:
    """Go on where the row probe holds; where it does not, fail on a kind of CPU the project has measured exact
    (models.cpu.rows_exact_expected: a fault, not a fact of the machine), and skip elsewhere."""
    from thesis_lib.models.cpu import rows_exact_expected

    if ok:
        return
    if rows_exact_expected(dtype):
        pytest.fail(f"{what}: the row probe fails on a kind of CPU where packed {dtype} was measured row-exact")
    pytest.skip(f"{what}: this CPU's {dtype} kernels compute a block's rows unlike single rows")


def int8_pair():
    """A tiny target and a close draft in int8-dynamic (each row computed alone by construction) with row-exact
    attention, and a FlashHead head of the draft (17 clusters, 2 probes): ``(target, draft, flash)``. Where the
    project's kernel cannot be built, the same models in float64 on plain PyTorch (a block's rows may round unlike
    single rows there, but in float64 a greedy choice between the tiny models' logits is never that close), so that
    the losslessness tests that use the pair run on every machine."""
    from thesis_lib.heads import clustering as cl
    from thesis_lib.heads.flashhead import FlashHead
    from thesis_lib.models import attention, fused
    from thesis_lib.models import weight_only as wo

    kernel = wo.available()
    target = tiny.tiny_model("qwen2", seed=0)
    draft = tiny.noisy_copy(target, 0.01, seed=3)
    if not kernel:
        target, draft = target.double(), draft.double()
    w = draft.get_output_embeddings().weight.detach().clone()
    for m in (target, draft):
        if kernel:
            wo.convert(m, "int8-dynamic", head_rows=m is draft)  # the target's head as load_pair gives it
        attention.use(m)
        if kernel:
            fused.use(m)
    flash = FlashHead(w, cl.spherical_kmeans(w, 17, iterations=10, seed=0, progress=False), n_probes=2,
                      vocab_limit=TINY_VOCAB, path="eager")
    return target, draft, flash
