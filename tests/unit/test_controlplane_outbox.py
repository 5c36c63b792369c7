"""The outbox never publishes a command twice while a request is publishing it (SQLite store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from graylane.registry.repository import open_registry
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import ApiRole, Principal, TokenTable
from graylane.services.controlplane.servicers import ControlPlane
from graylane.services.controlplane.state import open_store
from graylane.v1 import rollout_pb2


class SlowBus:
    """Publishes after a pause, long enough for the outbox to run in between."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.started = asyncio.Event()

    async def publish(self, command: rollout_pb2.RolloutCommand) -> None:
        self.started.set()
        await asyncio.sleep(0.2)
        self.published.append(command.command_id)


def _plane(tmp_path: Path, bus: SlowBus) -> ControlPlane:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    return ControlPlane(
        registry=open_registry(url),
        store=open_store(url),
        bus=bus,
        hub=RolloutHub(),
        tokens=TokenTable({"t": Principal("ops", ApiRole.OPERATOR)}),
    )


def _command(command_id: str) -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(
        command_id=command_id,
        rollout_id="ro-m-1",
        model="m",
        kind=rollout_pb2.COMMAND_PAUSE,
        issued_at_unix_ms=1,
    )


async def test_a_command_in_flight_is_not_resent(tmp_path: Path) -> None:
    bus = SlowBus()
    cp = _plane(tmp_path, bus)
    command = _command("c-1")
    cp.store.add_command(command)
    request = asyncio.create_task(cp.send(command))
    await bus.started.wait()
    resent = await cp.resend_unsent()
    assert await request is True
    assert (resent, bus.published) == (0, ["c-1"])
    assert cp.store.unsent_commands() == []


async def test_the_outbox_sends_what_was_left_unsent(tmp_path: Path) -> None:
    bus = SlowBus()
    cp = _plane(tmp_path, bus)
    cp.store.add_command(_command("c-1"))
    cp.store.add_command(_command("c-2"))
    assert await cp.resend_unsent() == 2
    assert await cp.resend_unsent() == 0
    assert bus.published == ["c-1", "c-2"]
    assert await cp.send(_command("c-1")) is False
    assert bus.published == ["c-1", "c-2"]
