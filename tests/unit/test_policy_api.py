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
]
FORBIDDEN = ("aiokafka", "kafka", "faust", "grpc", "sqlalchemy", "google.protobuf", "graylane.v1")


def test_package_exports_exactly_its_public_api() -> None:
    assert set(logic.__all__) == {
        "TRANSITIONS", "AgreementStats", "AgreementTracker", "Decision", "DecisionKind",
        "Gates", "InputMismatch", "InvalidPolicy", "InvalidSpec", "InvalidTransition", "Lane",
        "ManualCommand", "Phase", "PolicyError", "QosDecision", "QosDecisionKind", "QosPolicy",
        "QosState", "RolloutFinished", "RolloutSpec", "RolloutState", "RoutingIntent",
        "RoutingPlan", "ShadowOutput", "SlidingWindow", "Step", "Strategy", "TelemetrySample",
        "VersionWeight", "WindowKey", "WindowStats", "apply_command", "diff", "evaluate",
        "evaluate_qos", "initial_qos_state", "pending_state", "plan_for", "qos_during_rollout",
        "replay", "replay_qos", "start", "weights_for",
    }  # fmt: skip
    for name in logic.__all__:
        assert hasattr(logic, name), name


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
