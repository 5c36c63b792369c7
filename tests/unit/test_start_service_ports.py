"""Each service process the demo or the supervisor starts gets its own metrics port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graylane.app.cli import demo, local_prometheus


class _Popen:
    envs: list[dict[str, str]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.envs.append(kwargs["env"])


def test_an_inherited_metrics_port_is_never_handed_to_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A supervisor runs with its own port in the environment; its workers must not bind it.
    monkeypatch.setenv("GRAYLANE_METRICS_PORT", "45999")
    monkeypatch.setattr(demo.subprocess, "Popen", _Popen)
    monkeypatch.setattr(local_prometheus, "announce", lambda *a: None)
    services = [demo.start_service(f"w{i}", ["worker"], tmp_path) for i in range(3)]
    ports = [int(env["GRAYLANE_METRICS_PORT"]) for env in _Popen.envs]
    assert len(set(ports)) == 3 and 45999 not in ports
    assert [s.metrics_port for s in services] == ports
    explicit = demo.start_service("x", ["worker"], tmp_path, {"GRAYLANE_METRICS_PORT": "-1"})
    assert _Popen.envs[-1]["GRAYLANE_METRICS_PORT"] == "-1" and explicit.metrics_port == -1
