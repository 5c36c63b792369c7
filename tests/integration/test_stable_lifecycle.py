"""Stable version lifecycle and cohort routing from the CLI, on the real broker.

Control plane (gRPC + audit sink), the policy engine process and the CLI; no
workers are needed, since every step here is an operator command: a rule
``tenant=internal -> candidate`` set before the rollout stays in every table;
a refused START ends ABORTED instead of blocking the model; a promotion moves
the registry's stable version; ``rollout revert`` returns 100 % to the
previous stable in one routing update, audited, after a promotion and during
a rollout.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.registry.repository import open_registry
from graylane.rollouts.pb import rollout_spec_to_pb
from graylane.rollouts.spec import RolloutSpec
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import control_pb2, rollout_pb2
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "life-gpt"
OLD, NEW = "1.0.0", "1.1.0"


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert await asyncio.to_thread(main, list(argv)) == 0
    return capsys.readouterr().out


def rules(table: control_pb2.RoutingTable) -> list[tuple[str, str]]:
    return [(r.name, r.version) for r in table.rules]


def only(table: control_pb2.RoutingTable, version: str) -> bool:
    live = [(r.version, r.weight_percent) for r in table.routes if r.weight_percent > 0]
    return table.stable_version == version and live == [(version, 100.0)]


async def test_promotion_moves_the_stable_version_and_revert_returns_to_it(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = open_registry(settings.db_url)
    registry.register_model(MODEL)
    for version in (OLD, NEW):  # as the builder does
        registry.register_version(MODEL, version, "a" * 64)
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            tokens=TokenTable(parse_tokens("ops-token-0123456:operator:alice")),
            check_candidates=False,  # no workers here: the rollout is steered by hand
        ),
        factory,
    )
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    for key, value in {
        "GRAYLANE_CP_ADDR": f"127.0.0.1:{server.port}",
        "GRAYLANE_CP_TOKEN": "ops-token-0123456",
        "COLUMNS": "200",
    }.items():
        monkeypatch.setenv(key, value)
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))

    def stable() -> str:
        got = registry.get_stable(MODEL)
        return str(got.version) if got else ""

    try:
        # a version the builder registered can be made stable (was ALREADY_EXISTS)
        out = await cli(capsys, "model", "register", MODEL, "--version", OLD, "--stable")
        assert "was registered already" in out and stable() == OLD
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with RoutingWatch(factory, MODEL) as routing:
                # -- cohort rule before any rollout: a table with the rule
                await cli(
                    capsys, "route", "rule", "add", "--model", MODEL, "--name", "internal",
                    "--match", "tenant=internal", "--version", NEW,
                )  # fmt: skip
                _, first = await routing.until(lambda t: rules(t) == [("internal", NEW)], 30)
                assert only(first, OLD)
                listed = await cli(capsys, "route", "rule", "list", "--model", MODEL)
                assert "internal" in listed and "tenant=internal" in listed

                # -- a rollout keeps the rule in its tables
                out = await cli(
                    capsys, "rollout", "start", "--model", MODEL, "--candidate", NEW,
                    "--steps", "10,100",
                )  # fmt: skip
                match = re.search(r"ro-[\w.:-]+", out)
                assert match, out
                rollout_id = match.group(0)
                _, canary = await routing.until(lambda t: routing.weight(t, NEW) == 10.0, 30)
                assert rules(canary) == [("internal", NEW)] and canary.epoch > first.epoch

                # -- a START the engine refuses ends ABORTED with its reason
                refused_id = f"ro-{MODEL}-refused-{uuid.uuid4().hex[:6]}"
                spec = rollout_spec_to_pb(
                    RolloutSpec(rollout_id=refused_id, model=MODEL, baseline=OLD, candidate=NEW)
                )
                state = rollout_pb2.RolloutState(
                    rollout_id=refused_id, model=MODEL, phase=rollout_pb2.PENDING, spec=spec
                )
                start = rollout_pb2.RolloutCommand(
                    command_id=uuid.uuid4().hex,
                    rollout_id=refused_id,
                    model=MODEL,
                    kind=rollout_pb2.COMMAND_START,
                    spec=spec,
                    issued_at_unix_ms=1,
                )
                server.store.create_rollout(state, start)
                await server.control.send(start)

                def ended() -> bool:
                    got = server.store.get_rollout(refused_id)
                    return got is not None and got.state.phase == rollout_pb2.ABORTED

                await wait_until(ended, timeout=30, what="the refused START ends ABORTED")
                got = server.store.get_rollout(refused_id)
                assert got is not None and "already has the active rollout" in (
                    got.state.last_reason
                )
                active = server.store.active_rollout(MODEL)
                assert active is not None and active.state.rollout_id == rollout_id

                # -- promotion: routing, registry and store agree on the new stable
                await cli(capsys, "rollout", "promote", rollout_id)
                _, promoted = await routing.until(lambda t: only(t, NEW), 30)
                assert rules(promoted) == [("internal", NEW)]
                await wait_until(lambda: stable() == NEW, timeout=30, what="registry stable")
                shown = await cli(capsys, "model", "list")
                assert NEW in shown

                # -- revert after the promotion: one table, 100 % to the previous stable
                out = await cli(capsys, "rollout", "revert", "--model", MODEL)
                assert f"to {OLD}" in out
                _, back = await routing.until(lambda t: t.epoch > promoted.epoch, 30)
                assert only(back, OLD) and rules(back) == [("internal", NEW)]
                assert stable() == OLD

                def audited() -> bool:
                    found = server.store.query_audit(model=MODEL, limit=1000)
                    return any(r.rule == "stable_reverted" for r in found)

                await wait_until(audited, timeout=30, what="the revert on record")

                # -- revert during a rollout: its rollback, in one update
                out = await cli(
                    capsys, "rollout", "start", "--model", MODEL, "--candidate", NEW,
                    "--steps", "25,100",
                )  # fmt: skip
                match = re.search(r"ro-[\w.:-]+", out)
                assert match, out
                second = match.group(0)
                _, canary2 = await routing.until(lambda t: routing.weight(t, NEW) == 25.0, 30)
                out = await cli(capsys, "rollout", "revert", "--model", MODEL)
                assert second in out
                _, back2 = await routing.until(lambda t: t.epoch > canary2.epoch, 30)
                assert routing.weight(back2, NEW) == 0.0 and back2.stable_version == OLD

                def rolled_back() -> bool:
                    got = server.store.get_rollout(second)
                    return got is not None and got.state.phase == rollout_pb2.ROLLED_BACK

                await wait_until(rolled_back, timeout=30, what="the rollout rolled back")
                assert stable() == OLD
    finally:
        await server.stop(0)
        registry.engine.dispose()
