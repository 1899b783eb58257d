"""Prompt sources: shipped sets, local files, URLs (downloaded once, cached), selection and bad input."""

from __future__ import annotations

import json
import socket
import threading
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler

import pytest

from thesis_lib import cli
from thesis_lib.bench import prompts
from thesis_lib.errors import ConfigError


def test_project_set_has_eight_prompts_in_each_of_seven_categories():
    ps = prompts.load_prompts("project")
    cats = {}
    for p in ps:
        cats[p.category] = cats.get(p.category, 0) + 1
    assert cats == {c: 8 for c in ("conversation", "translation", "summarization", "qa", "math_reasoning", "rag", "coding")}
    assert len({p.question_id for p in ps}) == 56
    assert all(len(p.turns) == 2 for p in ps if p.category == "conversation")
    assert all(p.text == p.turns[0] for p in ps)


def test_selection_by_category_and_count():
    ps = prompts.load_prompts("project")
    sel = prompts.select(ps, "qa,rag", 10)
    assert len(sel) == 10 and {p.category for p in sel} <= {"qa", "rag"}
    with pytest.raises(ConfigError, match="Unknown category"):
        prompts.select(ps, "poetry")
    with pytest.raises(ConfigError, match=">= 1"):
        prompts.select(ps, None, 0)
    with pytest.raises(ConfigError, match="No prompts selected"):
        prompts.select([], None, None)


def test_bad_records_name_their_line(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n{\"question_id\": 2}\n")
    with pytest.raises(ConfigError, match="line 2"):
        prompts.load_prompts(f)
    with pytest.raises(ConfigError, match="does not exist"):
        prompts.load_prompts(tmp_path / "none.jsonl")


@pytest.fixture
def served(tmp_path):
    """A question file served over HTTP on the loopback interface; yields (url, stop)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "question.jsonl").write_text("\n".join(json.dumps(
        {"question_id": f"q{i}", "category": "mt_bench" if i < 3 else "qa", "turns": [f"question {i}", "follow-up"]})
        for i in range(5)) + "\n")
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stopped = []

    def stop():
        if not stopped:
            server.shutdown()
            server.server_close()
            stopped.append(True)

    yield f"http://127.0.0.1:{server.server_port}/question.jsonl", stop
    stop()


def test_url_is_downloaded_once_and_then_read_from_the_cache(served, tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    url, stop = served
    first = prompts.load_prompts(url)
    assert [p.question_id for p in first] == [f"q{i}" for i in range(5)] and first[0].turns == ("question 0", "follow-up")
    stop()  # offline from here on
    again = prompts.load_prompts(url)
    assert again == first
    assert len(prompts.select(again, "mt_bench")) == 3


def test_unreachable_url_without_a_cached_copy_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("THESIS_LIB_CACHE", str(tmp_path / "cache"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match="pass its local path"):
        prompts.load_prompts(f"http://127.0.0.1:{port}/question.jsonl", timeout=2)
    assert not list((tmp_path / "cache").rglob("*.jsonl"))  # nothing half-written


def test_cli_rejects_a_bad_selection_before_loading_models(capsys):
    assert cli.main(["compare", "--prompt-file", "project", "--categories", "qa,poetry"]) == 2
    assert "Unknown category" in capsys.readouterr().err
    assert cli.main(["model-bench", "--prompt-file", "project", "--prompts", "0"]) == 2
    assert ">= 1" in capsys.readouterr().err


def test_the_thinking_switch_reaches_the_template_and_the_run_record(tok):
    """Qwen3's template thinks unless ``enable_thinking`` is false: the switch is a parameter, and the run's
    configuration records it."""
    import copy

    from thesis_lib.bench.protocol import BenchConfig

    qwen3_like = copy.deepcopy(tok)
    qwen3_like.chat_template = (tok.chat_template + "{% if add_generation_prompt and enable_thinking is not false %}"
                                "<think>{% endif %}")
    default = prompts.encode(qwen3_like, "hi")
    off = prompts.encode(qwen3_like, "hi", thinking=False)
    assert prompts.encode(qwen3_like, "hi", thinking=True) == default and len(default) > len(off)
    assert tok.decode(default).endswith("<think>") and not tok.decode(off).endswith("<think>")
    assert prompts.encode(tok, "hi", thinking=False) == prompts.encode(tok, "hi")  # a template without the switch
    assert BenchConfig(thinking=False).to_dict()["thinking"] is False
    assert "thinking" not in BenchConfig().identity()  # runs named before the switch existed keep their names
    assert BenchConfig(thinking=False).identity()["thinking"] is False
