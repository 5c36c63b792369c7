"""The tree is cut by concept: one meaning per public class name, no re-export-only
modules, no module that says it exists to keep another one short.

These checks read the source as text and syntax trees (nothing is imported), over
the library and every service folder; generated protobuf code and Alembic
migrations are left out.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("graylane", "services", "engine_worker", "policy_engine", "builder", "app", "deploy")
_SKIP_PARTS = {"v1", "migrations", "__pycache__"}


def _modules() -> list[Path]:
    found: list[Path] = []
    for name in PACKAGES:
        top = ROOT / name
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(ROOT)
            if _SKIP_PARTS.intersection(rel.parts):
                continue
            # graylane/<service> links to the top-level service folders: read each file once.
            if rel.parts[0] == "graylane" and (ROOT / rel.parts[0] / rel.parts[1]).is_symlink():
                continue
            found.append(path)
    return found


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_the_walk_sees_every_service_folder() -> None:
    seen = {p.relative_to(ROOT).parts[0] for p in MODULES}
    assert seen == set(PACKAGES)
    assert len(MODULES) > 100


def test_public_class_names_are_unique_across_the_tree() -> None:
    """Two public classes with one name are two meanings a reader has to tell apart."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in MODULES:
        for node in _tree(path).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert clashes == {}


def _is_reexport_only(module: ast.Module) -> bool:
    body = list(module.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    if not body:
        return False  # an empty package marker
    imports = 0
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports += 1
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
        return False
    return imports > 0


def _dotted(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] != "graylane":
        parts.insert(0, "graylane")  # the service folders install under graylane
    return ".".join(parts)


def _names_imported_from(package: str) -> set[str]:
    """Names that any module or test imports from ``package`` itself."""
    names: set[str] = set()
    for path in [*MODULES, *sorted((ROOT / "tests").rglob("*.py"))]:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module == package and not node.level:
                names.update(alias.name for alias in node.names)
    return names


def _pinned_packages() -> set[str]:
    """Packages whose exact ``__all__`` a test pins (``assert set(pkg.__all__) == {...}``)."""
    pinned: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = _tree(path)
        alias: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    alias[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "__all__"
                and isinstance(node.value, ast.Name)
                and node.value.id in alias
            ):
                pinned.add(alias[node.value.id])
    return pinned


def _exported(module: ast.Module) -> list[str]:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    return []


def test_no_module_only_re_exports_names_from_elsewhere() -> None:
    """A module that only re-exports is a shim. A package's ``__init__`` may name the
    package's public API: names that callers import through the package, or an API that a
    test pins exactly."""
    pinned = _pinned_packages()
    shims = []
    for path in MODULES:
        tree = _tree(path)
        if not _is_reexport_only(tree):
            continue
        if path.name != "__init__.py":
            shims.append(str(path.relative_to(ROOT)))
            continue
        if _dotted(path) in pinned:
            continue
        unused = set(_exported(tree)) - _names_imported_from(_dotted(path))
        if unused or not _exported(tree):
            shims.append(f"{path.relative_to(ROOT)}: {sorted(unused)}")
    assert shims == []


def test_the_reexport_check_can_fail() -> None:
    assert _is_reexport_only(ast.parse('"""x."""\nfrom a import b\n__all__ = ["b"]\n'))
    assert not _is_reexport_only(ast.parse("from a import b\n\ndef f() -> int:\n    return b\n"))
    assert not _is_reexport_only(ast.parse('"""A package."""\n'))


_SPLIT_FOR_SIZE = re.compile(
    r"split (?:off |out )?(?:from|of)\b.{0,60}\b(?:short|shorter|small|smaller|size|lines)"
    r"|keep (?:it|them|the module|the file|\w+\.py) (?:short|small|under)",
    re.IGNORECASE | re.DOTALL,
)


@pytest.mark.parametrize(
    "text",
    ["Split from core to keep it short.", "split off of service.py to keep the module small"],
)
def test_the_split_docstring_check_can_fail(text: str) -> None:
    assert _SPLIT_FOR_SIZE.search(text)


def test_no_module_says_it_was_split_to_stay_short() -> None:
    said = []
    for path in MODULES:
        doc = ast.get_docstring(_tree(path)) or ""
        if _SPLIT_FOR_SIZE.search(doc):
            said.append(str(path.relative_to(ROOT)))
    assert said == []
