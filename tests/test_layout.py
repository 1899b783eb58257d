"""The library's architecture, checked from its source: every import of the core (``thesis_lib``) points down its
layers (models <- heads <- decoding <- bench <- analysis <- sweep <- book <- cli; ``errors``, ``progress`` and
``extensions`` below all), the studies (``thesis_studies``) sit above the whole core and the core never imports them,
no module reaches into another module's private names, a module past about 400 lines is one named idea, and the
core and the studies stay within their line budgets."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src"
SRC = ROOT / "thesis_lib"
STUDIES = ROOT / "thesis_studies"
PACKAGES = ("thesis_lib", "thesis_studies")
LAYERS = ("errors", "progress", "extensions", "models", "heads", "decoding", "bench", "analysis", "sweep", "book", "cli",
          "studies")
#: Code lines (no blank line, comment or docstring: :func:`code_lines`) the core may hold, and core and studies together.
CORE_BUDGET, TOTAL_BUDGET = 10_000, 15_479
#: Modules allowed past MAX_LINES, each one idea (none today).
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 400


def _modules(*packages: Path) -> list[Path]:
    return sorted(p for pkg in packages or (SRC, STUDIES) for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _layer(dotted: list[str]) -> str | None:
    """The layer of a module path: ``studies`` for any study, the core's subpackage for ``thesis_lib...`` (None for
    the core's package root)."""
    if dotted[0] == "thesis_studies":
        return "studies"
    return dotted[1] if len(dotted) > 1 else None


def imports(path: Path) -> list[tuple[list[str], str | None, int]]:
    """``(module, name, line)`` for every import of this library in a file, relative imports resolved; ``name`` is
    the imported name of a ``from`` import (which may itself be a module)."""
    here = _dotted(path)
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = base + (node.module.split(".") if node.module else [])
            else:
                module = (node.module or "").split(".")
            if module[0] in PACKAGES:
                out.extend((module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    out.append((alias.name.split("."), None, node.lineno))
    return out


def _target(module: list[str], name: str | None) -> list[str]:
    """The module an import binds: ``from thesis_lib.models import specs`` binds the module ``models.specs``."""
    if name and (ROOT.joinpath(*module, name).is_dir() or ROOT.joinpath(*module, f"{name}.py").is_file()):
        return module + [name]
    return module


def test_the_helpers_resolve_relative_imports(tmp_path):
    # the resolver itself must be right, or the checks below prove nothing
    found = {(".".join(m), n) for m, n, _ in imports(SRC / "bench" / "protocol.py")}
    assert ("thesis_lib.models", "loading") in found and ("thesis_lib.bench.modes", "profile_modes") in found
    assert ("thesis_lib.errors", "ConfigError") in found
    assert _target(["thesis_lib", "models"], "specs") == ["thesis_lib", "models", "specs"]
    assert _target(["thesis_lib", "models", "specs"], "DEFAULT_TARGET") == ["thesis_lib", "models", "specs"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_layers(path):
    source = _layer(_dotted(path))
    if source is None:
        return  # the package root imports nothing of its own
    rank = LAYERS.index(source)
    upward = [f"line {line}: {'.'.join(_target(m, n))}" for m, n, line in imports(path)
              if _layer(_target(m, n)) is not None and LAYERS.index(_layer(_target(m, n))) > rank]
    assert not upward, f"{path.relative_to(ROOT)} ({source}) imports from a higher layer: {upward}"


def _graph() -> dict[str, set[str]]:
    """Module -> the library's modules it imports (at its top or inside a function)."""
    return {".".join(_dotted(p)): {".".join(_target(m, n)) for m, n, _ in imports(p)} - {".".join(_dotted(p))}
            for p in _modules()}


def _circles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The pairs of modules that import each other (a package and its own submodules aside), each once."""
    return sorted((a, b) for a, deps in graph.items() for b in deps
                  if a < b and a in graph.get(b, ()) and not (a.startswith(b + ".") or b.startswith(a + ".")))


def test_no_two_modules_import_each_other():
    """No import circle of two files: each pair's lower part should not need the higher."""
    assert not _circles(_graph()), _circles(_graph())


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    """The check above finds a circle where there is one (two modules importing each other, one inside a function),
    and none between a package and its submodule."""
    pkg = tmp_path / "thesis_lib" / "book"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import x\nfrom .. import book\n")
    (pkg / "b.py").write_text("def x():\n    from . import a\n")
    (tmp_path / "thesis_studies").mkdir()
    for name, value in (("ROOT", tmp_path), ("SRC", tmp_path / "thesis_lib"), ("STUDIES", tmp_path / "thesis_studies")):
        monkeypatch.setitem(globals(), name, value)
    assert _circles(_graph()) == [("thesis_lib.book.a", "thesis_lib.book.b")]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_modules_private_names(path):
    here = _dotted(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad, aliases = [], {}
    for module, name, line in imports(path):
        target = _target(module, name)
        if name and name.startswith("_") and target != here:
            bad.append(f"line {line}: from {'.'.join(module)} import {name}")
        if name and target == module + [name]:  # a module bound to a name: watch its attribute reads
            aliases[name] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.asname and alias.name in aliases:
                    aliases[alias.asname] = aliases[alias.name]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, f"{path.relative_to(ROOT)} uses private names of other modules: {bad}"


def test_long_modules_are_one_named_idea():
    lines = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules(SRC)}
    lines |= {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules(STUDIES)}
    too_long = {name: n for name, n in lines.items() if n > MAX_LINES and name not in LONG_MODULES}
    assert not too_long, f"split these modules, or name the one idea each holds in LONG_MODULES: {too_long}"
    stale = [name for name in LONG_MODULES if lines.get(name, 0) <= MAX_LINES]
    assert not stale, f"no longer long (drop them from LONG_MODULES): {stale}"


def test_every_module_says_what_it_knows():
    missing = [str(p.relative_to(ROOT)) for p in _modules() if ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None]
    assert not missing, f"modules without a docstring: {missing}"


def test_importing_the_library_does_not_import_the_compiler():
    """Every module of the library imports without torch's compiler stack (dynamo: about 1.7 s of every notebook
    kernel's, command's and spawned worker's start-up); it is loaded by the first ``torch.compile``."""
    import subprocess
    import sys

    names = [".".join(_dotted(p)) for p in _modules()]
    names = [n for n in names if not n.endswith("triton_kernels")]  # imports Triton itself; loaded on a GPU only
    code = "import importlib, sys\nfor n in %r: importlib.import_module(n)\nprint('torch._dynamo' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code % names], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: not blank, not only a comment, not part of a docstring (of the module,
    a class or a function)."""
    import io
    import tokenize

    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    code = {line for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type not in skip
            for line in range(tok.start[0], tok.end[0] + 1)}
    return len(code - docs)


def test_code_lines_counts_code_and_nothing_else():
    source = ('"""A module\n\nover three lines."""\n\n# a comment\nimport os\n\n\nclass A:\n    """One."""\n\n'
              '    def f(self, x):  # trailing\n        """Two\n        lines."""\n        return (x +\n                1)\n'
              '\n\nTEXT = """not a docstring:\ncode"""\n')
    assert code_lines(source) == 7  # import, class, def, return over 2 lines, TEXT over 2 lines


def test_the_core_and_the_studies_stay_within_their_line_budgets():
    core = sum(code_lines(p.read_text(encoding="utf-8")) for p in _modules(SRC))
    studies = sum(code_lines(p.read_text(encoding="utf-8")) for p in _modules(STUDIES))
    assert core <= CORE_BUDGET, f"the core holds {core} code lines, over its {CORE_BUDGET}"
    assert core + studies <= TOTAL_BUDGET, f"core and studies hold {core + studies} code lines, over {TOTAL_BUDGET}"


def _core_imports_of_studies() -> list[str]:
    return [f"{p.relative_to(ROOT)} line {line}: {'.'.join(m)}" for p in _modules(SRC)
            for m, _, line in imports(p) if m[0] == "thesis_studies"]


def test_the_core_never_imports_a_study():
    """The studies import the core and plug into it (:mod:`thesis_lib.extensions`); the core names none of them."""
    assert not _core_imports_of_studies(), _core_imports_of_studies()


def test_the_boundary_check_sees_a_crossing(tmp_path, monkeypatch):
    """The check above finds a core module that imports a study (inside a function too), and lets a study import the
    core."""
    (tmp_path / "thesis_lib" / "book").mkdir(parents=True)
    (tmp_path / "thesis_lib" / "book" / "x.py").write_text("def f():\n    from thesis_studies.trees import tables\n")
    (tmp_path / "thesis_studies").mkdir()
    (tmp_path / "thesis_studies" / "y.py").write_text("from thesis_lib.book import x\n")
    for name, value in (("ROOT", tmp_path), ("SRC", tmp_path / "thesis_lib"), ("STUDIES", tmp_path / "thesis_studies")):
        monkeypatch.setitem(globals(), name, value)
    assert _core_imports_of_studies() == ["thesis_lib/book/x.py line 2: thesis_studies.trees"]


def test_reading_any_registry_first_loads_the_studies_and_nothing_else_does():
    """In a fresh interpreter the core imports no study; the first read of a registry imports every declared one
    (here the tree study's loop is then registered), and no core module calls ``extensions.load()`` itself."""
    import subprocess
    import sys

    code = ("import sys\nfrom thesis_lib import extensions\nfrom thesis_lib.bench import runner, modes\n"
            "print('thesis_studies' in sys.modules)\nloops = extensions.LOOPS\n"
            "print('thesis_studies' in sys.modules, 'tree' in loops)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True", "True"]
    calls = [f"{p.relative_to(ROOT)}" for p in _modules(SRC) if p.name != "extensions.py"
             and "extensions.load(" in p.read_text(encoding="utf-8")]
    assert not calls, calls


def test_a_study_that_fails_to_import_fails_every_read(monkeypatch):
    """A broken study is not half-registered and forgotten: each read of a registry tries it again and raises."""
    from thesis_lib import extensions

    class Broken:
        def load(self):
            raise ImportError("the study is broken")

    monkeypatch.setattr(extensions, "_state", "new")
    monkeypatch.setattr(extensions, "entry_points", lambda group: [Broken()])
    for _ in range(2):
        with pytest.raises(ImportError, match="the study is broken"):
            extensions.MODES
        assert extensions._state == "new"
    with pytest.raises(AttributeError, match="no attribute 'NOT_A_REGISTRY'"):
        extensions.NOT_A_REGISTRY


def test_a_second_thread_s_first_read_waits_for_the_studies_it_would_miss(monkeypatch):
    """While one thread imports the studies, another thread's first read waits and then sees what they registered
    (not the registry half filled)."""
    import threading
    import time

    from thesis_lib import extensions

    started = threading.Event()

    class Slow:
        def load(self):
            started.set()
            time.sleep(1.0)
            extensions._REGISTRIES["MODES"].append("late")

    monkeypatch.setattr(extensions, "_state", "new")
    monkeypatch.setattr(extensions, "entry_points", lambda group: [Slow()])
    monkeypatch.setitem(extensions._REGISTRIES, "MODES", [])
    first = threading.Thread(target=lambda: extensions.MODES)
    first.start()
    assert started.wait(10)
    seen = list(extensions.MODES)
    first.join()
    assert seen == ["late"]
