"""The tree is cut by concept: one meaning per public class name, no re-export-only
modules, no module that says it exists to keep another one short.

These checks read the source as text and syntax trees (nothing is imported), over
the library and every service folder; generated protobuf code and Alembic
migrations are left out.
"""

from __future__ import annotations

import ast
import re
import tomllib
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


FACADES = {
    "graylane/__init__.py": "the SDK's front door: from graylane import GraylaneClient, Settings",
}
"""The modules whose ``__all__`` may name what they import, and why."""


def _imported_names(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_no_module_passes_on_names_it_imports() -> None:
    """A name is imported from the module that defines it: no ``__all__`` (a package's
    ``__init__`` included) lists a name the module itself imports, but the facades above."""
    passed_on = {}
    for path in MODULES:
        rel = str(path.relative_to(ROOT))
        tree = _tree(path)
        names = sorted(set(_exported(tree)) & _imported_names(tree))
        if names and rel not in FACADES:
            passed_on[rel] = names
    assert passed_on == {}
    planted = ast.parse('from a import b\n\ndef c() -> None: ...\n__all__ = ["b", "c"]\n')
    assert set(_exported(planted)) & _imported_names(planted) == {"b"}


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


def _imported_modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


KAFKA_LAYER = {
    "backoff": set(),
    "membership": set(),
    "fault": {"recovering"},
    "guard": {"backoff", "fault", "membership", "seam"},
    "delivery": {"fault", "guard", "seam"},
    "in_flight": {"delivery", "seam"},
    "consume_loop": {"backoff", "delivery", "fault", "guard", "in_flight", "membership", "seam"},
}
"""The consume loop's concepts, one module each, and which of them each may import: the
loop on top, its bookkeeping below it, no cycle."""


def test_the_kafka_layer_holds_one_concept_per_module() -> None:
    folder = ROOT / "graylane" / "kafka"
    assert not (folder / "loop.py").exists(), "the seven-concept loop.py is split"
    for name, allowed in KAFKA_LAYER.items():
        tree = _tree(folder / f"{name}.py")
        siblings = {
            m.split(".")[2]
            for m in _imported_modules(tree)
            if m.startswith("graylane.kafka.") and m.count(".") >= 2
        }
        assert siblings <= allowed, f"graylane/kafka/{name}.py imports {siblings - allowed}"
    # nothing anywhere names the old module
    for path in [*MODULES, *sorted((ROOT / "tests").rglob("*.py"))]:
        assert "graylane.kafka.loop" not in _imported_modules(_tree(path)), path


WORKER = ROOT / "engine_worker"
WORKER_EDGE = {"outbox.py"}
"""The worker's modules that may import its wire (protobuf out): the outbox alone."""


def test_the_workers_wire_sits_at_the_edge() -> None:
    """``wire`` depends on the worker's domain, never the reverse: only the outbox maps
    answers onto the wire, and nothing ``wire`` imports imports it back."""
    importers = []
    for path in sorted(WORKER.rglob("*.py")):
        modules = _imported_modules(_tree(path))
        if "graylane.engine_worker.wire" in modules and path.name != "wire.py":
            importers.append(path.name)
    assert set(importers) <= WORKER_EDGE, importers


def test_the_workers_logic_is_pure() -> None:
    """``engine_worker/logic``: no Kafka, HTTP, protobuf, engine runtime, clock or I/O
    module of the worker."""
    banned = ("aiokafka", "httpx", "grpc", "onnxruntime", "tensorrt", "graylane.v1", "time")
    for path in sorted((WORKER / "logic").rglob("*.py")):
        for module in _imported_modules(_tree(path)):
            assert not any(module == b or module.startswith(b + ".") for b in banned), (
                f"{path.relative_to(ROOT)} imports {module}"
            )
            if module.startswith("graylane.engine_worker."):
                assert module.startswith(
                    ("graylane.engine_worker.logic", "graylane.engine_worker.logic.sampling")
                ), f"{path.relative_to(ROOT)} imports {module}"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def test_benchmark_dependencies_stay_out_of_the_runtime() -> None:
    """``confluent-kafka`` serves the benchmarks only: it is the ``bench`` extra (which
    ``dev`` includes), and no module outside ``app/bench`` imports it, nor one inside at
    import time (``graylane bench`` imports it when a benchmark runs)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    bench = {_requirement_name(r) for r in extras["bench"]}
    assert "confluent-kafka" in bench
    assert not runtime & bench, runtime & bench
    assert "graylane[bench]" in extras["dev"]
    for path in MODULES:
        tree = _tree(path)
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        at_top = _imported_modules(ast.Module(body=top, type_ignores=[]))
        anywhere = _imported_modules(tree)
        uses = any(m.split(".")[0] == "confluent_kafka" for m in anywhere)
        if not uses:
            continue
        rel = path.relative_to(ROOT)
        assert rel.parts[:2] == ("app", "bench"), f"{rel} imports confluent_kafka"
        assert not any(m.split(".")[0] == "confluent_kafka" for m in at_top), (
            f"{rel} imports confluent_kafka at import time"
        )


SERVICE_PACKAGES = {
    "router": ROOT / "services" / "router",
    "gateway": ROOT / "services" / "gateway",
    "controlplane": ROOT / "services" / "controlplane",
    "engine_worker": ROOT / "engine_worker",
    "policy_engine": ROOT / "policy_engine",
}
ROOMS = ("service.py", "wire.py", "state.py", "logic/__init__.py")
IO_MODULES = (
    "aiokafka",
    "faust",
    "grpc",
    "grpc_health",
    "sqlalchemy",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "onnxruntime",
    "tensorrt",
    "google.protobuf",
    "graylane.v1",
    "graylane.kafka",
)
"""What a ``logic/`` module never imports: Kafka, gRPC, SQL, HTTP, protobuf, engines."""


def _package_of(folder: Path) -> str:
    return _dotted(folder / "__init__.py")


@pytest.mark.parametrize("name", sorted(SERVICE_PACKAGES))
def test_every_service_package_has_the_same_rooms(name: str) -> None:
    """``service.py`` (lifecycle, the loop's hooks), ``wire.py`` (protobuf and HTTP JSON),
    ``state.py`` (what it owns) and ``logic/`` (pure decisions), in every service."""
    folder = SERVICE_PACKAGES[name]
    missing = [room for room in ROOMS if not (folder / room).is_file()]
    assert missing == [], f"{name} lacks {missing}"
    modules = sorted((folder / "logic").glob("*.py"))
    assert [m for m in modules if m.name != "__init__.py"], f"{name}/logic/ holds no decision"
    assert ast.get_docstring(_tree(folder / "logic" / "__init__.py")), "a room says what it is"


@pytest.mark.parametrize("name", sorted(SERVICE_PACKAGES))
def test_logic_is_pure_and_state_knows_no_adapter(name: str) -> None:
    """``logic/`` imports no I/O library and nothing of its service's other rooms;
    ``state.py`` imports neither the service nor the wire."""
    folder = SERVICE_PACKAGES[name]
    package = _package_of(folder)
    adapters = {f"{package}.service", f"{package}.wire", f"{package}.state"}
    bad = []
    for path in sorted((folder / "logic").rglob("*.py")):
        for module in _imported_modules(_tree(path)):
            if any(module == m or module.startswith(m + ".") for m in IO_MODULES):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
            if any(module == a or module.startswith(a + ".") for a in adapters):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    state = _imported_modules(_tree(folder / "state.py"))
    bad += [f"{name}/state.py imports {m}" for m in state if m in adapters - {f"{package}.state"}]
    assert bad == []


def test_the_rooms_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "logic.py"
    planted.write_text("from graylane.v1 import inference_pb2\nimport aiokafka\n")
    found = _imported_modules(_tree(planted))
    assert any(m.startswith("graylane.v1") for m in found) and "aiokafka" in found


def test_every_package_names_its_room() -> None:
    """Each package's docstring says which room of the house it is and what it may import
    (``ARCHITECTURE.md`` draws the house)."""
    silent = [
        str(path.relative_to(ROOT))
        for path in MODULES
        if path.name == "__init__.py" and "Room:" not in (ast.get_docstring(_tree(path)) or "")
    ]
    assert silent == []
    assert (ROOT / "ARCHITECTURE.md").is_file()
