"""The operator CLI against a real control plane and policy engine on the real broker:
``rollout status --wait`` gates a pipeline (exit 0 promoted, 1 aborted or rolled back,
2 timeout), ``-o json`` of the read commands parses and keeps its shape, and a
config file's context replaces the connection flags."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import audit_pb2, controlplane_pb2, rollout_pb2
from tests.support.policy import policy_engine, wait_ready
from tests.support.releases import BASE, CANDIDATE, register
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "cli-wait"
TOKEN = "ops-token-0123456"


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    return code, capsys.readouterr().out


async def json_of(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out = await run(capsys, *argv, "-o", "json")
    assert code == 0, out
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


def shaped_like(item: object, message: type) -> bool:
    """``item`` has every field of ``message`` without presence, and no field it lacks."""
    fields = message.DESCRIPTOR.fields  # type: ignore[attr-defined]
    always = {f.name for f in fields if not f.has_presence}
    return isinstance(item, dict) and always <= set(item) <= {f.name for f in fields}


@pytest.fixture
async def control_plane(
    settings: Settings, factory: KafkaFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ControlPlaneServer]:
    register(settings, MODEL, "gated from the CLI", servable=(BASE, CANDIDATE))
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1", port=0, tokens=TokenTable(parse_tokens(f"{TOKEN}:operator:ci"))
        ),
        factory,
    )
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    (tmp_path / "ci.token").write_text(TOKEN + "\n")
    config = tmp_path / "graylane.yaml"
    # Only the config file says where the control plane is and which token to send.
    for name in ("GRAYLANE_CP_ADDR", "GRAYLANE_CP_TOKEN", "GRAYLANE_TOKEN", "GRAYLANE_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GRAYLANE_CONFIG", str(config))
    monkeypatch.setenv("GRAYLANE_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("GRAYLANE_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("COLUMNS", "200")
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    try:
        yield server
    finally:
        await server.stop(0)


async def test_status_wait_exit_codes_json_output_and_contexts(
    control_plane: ControlPlaneServer,
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No context yet: the default address is not this control plane's.
    code, _ = await run(capsys, "config", "set-context", "nowhere", "--addr", "127.0.0.1:9")
    assert code == 0
    with pytest.raises(SystemExit, match=r"UNAVAILABLE|DEADLINE"):
        await asyncio.to_thread(main, ["model", "list"])
    code, _ = await run(
        capsys,
        "config",
        "set-context",
        "ci",
        "--addr",
        f"127.0.0.1:{control_plane.port}",
        "--token-file",
        str(tmp_path / "ci.token"),
    )
    assert code == 0
    assert (await run(capsys, "config", "use-context", "ci"))[0] == 0
    assert (await run(capsys, "config", "current-context"))[1].strip() == "ci"
    code, names = await run(capsys, "config", "get-contexts", "-o", "name")
    assert names.split() == ["nowhere", "ci"]

    models = await json_of(capsys, "model", "list")
    assert models["apiVersion"] == "graylane.v1" and models["kind"] == "ModelList"
    items = models["items"]
    assert isinstance(items, list)
    assert {m["name"] for m in items} == {MODEL}
    assert all(shaped_like(m, controlplane_pb2.ModelSummary) for m in items)
    assert {m["stable_version"] for m in items} == {BASE}
    assert await json_of(capsys, "model", "list") == models  # stable: the same bytes' meaning

    paths = {
        BASE: write_demo_gpt(tmp_path / "base.onnx", "tiny", seed=1),
        CANDIDATE: write_demo_gpt(tmp_path / "candidate.onnx", "tiny", seed=2),
    }
    log = tmp_path / "policy.log"
    async with running_stack(factory, model=MODEL, versions=paths, stable=BASE):
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)

            async def start(baseline: str, candidate: str) -> str:
                started = await json_of(
                    capsys, "rollout", "start", "--model", MODEL, "--baseline", baseline,
                    "--candidate", candidate, "--steps", "10,100", "--min-samples", "100000",
                    "--dwell-s", "600",
                )  # fmt: skip
                state = started["object"]
                assert isinstance(state, dict) and started["kind"] == "RolloutState"
                assert str(state["rollout_id"]).startswith("ro-")
                return str(state["rollout_id"])

            ids = [await start(BASE, CANDIDATE)]
            # Addressed by model: the model's active rollout.
            assert (await run(capsys, "rollout", "promote", MODEL, "--reason", "ci"))[0] == 0
            code, out = await run(capsys, "rollout", "status", MODEL, "--wait", "--timeout", "60")
            assert code == 0, out
            assert "promoted" in out

            ids.append(await start(CANDIDATE, BASE))
            assert (await run(capsys, "rollout", "abort", "--model", MODEL))[0] == 0
            code, out = await run(capsys, "rollout", "status", ids[1], "--wait", "--timeout", "60")
            assert code == 1, out
            assert "aborted" in out

            ids.append(await start(CANDIDATE, BASE))
            code, out = await run(
                capsys, "rollout", "status", MODEL, "--wait", "--timeout", "3", "-o", "json"
            )
            assert code == 2, out
            waited = json.loads(out)
            assert waited["kind"] == "RolloutState"
            assert waited["object"]["rollout_id"] == ids[2]
            assert waited["object"]["phase"] in ("PENDING", "PROGRESSING")

            rollouts = await json_of(capsys, "rollout", "list")
            assert rollouts["kind"] == "RolloutList"
            items = rollouts["items"]
            assert isinstance(items, list)
            phases = {r["rollout_id"]: r["phase"] for r in items}
            assert phases[ids[0]] == "PROMOTED" and phases[ids[1]] == "ABORTED"
            assert all(shaped_like(r, rollout_pb2.RolloutState) for r in items)
            code, names = await run(capsys, "rollout", "list", "-o", "name")
            assert names.split() == [r["rollout_id"] for r in items] and set(names.split()) == set(
                ids
            )
            got = await json_of(capsys, "rollout", "get", ids[0])
            assert got["object"] == next(r for r in items if r["rollout_id"] == ids[0])

            async def decisions() -> dict[str, object]:
                return await json_of(capsys, "audit", "log", "--model", MODEL)

            audit = await decisions()
            for _ in range(60):
                if audit["items"]:
                    break
                await asyncio.sleep(0.5)
                audit = await decisions()
            assert audit["kind"] == "AuditRecordList"
            records = audit["items"]
            assert isinstance(records, list) and records, "the promotion is on record"
            assert all(shaped_like(r, audit_pb2.AuditRecord) for r in records)
            kinds = {r["kind"] for r in records}
            assert kinds & {"DECISION_PROMOTE", "DECISION_MANUAL_COMMAND"}, kinds
            assert await decisions() == audit
