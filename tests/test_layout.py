"""The library's architecture, checked from its source: every import points down the layers
(models <- heads <- decoding <- bench <- analysis <- sweep <- book <- cli; ``errors`` and ``progress`` below all), no module reaches into
another module's private names, and a module past about 400 lines is one named idea."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "thesis_lib"
LAYERS = ("errors", "progress", "models", "heads", "decoding", "bench", "analysis", "sweep", "book", "cli")
#: Modules allowed past MAX_LINES, each one idea (none today).
LONG_MODULES: dict[str, str] = {
    "analysis/verdicts.py": "every verdict sentence the pages glue, and RULES binding each to its glued inputs",
}
MAX_LINES = 400


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> list[str]:
    parts = ["thesis_lib", *path.relative_to(SRC).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _layer(dotted: list[str]) -> str | None:
    """The layer of a ``thesis_lib...`` module path (None for the package root)."""
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
            if module[0] == "thesis_lib":
                out.extend((module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "thesis_lib":
                    out.append((alias.name.split("."), None, node.lineno))
    return out


def _target(module: list[str], name: str | None) -> list[str]:
    """The module an import binds: ``from thesis_lib.models import specs`` binds the module ``models.specs``."""
    if name and (SRC.joinpath(*module[1:], name).is_dir() or SRC.joinpath(*module[1:], f"{name}.py").is_file()):
        return module + [name]
    return module


def test_the_helpers_resolve_relative_imports(tmp_path):
    # the resolver itself must be right, or the checks below prove nothing
    found = {(".".join(m), n) for m, n, _ in imports(SRC / "bench" / "protocol.py")}
    assert ("thesis_lib.models", "loading") in found and ("thesis_lib.bench.modes", "profile_modes") in found
    assert ("thesis_lib.errors", "ConfigError") in found
    assert _target(["thesis_lib", "models"], "specs") == ["thesis_lib", "models", "specs"]
    assert _target(["thesis_lib", "models", "specs"], "DEFAULT_TARGET") == ["thesis_lib", "models", "specs"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down_the_layers(path):
    source = _layer(_dotted(path))
    if source is None:
        return  # the package root imports nothing of its own
    rank = LAYERS.index(source)
    upward = [f"line {line}: {'.'.join(_target(m, n))}" for m, n, line in imports(path)
              if _layer(_target(m, n)) is not None and LAYERS.index(_layer(_target(m, n))) > rank]
    assert not upward, f"{path.relative_to(SRC)} ({source}) imports from a higher layer: {upward}"


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
    monkeypatch.setitem(globals(), "SRC", tmp_path / "thesis_lib")
    assert _circles(_graph()) == [("thesis_lib.book.a", "thesis_lib.book.b")]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
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
    assert not bad, f"{path.relative_to(SRC)} uses private names of other modules: {bad}"


def test_long_modules_are_one_named_idea():
    lines = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    too_long = {name: n for name, n in lines.items() if n > MAX_LINES and name not in LONG_MODULES}
    assert not too_long, f"split these modules, or name the one idea each holds in LONG_MODULES: {too_long}"
    stale = [name for name in LONG_MODULES if lines.get(name, 0) <= MAX_LINES]
    assert not stale, f"no longer long (drop them from LONG_MODULES): {stale}"


def test_every_module_says_what_it_knows():
    missing = [str(p.relative_to(SRC)) for p in _modules() if ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None]
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
