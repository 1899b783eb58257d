"""The command line: bad parameters fail fast with a clear message; compare runs end to end on tiny models."""

from __future__ import annotations

import json
import os

import pytest

from thesis_lib import cli
from thesis_lib.cli import options
from thesis_lib.errors import ConfigError
from thesis_lib.models import tiny
from thesis_lib.models import weight_only as wo


@pytest.mark.parametrize("argv, message", [
    (["compare", "--k", "0"], "--k must be an integer >= 1"),
    (["compare", "--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1"),
    (["compare", "--modes", "baseline,warp"], "Unknown mode"),
    (["compare", "--categories", "poetry"], "Unknown category"),
    (["compare", "--target", "embedded:nope"], "Unknown model"),
    (["generate", "hi", "--mode", "flash_tree", "--tree-width", "0"], "tree_width must be an integer >= 1"),
    (["compare", "--modes", "dense_tree", "--tree-shape", "0.0"], "without) its parent"),
])
def test_bad_parameters_fail_fast(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_existing_output_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    out.write_text("precious\n")
    assert cli.main(["compare", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == "precious\n"


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = capsys.readouterr().out
    for opt in ("--target", "--draft", "--k", "--max-new-tokens", "--modes", "--prompts", "--warmup", "--out"):
        assert opt in text


def test_compare_end_to_end_on_tiny_local_models(tmp_path, tok, capsys):
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "t")
    draft = tiny.save_tiny(tiny.noisy_copy(tiny.tiny_model(seed=0), 0.02), tok, tmp_path / "d")
    out = tmp_path / "records.jsonl"
    rc = cli.main(["compare", "--target", str(target), "--draft", str(draft), "--prompts", "2", "--max-new-tokens",
                   "12", "--k", "3", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)  # the last line of output is one JSON document
    summary = doc["summary"]
    assert set(summary) == {"baseline", "dense_ordinary", "dense_deferred", "hf_greedy", "hf_assisted"}
    for mode, s in summary.items():
        assert s["samples"] == 2
        assert s["matches_baseline"] == 2, mode  # every mode, ours and transformers', gives the same tokens
    assert summary["baseline"]["speedup_vs_baseline"] == 1.0
    assert 0 <= summary["dense_deferred"]["acceptance"] <= 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10
    base = {r["question_id"]: r["decode_tokens_per_s"] for r in records if r["mode"] == "baseline"}
    ratios = sorted(r["decode_tokens_per_s"] / base[r["question_id"]] for r in records if r["mode"] == "dense_ordinary")
    assert summary["dense_ordinary"]["speedup_vs_baseline"] == pytest.approx(sum(ratios) / 2)


@pytest.mark.parametrize("argv, message", [
    (["model-bench", "--probes", "0"], "probes must be >= 1"),
    (["model-bench", "--probes", "9497"], "out of range"),
    (["model-bench", "--clusters", "151937"], "does not fit"),
    (["model-bench", "--parts", "head,speed"], "Unknown part"),
    (["model-bench", "--assets", "no/such/folder"], "is not a folder"),
    (["compare", "--modes", "baseline,flash_deferred", "--probes", "100000"], "out of range"),
    (["cluster", "--clusters", "0"], "does not fit"),
])
def test_bad_flashhead_parameters_fail_fast(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_flash_modes_end_to_end_on_tiny_local_models(tmp_path, tok, capsys, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    target = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "t")
    draft = tiny.save_tiny(tiny.noisy_copy(tiny.tiny_model(seed=0), 0.02), tok, tmp_path / "d")
    rc = cli.main(["compare", "--target", str(target), "--draft", str(draft), "--prompts", "2", "--max-new-tokens",
                   "12", "--k", "3", "--modes", "baseline,dense_deferred,flash_ordinary,flash_deferred",
                   "--clusters", "17", "--probes", "3", "--kmeans-iterations", "4", "--flash-path", "eager"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["flashhead"] == {"n_clusters": 17, "n_probes": 3, "path": "eager", "centroid_dtype": doc["flashhead"]["centroid_dtype"]}
    for mode in ("flash_ordinary", "flash_deferred"):
        assert doc["summary"][mode]["matches_baseline"] == 2  # lossless with the FlashHead draft too
    # the clustering is cached and can be exported in Embedl's format; an existing folder is refused
    export = tmp_path / "assets"
    assert cli.main(["cluster", "--model", str(draft), "--clusters", "17", "--kmeans-iterations", "4", "--export", str(export)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["n_clusters"] == 17 and info["cluster_size"] == 16
    assert (export / "clustering_cache.safetensors").is_file() and (export / "clustering_config.json").is_file()
    assert cli.main(["cluster", "--model", str(draft), "--export", str(export)]) == 2
    assert "exists" in capsys.readouterr().err


def test_model_bench_end_to_end_on_a_tiny_model(tmp_path, tok, capsys, monkeypatch):
    """model-bench's document: the quality curve, head and step latencies, and the head's share of a step and the
    free-head ceiling recomputed from the dense and body-only step times it records, at the mean and at P50."""
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    draft = tiny.save_tiny(tiny.tiny_model(seed=0), tok, tmp_path / "d")
    out = tmp_path / "mb.json"
    rc = cli.main(["model-bench", "--draft", str(draft), "--clusters", "17", "--kmeans-iterations", "4", "--prompts", "2",
                   "--state-tokens", "10", "--probe-list", "1,4,17", "--head-reps", "1", "--step-reps", "3",
                   "--flash-path", "eager", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [r["n_probes"] for r in doc["quality"]] == [1, 4, 17]
    assert doc["quality"][-1]["agreement"] == 1.0  # all clusters probed: the dense argmax
    for part in ("head", "step"):
        stats = doc[part]["stats"]
        base = stats["dense"]["mean_ms"]
        assert doc[part]["speedups"]["flashhead"]["speedup_mean"] == pytest.approx(base / stats["flashhead"]["mean_ms"])
        for s in stats.values():
            assert s["p50_ms"] <= s["p95_ms"] and s["tokens_per_s"] == pytest.approx(1e3 / s["mean_ms"])
    assert set(doc["step"]["stats"]) == {"dense", "dense_shared", "flashhead", "body_only"}
    st = doc["step"]["stats"]
    assert st["dense"]["n"] == st["body_only"]["n"] == 2 * 3 and st["dense"]["mean_ms"] != st["dense"]["p50_ms"]
    for stat in ("mean", "p50"):
        dense, body = st["dense"][f"{stat}_ms"], st["body_only"][f"{stat}_ms"]
        assert doc["step"][f"head_share_{stat}"] == pytest.approx((dense - body) / dense, rel=1e-12, abs=1e-12)
        assert doc["step"][f"head_only_ceiling_{stat}"] == pytest.approx(dense / body, rel=1e-12)
    assert cli.main(["model-bench", "--draft", str(draft), "--out", str(out)]) == 2  # never overwritten


def test_gpu_check_runs_on_a_cpu(tmp_path, capsys):
    """The GPU acceptance command at the thesis' shapes (random weights), shrunk to run here: every part
    reports, the compiled FlashHead path really compiled, and the JSON document is the last line."""
    out = tmp_path / "gpu-check.json"
    assert cli.main(["studies", "gpu-check", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc == json.loads(out.read_text())
    assert "random weights" in doc["note"] and doc["versions"]["device"] == "cpu"
    assert [r["n_probes"] for r in doc["head"]["curve"]] == [64, 593]
    assert doc["head"]["paths"] == {"eager": "eager", "compiled": "compiled"} and not doc["head"]["compile_errors"]
    assert doc["head"]["n_clusters"] == 151936 // 16 and doc["draft_step"]["path"] == (
        "kernel" if wo.available() else "compiled")  # "auto" on a CPU
    assert set(doc["verify"]["over_step"]) == {"1", "2", "3", "4", "5"} and doc["verify"]["over_step"]["1"] == 1.0
    assert cli.main(["studies", "gpu-check", "--device", "cuda:0"]) == 2  # no CUDA here: a clear error, nothing measured
    assert "no CUDA device" in capsys.readouterr().err


def test_gpu_check_s_random_models_have_the_thesis_shapes_and_a_sane_scale():
    """gpu-check's random Qwen3 stacks (built without transformers' initialisation, for speed): the parameters and
    shapes transformers builds, in the requested dtype, the embedding and head tied where the config says, norms at
    one, other weights at the config's scale and not copies of each other, float32 rotary frequencies, the same
    weights for the same seed and finite logits."""
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from thesis_studies.gpucheck.verify import qwen3, qwen3_config
    from thesis_lib.models.specs import QWEN3_CONFIGS

    shape = QWEN3_CONFIGS["Qwen3-0.6B"]
    cfg = qwen3_config(shape, 1)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in Qwen3ForCausalLM(cfg).named_parameters(remove_duplicate=False)}
    for tied in (True, False):
        model = qwen3({**shape, "tie_word_embeddings": tied}, 1, "cpu")
        params = {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}
        assert {n: p.shape for n, p in params.items()} == shapes
        assert all(p.dtype == torch.bfloat16 for p in params.values())
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
        attn = model.model.layers[0].self_attn
        assert not torch.equal(attn.k_proj.weight, attn.v_proj.weight)
        for name, p in params.items():
            if name.endswith("norm.weight"):
                assert (p == 1).all(), name
            else:
                assert abs(float(p.float().std()) - cfg.initializer_range) < 0.05 * cfg.initializer_range, name
                assert abs(float(p.float().mean())) < 1e-3, name
        freq = model.model.rotary_emb.inv_freq
        assert freq.dtype == torch.float32 and torch.equal(freq, Qwen3RotaryEmbedding(cfg).inv_freq)
    again = qwen3({**shape, "tie_word_embeddings": False}, 1, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))
    with torch.inference_mode():
        assert torch.isfinite(model(torch.arange(100, 120)[None]).logits).all()


def test_the_4bit_target_has_the_thesis_layers_in_4_bits(monkeypatch):
    """gpu-check's 4-bit target, built on a CPU at a small Qwen3 shape: every linear layer of every decoder layer is
    a 4-bit layer of the shape transformers would build (packed for torch's CUDA kernel: its 4-bit product and
    packing run on CUDA only, so the random fill is replaced here), embedding, norms and head in bfloat16 at the
    config's scale, norms at one, float32 rotary frequencies; a shape the packing cannot take is refused."""
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from thesis_studies.gpucheck import verify as gpuverify

    shape = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, tie_word_embeddings=False, model_type="qwen3")
    filled = []
    monkeypatch.setattr(gpuverify.Int4Linear, "fill", lambda self, g, scale: filled.append(self))
    model = gpuverify.qwen3_int4(shape, 2, "cpu")
    cfg = gpuverify.qwen3_config(shape, 2)
    with torch.device("meta"):
        plain = Qwen3ForCausalLM(cfg)
    linears = {n: m for n, m in plain.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    got = {n: m for n, m in model.named_modules() if isinstance(m, gpuverify.Int4Linear)}
    assert set(got) == set(linears) and len(got) == 2 * 7 and len(filled) == len(got)
    for name, m in got.items():
        assert (m.in_features, m.out_features) == (linears[name].in_features, linears[name].out_features)
        assert m.weight.dtype == torch.int32 and m.weight.numel() * 8 == m.in_features * m.out_features
        assert m.scales_and_zeros.shape == (m.in_features // 128, m.out_features, 2)
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in params.values())
    assert all((p == 1).all() for n, p in params.items() if n.endswith("norm.weight"))
    head = params["lm_head.weight"].detach().float()
    assert head.shape == (1024, 256) and abs(float(head.std()) - cfg.initializer_range) < 0.1 * cfg.initializer_range
    freq = model.model.rotary_emb.inv_freq
    assert freq.dtype == torch.float32 and torch.equal(freq, Qwen3RotaryEmbedding(cfg).inv_freq)
    with pytest.raises(ValueError, match="int4 packing"):
        gpuverify.Int4Linear(100, 64)


def test_precision_bench_on_tiny_models(tmp_path, capsys):
    """float32 beside bfloat16 (where the CPU runs it natively): every block timed in both, speculative output
    equal to the same precision's target-only output on every prompt, the document saved once and never
    overwritten; a precision this CPU cannot run natively or an unknown one fails before any model loads."""
    from thesis_studies.precision import tables as analysis
    from thesis_lib.models.packing import bf16_packing_available, float32_rows_floor

    assert cli.main(["studies", "precision-bench", "--precisions", "float16"]) == 2
    assert "Unknown precision" in capsys.readouterr().err
    emulated = not bf16_packing_available()
    if emulated:  # refused unless asked for on purpose; then timed like the native case, and said so
        assert cli.main(["studies", "precision-bench"]) == 2
        assert "not native" in capsys.readouterr().err
    out = tmp_path / "precision.json"
    from thesis_studies.precision.bench import int4_available

    precisions = ["float32", "bfloat16"] + (["int4"] if int4_available() else [])
    extra = ["--emulated"] if emulated else []
    assert cli.main(["studies", "precision-bench", "--precisions", "int4", "--int4-group", "100", *extra]) == 2
    assert "--int4-group must be" in capsys.readouterr().err
    if not int4_available():  # the optional extra is missing: said before any model loads
        assert cli.main(["studies", "precision-bench", "--precisions", "float32,int4", *extra]) == 2
        assert "needs torchao (not installed)" in capsys.readouterr().err
    argv = ["studies", "precision-bench", "--target", "tiny:target", "--draft", "tiny:draft", "--reps", "2", "--max-block", "5",
            "--e2e-prompts", "2", "--max-new-tokens", "8", "-k", "2", "--precisions", ",".join(precisions),
            "--int4-group", "32", "--out", str(out), *extra]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc == json.loads(out.read_text()) and doc["measured"]["git"]
    assert doc["emulated_bf16"] is emulated and doc["command"].endswith("--emulated") is emulated
    assert doc["kernels"]["bfloat16"][0].startswith("stock" if emulated else "oneDNN-packed")
    assert [", block layout" in k for k in doc["kernels"]["float32"]] == [True, True]
    f32_padded = float32_rows_floor() == 5  # this CPU's float32 floor: 5 with AVX-512 kernels, else 1 (unpadded)
    padded = {p: ["padded to 5" in k for k in doc["kernels"][p]] for p in ("float32", "bfloat16")}
    assert padded == {"float32": [f32_padded] * 2, "bfloat16": [not emulated] * 2}
    assert analysis.float32_rows(doc) == ("padded to 5 rows" if f32_padded else "unpadded")
    assert {p: [a.split(" ")[0] for a in pair] for p, pair in doc["attention"].items()} == {
        p: ["row-exact", "row-exact"] for p in precisions}
    for name in [f"{role}/{p}" for p in precisions for role in ("target", "draft")]:
        assert sorted(int(n) for n in doc["verify"][name]["ms"]) == [1, 2, 3, 4, 5]
    if "int4" in precisions:  # the target's body really is 4-bit: its kernels say so, its numbers are its own
        assert doc["kernels"]["int4"][0].startswith("int4 weight-only body") and "group 32" in doc["kernels"]["int4"][0]
        assert doc["int4"]["group_size"] == 32
    for p in precisions:
        for mode in ("dense_deferred", "flash_deferred"):
            assert doc["end_to_end"]["summary"][p]["vs_baseline"][mode]["equal_outputs"] == 2, (p, mode)
        assert 1 <= doc["end_to_end"]["summary"][p]["vs_baseline"]["dense_deferred"]["mean_emitted"] <= 3
    rows = analysis.model_rows(doc, 0.5)
    assert list(rows.precision) == precisions and (rows["v = verify(3) / step"] > 0).all()
    bw = doc["bandwidth"]  # the tiny target's weights per step: float32 twice bfloat16's bytes; int4's not counted
    assert bw["stream_read_gbps"] > 0 and bw["step_bytes"]["target/float32"] == 2 * bw["step_bytes"]["target/bfloat16"]
    assert ("target/int4" not in bw["step_bytes"]) or bw["step_bytes"]["target/int4"] is None
    # the plain-sum read timed beside the steps, once per repetition, for each precision with countable bytes
    assert set(bw["read_gbps"]) == {"float32", "bfloat16"} and min(bw["read_gbps"].values()) > 0
    assert set(bw["step_share"]) == {f"target/{p}" for p in precisions if p != "int4"}
    assert analysis.float32_layout(doc) == "general"
    assert analysis.summary(doc, 0.5)["prec_bytes_ratio_bfloat16"] == 2.0
    assert all(v != v for v in analysis.summary(None, 0.5).values())  # no document: nothing to glue but nan
    assert cli.main(argv) == 2 and "exists" in capsys.readouterr().err


def test_bf16_precisions_are_refused_where_bf16_is_emulated(monkeypatch):
    """bfloat16 and int4 (bf16 activations and draft) run bf16 layers: on a CPU without native bf16 they are refused
    before any model loads unless --emulated asks for the emulation; float32 is never refused for it."""
    from thesis_studies.precision import bench as precision
    from thesis_lib.errors import ConfigError
    from thesis_lib.models import packing

    monkeypatch.setattr(packing, "bf16_packing_available", lambda: False)
    assert precision.emulates_bf16(["bfloat16"]) and precision.emulates_bf16(["int4"])
    assert not precision.emulates_bf16(["float32"])
    with pytest.raises(ConfigError, match="not native"):
        precision.check(["bfloat16"], 13, 15)
    precision.check(["bfloat16"], 13, 15, emulated=True)
    monkeypatch.setattr(packing, "bf16_packing_available", lambda: True)
    assert not precision.emulates_bf16(["bfloat16", "int4"])

def test_llama_bench_without_a_compiler_fails_before_any_model(monkeypatch, tmp_path, capsys):
    """With no llama-server built and no CMake to build one, the command says what to install and loads nothing."""
    import shutil

    from thesis_lib.models import loading

    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path))
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "cmake" else real(name, *a, **k))
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    assert cli.main(["studies", "llama-bench", "--per-category", "2"]) == 2
    err = capsys.readouterr().err
    assert "needs cmake" in err and "Traceback" not in err


def test_serving_bench_decodes_batches_on_tiny_models(tmp_path, tok, capsys, monkeypatch):
    """serving-bench on a tiny int8-dynamic pair: every batch size's groups, every mode's rows equal to their
    prompts' one-row target-only output, the step costs recorded; longer generations equal to target-only; the KV
    bytes of the tiny target per token; the tables printed; the document never overwritten."""
    from thesis_lib.models import weight_only

    if not weight_only.available():
        pytest.skip("the weight-only kernel cannot be built here")
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    target = tiny.tiny_model(seed=0)
    t = tiny.save_tiny(target, tok, tmp_path / "t")
    d = tiny.save_tiny(tiny.noisy_copy(target, 0.01, seed=3), tok, tmp_path / "d")
    out = tmp_path / "serving.json"
    args = ["studies", "serving-bench", "--target", str(t), "--draft", str(d), "--dtype", "int8-dynamic", "--prompt-file", "demo",
            "--per-category", "1", "--prompts", "4", "--batches", "1,4", "--max-new-tokens", "6", "--reps", "1",
            "--clusters", "17", "--kmeans-iterations", "4", "--flash-path", "eager", "--parts", "decode,lengths,memory",
            "--lengths", "8,16", "--length-per-category", "1", "--out", str(out)]
    assert cli.main(args) == 0
    doc = json.loads(out.read_text())
    lengths, mem = doc["lengths"], doc["memory"]
    assert lengths["lengths"] == [8, 16] and lengths["prompts"] == 2 and len(lengths["head_share"]) == 2
    assert all(part["equal"]["flash_deferred"] == 2 for part in lengths["by_length"].values())
    assert mem["kv"]["target"]["per_token"] == 2 * 2 * 2 * 16 * 4 and mem["flashhead"]["total"] > 0
    assert set(mem["peak"]) == {"baseline", "dense_deferred", "flash_deferred", "batched_baseline",
                                "batched_flash_deferred"} and mem["peak"]["batched_baseline"]["rows"] == 4
    dec = doc["decode"]
    assert dec["batch_sizes"] == [1, 4] and len({p for p in doc["prompts_used"]}) == 4
    for b, groups in (("1", 4), ("4", 1)):
        part = dec["by_batch"][b]
        assert part["groups"] == groups and part["rows"] == 4
        assert all(part["rows_equal"][m] == 4 for m in dec["modes"]) and len(part["decode_s"]["baseline"]) == groups
        costs = part["costs_ms"]
        assert set(costs) == {"target_1", "target_4", "target_5", "dense_1", "flash_1", "times_ms"}
        assert all(min(costs["times_ms"][n]) <= costs[n] <= max(costs["times_ms"][n]) for n in costs["times_ms"])
    printed = capsys.readouterr().out
    assert "batched greedy decoding" in printed and "acceptance by output position" in printed and "memory" in printed
    assert cli.main(args) == 2


@pytest.mark.parametrize("bad", [["--parts", "decode,nope"], ["--batches", "0"], ["--batches", "1,99"],
                                 ["--modes", "dense_deferred"], ["--modes", "baseline,flash_pipelined"],
                                 ["--per-category", "0"], ["--reps", "0"], ["-k", "0"]])
def test_serving_bench_refuses_bad_options_before_any_model(bad, monkeypatch, capsys):
    from thesis_lib.models import loading

    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    assert cli.main(["studies", "serving-bench", *bad]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_finished_document_is_saved_beside_an_out_file_that_appeared_meanwhile(tmp_path, capsys):
    """``--out`` was new when the command began (checked first); a file made there while it ran stays as it is, and
    the document goes to a new name beside it, said on stderr."""
    from types import SimpleNamespace

    out = tmp_path / "doc.json"
    path = options.new_out_path(SimpleNamespace(out=str(out)))
    out.write_text("theirs")
    options.write_new(path, {"ours": 1})
    assert out.read_text() == "theirs"
    [saved] = [f for f in tmp_path.iterdir() if f != out]
    assert saved.name.startswith("doc-") and saved.suffix == ".json" and json.loads(saved.read_text()) == {"ours": 1}
    assert str(saved) in capsys.readouterr().err
    options.write_new(tmp_path / "new.json", {"x": 2})
    assert json.loads((tmp_path / "new.json").read_text()) == {"x": 2}
    for i in range(3):  # within the same second: each document keeps a name of its own
        options.write_new(path, {"ours": 2 + i})
    assert out.read_text() == "theirs"
    kept = sorted(json.loads(f.read_text())["ours"] for f in tmp_path.glob("doc-*.json"))
    assert kept == [1, 2, 3, 4]  # nothing overwritten, whether or not a second ticked between them


def test_a_document_is_saved_without_hard_links_and_never_into_a_file(tmp_path, monkeypatch):
    """Where the file system has no hard links the name is reserved first (a file there still wins); an --out
    inside a file instead of a folder is refused before the work."""
    import errno
    from types import SimpleNamespace

    def no_links(src, dst):
        raise OSError(errno.EPERM, "no hard links here")

    monkeypatch.setattr(os, "link", no_links)
    for i in range(2):
        options.write_new(tmp_path / "doc.json", {"n": i})
    assert json.loads((tmp_path / "doc.json").read_text()) == {"n": 0}
    assert [json.loads(f.read_text()) for f in tmp_path.glob("doc-*.json")] == [{"n": 1}]
    assert not list(tmp_path.glob(".*partial"))
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        options.new_out_path(SimpleNamespace(out=str(tmp_path / "doc.json" / "x.json")))
