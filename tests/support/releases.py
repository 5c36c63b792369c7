"""Rollouts driven through the control plane on the real broker, for tests: a model
registered with two versions, a control plane on a free port with the CLI pointed at
it, the CLI run in-process, Rollout documents, a webhook receiver, and the rollout
phase and stable version read back."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from graylane import serde
from graylane.app.cli.main import main
from graylane.artifacts.naming import ArtifactName, Backend, Precision, parse_semver
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.notifications.sender import SenderPolicy
from graylane.notifications.webhook import SIGNATURE_HEADER
from graylane.registry.records import ArtifactRecord, ValidationSummary
from graylane.registry.repository import open_registry
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import audit_pb2, rollout_pb2
from tests.support.waiting import wait_until

MODEL = "cli-gpt"  # registered by `register`, with these versions
BASE, CANDIDATE = "1.0.0", "1.1.0"
OPERATOR, VIEWER = "ops-token-0123456", "view-token-0123456"
"""Bearer tokens of the control plane: an operator (alice) and a read-only viewer (bob)."""


def register(
    settings: Settings,
    model: str = MODEL,
    about: str = "driven from the CLI",
    *,
    servable: tuple[str, ...] = (CANDIDATE,),
) -> None:
    """Register ``model`` with ``BASE`` stable and ``CANDIDATE``, and a servable
    artifact of each version in ``servable``."""
    registry = open_registry(settings.db_url)
    registry.register_model(model, about)
    for version in (BASE, CANDIDATE):
        registry.register_version(model, version, "a" * 64)
    registry.set_stable(model, BASE)
    for version in servable:
        name = ArtifactName(
            model, Backend.ONNXRUNTIME, "1.32.0", Precision.FP32, "ptq", parse_semver(version)
        )
        registry.add_artifact(
            ArtifactRecord(
                name=name,
                path="/artifacts/x",
                manifest_sha256="f" * 64,
                servable=True,
                validation=ValidationSummary(passed=True),
            )
        )
    registry.engine.dispose()


def demo_versions(root: Path) -> dict[str, Path]:
    """``BASE`` and ``CANDIDATE`` as the tiny demo GPT with different weights, under ``root``."""
    return {
        BASE: write_demo_gpt(root / "base.onnx", "tiny", seed=1),
        CANDIDATE: write_demo_gpt(root / "candidate.onnx", "tiny", seed=2),
    }


@contextlib.asynccontextmanager
async def control_plane(
    factory: KafkaFactory,
    monkeypatch: pytest.MonkeyPatch,
    *,
    webhooks: SenderPolicy | None = None,
    http_port: int | None = None,
    check_candidates: bool = True,
) -> AsyncIterator[ControlPlaneServer]:
    """A control plane on a free port, its sink ready; the CLI's environment (address,
    operator token, prefix, broker) points at it until it stops."""
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            tokens=TokenTable(parse_tokens(f"{OPERATOR}:operator:alice,{VIEWER}:read-only:bob")),
            webhooks=webhooks or SenderPolicy(),
            http_port=http_port,
            check_candidates=check_candidates,
        ),
        factory,
    )
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    settings = factory.settings
    for key, value in {
        "GRAYLANE_CP_ADDR": f"127.0.0.1:{server.port}",
        "GRAYLANE_CP_TOKEN": OPERATOR,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        await server.stop(0)


async def cli(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> str:
    """Run ``graylane *argv`` in-process; assert its exit code; its stdout and stderr."""
    capsys.readouterr()
    try:
        got = await asyncio.to_thread(main, list(argv))
    except SystemExit as exc:
        got = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    out = capsys.readouterr()
    assert got == code, out
    return out.out + out.err


async def assert_replays_the_same(
    capsys: pytest.CaptureFixture[str], rollout_id: str, model: str = MODEL
) -> None:
    """`graylane audit verify`: the rollout's recorded decisions replay to the same."""
    verified = await cli(
        capsys, "audit", "verify", "--model", model, "--rollout", rollout_id, "--from", "1h"
    )
    assert "the controllers decide the same" in verified, verified


def rollout_document(
    name: str,
    steps: str,
    *,
    webhooks: str = "",
    bake: str = "",
    model: str = MODEL,
    baseline: str = BASE,
    candidate: str = CANDIDATE,
) -> str:
    """A canary Rollout document; ``steps`` and ``webhooks`` are its YAML list items,
    indented to their place (no ``webhooks``: no notifications block)."""
    doc = f"""\
apiVersion: graylane.io/v1
kind: Rollout
metadata:
  name: {name}
spec:
  model: {model}
  baseline: {baseline}
  candidate: {candidate}
  strategy: canary
"""
    if bake:
        doc += f"  bake: {bake}\n"
    doc += f"  steps:\n{steps}"
    if webhooks:
        doc += f"  notifications:\n    webhooks:\n{webhooks}"
    return doc


async def phase_of(factory: KafkaFactory, rollout_id: str) -> int:
    """The phase of the rollout's latest state on the rollouts topic (0: none yet)."""
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    raw = states.get(rollout_id.encode())
    return serde.decode(rollout_pb2.RolloutState, raw).phase if raw else 0


async def until_phase(
    factory: KafkaFactory, rollout_id: str, phase: int, timeout: float = 30.0
) -> None:
    async def reached() -> bool:
        return await phase_of(factory, rollout_id) == phase

    await wait_until(reached, timeout=timeout, what=f"{rollout_id} in phase {phase}")


async def until_stored_phase(
    server: ControlPlaneServer, rollout_id: str, phase: int, timeout: float = 30.0
) -> None:
    """The control plane's store (fed from the rollouts topic by its sink) shows `phase`."""

    def stored() -> bool:
        got = server.store.get_rollout(rollout_id)
        return got is not None and got.state.phase == phase

    await wait_until(stored, timeout=timeout, what=f"control plane sees {rollout_id} in {phase}")


def audit_of(server: ControlPlaneServer, rollout_id: str) -> list[audit_pb2.AuditRecord]:
    return server.store.query_audit(rollout_id=rollout_id)


def stable_of(settings: Settings, model: str = MODEL) -> str:
    """The registry's stable version of ``model`` ("" when none)."""
    registry = open_registry(settings.db_url)
    try:
        stable = registry.get_stable(model)
        return str(stable.version) if stable is not None else ""
    finally:
        registry.engine.dispose()


async def until_stable(settings: Settings, version: str, model: str = MODEL) -> None:
    await wait_until(
        lambda: stable_of(settings, model) == version,
        timeout=30,
        poll_s=0.3,
        what=f"the registry's stable version {version}",
    )


@dataclass
class Received:
    path: str
    body: bytes
    signature: str


@dataclass
class Receiver:
    """A webhook receiver on a free local port: every POST, in arrival order."""

    port: int = 0
    seen: list[Received] = field(default_factory=list)

    def types(self, path: str) -> list[str]:
        """The transitions received at ``path`` (CloudEvents ``data``, Slack ``graylane``)."""
        docs = [json.loads(r.body) for r in self.seen if r.path == path]
        return [(d.get("data") or d["graylane"])["transition"] for d in docs]


@contextlib.contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                receiver.seen.append(
                    Received(self.path, body, self.headers.get(SIGNATURE_HEADER, ""))
                )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
