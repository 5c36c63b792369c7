"""The policy logic's public surface, and its purity (no I/O libraries imported)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import graylane.policy_engine.logic as logic

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    ROOT / "graylane" / "histogram.py",
    *sorted((ROOT / "policy_engine" / "logic").glob("*.py")),
    *(ROOT / "policy_engine" / f"{name}.py" for name in ("core", "isolation", "messages")),
]
FORBIDDEN = ("aiokafka", "kafka", "faust", "grpc", "sqlalchemy", "google.protobuf", "graylane.v1")


def test_package_reexports_nothing_and_each_module_names_its_api() -> None:
    """Callers import from the concept's module; each module lists its public API."""
    assert not hasattr(logic, "__all__")
    init = ast.parse((ROOT / "policy_engine" / "logic" / "__init__.py").read_text())
    assert [type(n).__name__ for n in init.body[1:]] == []  # the docstring alone
    for path in PURE[1:]:
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        names = {
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        assert "__all__" in names, path.name


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_module_all_resolves(path: Path) -> None:
    rel = path.relative_to(ROOT).with_suffix("")
    module = importlib.import_module(".".join(rel.parts))
    for name in getattr(module, "__all__", ()):
        assert hasattr(module, name), f"{rel}: {name}"


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_pure_modules_import_no_io_library(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    for name in imported:
        assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), name


def test_importing_the_logic_loads_no_io_library() -> None:
    code = (
        "import sys, graylane.policy_engine.logic\n"
        "roots = ('google', 'aiokafka', 'kafka', 'faust', 'grpc', 'sqlalchemy')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in roots"
        " or m.startswith('graylane.v1')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
