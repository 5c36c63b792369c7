"""The import layering, read from the source with ``ast``.

Layers, bottom up:

- the library: ``graylane.*`` except the packages below; imports no upper layer;
- services: ``graylane.services.router``, ``graylane.services.controlplane``,
  ``graylane.engine_worker``, ``graylane.policy_engine``, ``graylane.builder``
  (an offline job) and ``graylane.deploy`` (local broker / database helpers):
  each imports the library and itself, never another service;
- the application layer ``graylane.app`` (CLI, demo, benchmarks, stack
  supervisor): the only code that may import everything.

The folders keep the design card's names at the top of the repository
(``services/``, ``engine_worker/`` ...); setuptools' ``package-dir`` map
(``pyproject.toml``) installs them as sub-packages of the one ``graylane``
distribution.
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
# Top-level folder -> the package it installs as.
MOUNTS: dict[str, str] = {folder: name for name, folder in SETUPTOOLS["package-dir"].items()}
SERVICES = (
    "graylane.services.router",
    "graylane.services.controlplane",
    "graylane.engine_worker",
    "graylane.policy_engine",
    "graylane.builder",
    "graylane.deploy",
)
APP = "graylane.app"
UPPER = (*SERVICES, APP, "graylane.services")
BARE = frozenset({*MOUNTS, "protos"})


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> str:
    """``library``, ``app`` or the service package a module belongs to."""
    if _within(module, APP):
        return "app"
    for service in SERVICES:
        if _within(module, service):
            return service
    if _within(module, "graylane.services"):
        return "graylane.services"
    return "library"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in MOUNTS:
        return ".".join([MOUNTS[parts[0]], *parts[1:]])
    return ".".join(parts)


def _source_files() -> list[Path]:
    files = [p for p in (ROOT / "graylane").rglob("*.py") if "v1" not in p.relative_to(ROOT).parts]
    for folder in MOUNTS:
        files.extend((ROOT / folder).rglob("*.py"))
    return sorted(set(files))


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """Every absolute module an import statement names (function bodies included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from graylane import services`` names a package too.
            found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
    return found


def violations() -> list[str]:
    bad: list[str] = []
    for path in _source_files():
        module = _module_name(path)
        source_layer = layer_of(module)
        for line, target in imports_of(path, module):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.split(".")[0] in BARE:
                bad.append(f"{where}: imports {target!r}; use the installed name graylane.*")
                continue
            if not _within(target, "graylane") or source_layer == "app":
                continue
            target_layer = layer_of(target)
            if target_layer in ("library", source_layer):
                continue
            if target == "graylane.services" and source_layer.startswith("graylane.services."):
                continue
            bad.append(f"{where}: {source_layer} imports {target} ({target_layer})")
    return bad


def test_library_and_services_import_only_downwards() -> None:
    assert violations() == []


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("graylane.topics", "graylane.services.router.service", False),
        ("graylane.registry.repository", "graylane.builder.spec", False),
        ("graylane.engine_worker.service", "graylane.builder.store", False),
        ("graylane.services.controlplane.service", "graylane.policy_engine.wire", False),
        ("graylane.services.controlplane.servicers", "graylane.policy_engine.wire", False),
        ("graylane.services.router.service", "graylane.routing.table", True),
        ("graylane.app.cli.main", "graylane.policy_engine.service", True),
        ("graylane.policy_engine.core", "graylane.policy_engine.logic.rollout", True),
    ],
)
def test_the_rule_itself(source: str, target: str, allowed: bool) -> None:
    """The classifier says what the docstring says (so the main test can fail)."""
    s, t = layer_of(source), layer_of(target)
    ok = s == "app" or t in ("library", s)
    assert ok is allowed


def test_a_planted_violation_is_reported(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom graylane.engine_worker import service\n")
    targets = [t for _, t in imports_of(planted, "graylane.topics")]
    assert any(layer_of(t) == "graylane.engine_worker" for t in targets)


def _tree_packages() -> set[str]:
    """Every folder holding an ``__init__.py``, named as the package map installs it."""
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "graylane").rglob("__init__.py")
    }
    for folder, name in MOUNTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    return found


def test_the_wheel_claims_only_the_graylane_namespace() -> None:
    """The distribution lists every package of the tree and no other, all under
    ``graylane``; each mapped folder is one of the design's top-level folders."""
    packages = set(SETUPTOOLS["packages"])
    assert {p.split(".")[0] for p in packages} == {"graylane"}
    missing, extra = _tree_packages() - packages, packages - _tree_packages()
    assert (missing, extra) == (set(), set()), "pyproject's [tool.setuptools] packages"
    assert set(MOUNTS) == {"services", "engine_worker", "policy_engine", "builder", "deploy", "app"}
    assert all(name == f"graylane.{folder}" for folder, name in MOUNTS.items())


def test_the_tree_holds_no_links() -> None:
    """Each file has one path: no symbolic link is committed (git mode 120000)."""
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    links = [line.split("\t", 1)[1] for line in listed if line.startswith("120000 ")]
    assert links == []


def test_the_package_map_is_what_python_imports() -> None:
    """The installed (editable) distribution imports each mapped package from its folder."""
    import importlib.util

    for folder, name in MOUNTS.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin).resolve() == (ROOT / folder / "__init__.py").resolve()
