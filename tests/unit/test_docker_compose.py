"""docker-compose.yml cannot run here (no Docker engine); check it statically."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from graylane.app.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, object]] = COMPOSE["services"]


def _depends(service: dict[str, object]) -> list[str]:
    deps = service.get("depends_on") or {}
    return list(deps) if isinstance(deps, dict | list) else []


def test_kafka_is_the_official_image_in_kraft_mode() -> None:
    kafka = SERVICES["kafka"]
    assert str(kafka["image"]).startswith("apache/kafka:4.")
    env = kafka["environment"]
    assert isinstance(env, dict)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_dependencies_exist_and_have_no_cycle() -> None:
    for name, service in SERVICES.items():
        for dep in _depends(service):
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"dependency cycle through {name}"
        if name in done:
            return
        visiting.add(name)
        for dep in _depends(SERVICES[name]):
            visit(dep)
        visiting.discard(name)
        done.add(name)

    for name in SERVICES:
        visit(name)


def test_every_graylane_service_reaches_kafka() -> None:
    def reaches(name: str) -> bool:
        return name == "kafka" or any(reaches(d) for d in _depends(SERVICES[name]))

    for name, service in SERVICES.items():
        if name in ("kafka", "model"):
            continue
        assert reaches(name), f"{name} does not wait for kafka"
        env = service["environment"]
        assert isinstance(env, dict) and env["GRAYLANE_BOOTSTRAP_SERVERS"] == "kafka:9092"


@pytest.mark.parametrize("name", [n for n in SERVICES if n != "kafka"])
def test_every_service_command_exists_in_the_project(name: str) -> None:
    command = SERVICES[name]["command"]
    assert isinstance(command, list) and command[0] == "graylane"
    args = build_parser().parse_args(command[1:])  # exits (fails) on an unknown command
    assert callable(args.handler)


def test_the_image_is_built_from_the_project() -> None:
    dockerfile = ROOT / "deploy" / "docker" / "Dockerfile"
    assert dockerfile.exists()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and not line.split()[1].startswith("--from="):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
