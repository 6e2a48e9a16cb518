"""Layers point down (docs/design.md): config < estimators, losses, io < tasks, models < train, probes <
app (__main__, validation, tune, callbacks, experiments) < analysis. Nothing imports upward,
imports inside functions included; harness never imports analysis; analysis never launches
training.

The contracts are ``.importlinter`` at the repository root, checked by import-linter's
``lint-imports`` (the ``test`` extra installs it). The AST checks below hold the rules that need
no layer table (the schema imports no harness module, harness never imports analysis, analysis
starts no processes and imports nothing that trains), so they run even without import-linter.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imports_of(path: Path, root: Path = REPO) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth (functions included)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # ``from pkg import module``
    return out


def modules(package: str) -> dict[str, set[str]]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts): imports_of(p)
            for p in sorted((REPO / package).rglob("*.py"))}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_import_linter_contracts_are_kept():
    pytest.importorskip("importlinter", reason="import-linter not installed (test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout


def test_the_schema_imports_nothing_from_the_harness():
    assert not [m for m in imports_of(REPO / "harness" / "config.py") if under(m, "harness")]


def test_harness_never_imports_analysis():
    bad = [f"{mod} -> {m}" for mod, ims in modules("harness").items() for m in ims if under(m, "analysis")]
    assert not bad, bad


def test_analysis_never_launches_training():
    """analysis's library reads results; the one exception is its command line's ``claims --run``,
    which hands the missing claim experiments to harness.experiments.run (as .importlinter says)."""
    launching = ("subprocess", "multiprocessing", "harness.app", "harness.__main__", "harness.train",
                 "harness.experiments.run", "harness.experiments.__main__")
    allowed = {("analysis.cli", "harness.experiments.run")}
    found = [(mod, m) for mod, ims in modules("analysis").items() for m in ims if any(under(m, x) for x in launching)]
    bad = [f"{mod} -> {m}" for mod, m in found if not any(mod == a and under(m, b) for a, b in allowed)]
    assert not bad, bad
    assert any(mod == "analysis.cli" for mod, _ in found)  # the reader sees the exception it allows


def test_the_ast_reader_sees_imports_inside_functions(tmp_path):
    # function-local imports hid the old cycle (app -> config -> probes -> train.control -> app):
    # the reader must see them, or the checks above prove nothing
    (tmp_path / "harness" / "probes").mkdir(parents=True)
    src = tmp_path / "harness" / "probes" / "x.py"
    src.write_text("import os\n\ndef f():\n    from ..app import run\n    import analysis.stats\n"
                   "    from . import toy\n")
    assert imports_of(src, tmp_path) >= {"os", "harness.app", "harness.app.run", "analysis.stats", "harness.probes.toy"}
