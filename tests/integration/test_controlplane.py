"""The control plane's gRPC API against a real in-process server, SQLite store and real Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
import yaml
from grpc import aio

from graylane.artifacts.naming import ArtifactName, Backend, Precision, parse_semver
from graylane.clock import now_ms
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.registry.records import ArtifactRecord, ValidationSummary
from graylane.registry.repository import open_registry
from graylane.serde import decode, decode_key, encode
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import audit_pb2, controlplane_pb2, controlplane_pb2_grpc, rollout_pb2
from tests.conftest import ROOT
from tests.support.records import produce_records
from tests.support.waiting import end_offsets, wait_until

pytestmark = pytest.mark.kafka

MODEL = "cp-gpt"
OPS = (("authorization", "Bearer ops-token-0123456"),)
VIEW = (("authorization", "Bearer view-token-012345"),)


@dataclass
class Api:
    server: ControlPlaneServer
    factory: KafkaFactory
    registry: controlplane_pb2_grpc.ModelRegistryStub
    rollouts: controlplane_pb2_grpc.RolloutsStub
    qos: controlplane_pb2_grpc.QosStub
    audit: controlplane_pb2_grpc.AuditStub


def _artifact(version: str, precision: Precision, servable: bool) -> ArtifactRecord:
    name = ArtifactName(
        MODEL, Backend.ONNXRUNTIME, "1.32.0", precision, "ptq", parse_semver(version)
    )
    return ArtifactRecord(
        name=name,
        path="/artifacts/x",
        manifest_sha256="f" * 64,
        servable=servable,
        validation=ValidationSummary(
            passed=servable, failures=() if servable else ("cosine 0.8 < 0.99",)
        ),
    )


@pytest.fixture
async def api(settings: Settings, factory: KafkaFactory) -> AsyncIterator[Api]:
    registry = open_registry(settings.db_url)
    registry.register_model(MODEL, "test model")
    for v in ("1.0.0", "1.1.0", "1.2.0"):
        registry.register_version(MODEL, v, "a" * 64)
    registry.set_stable(MODEL, "1.0.0")
    registry.add_artifact(_artifact("1.1.0", Precision.FP32, True))
    registry.add_artifact(_artifact("1.1.0", Precision.INT8, True))
    registry.add_artifact(_artifact("1.2.0", Precision.FP16, False))
    registry.engine.dispose()
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        tokens=TokenTable(
            parse_tokens("ops-token-0123456:operator:alice,view-token-012345:read_only")
        ),
        outbox_interval_s=0.5,
        check_candidates=False,  # no workers here; the check has its own test
        http_port=0,
    )
    server = ControlPlaneServer(config, factory)
    await server.start()
    await asyncio.wait_for(server.sink.ready.wait(), 30)
    channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Api(
            server,
            factory,
            controlplane_pb2_grpc.ModelRegistryStub(channel),
            controlplane_pb2_grpc.RolloutsStub(channel),
            controlplane_pb2_grpc.QosStub(channel),
            controlplane_pb2_grpc.AuditStub(channel),
        )
    finally:
        await channel.close()
        await server.stop(0)


async def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


def _spec(**kw: object) -> rollout_pb2.RolloutSpec:
    fields: dict[str, object] = {"model": MODEL, "candidate_version": "1.1.0"}
    fields.update(kw)
    return rollout_pb2.RolloutSpec(**fields)  # type: ignore[arg-type]


async def test_auth(api: Api) -> None:
    list_req = controlplane_pb2.ListModelsRequest()
    assert await _code(api.registry.ListModels(list_req)) == grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", "Bearer nope"),)
    code = await _code(api.registry.ListModels(list_req, metadata=wrong))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # A read-only token reads, but may not start a rollout (nor watch-stream less).
    listed = await api.registry.ListModels(list_req, metadata=VIEW)
    assert [m.name for m in listed.models] == [MODEL]
    code = await _code(api.rollouts.Start(_spec(), metadata=VIEW))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    stream = api.rollouts.Watch(controlplane_pb2.WatchRolloutsRequest(), metadata=wrong)
    with pytest.raises(aio.AioRpcError) as info:
        await stream.read()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_registry_rpcs(api: Api) -> None:
    r = api.registry
    model = await r.RegisterModel(
        controlplane_pb2.RegisterModelRequest(name="cp-other", description="d"), metadata=OPS
    )
    assert model.name == "cp-other" and not model.stable_version
    v = await r.RegisterVersion(
        controlplane_pb2.RegisterVersionRequest(model="cp-other", version="0.1.0"), metadata=OPS
    )
    assert v.version == "0.1.0" and not v.stable
    dup = r.RegisterVersion(
        controlplane_pb2.RegisterVersionRequest(model="cp-other", version="0.1.0"), metadata=OPS
    )
    assert await _code(dup) == grpc.StatusCode.ALREADY_EXISTS
    bad = r.RegisterVersion(
        controlplane_pb2.RegisterVersionRequest(model="cp-other", version="v1"), metadata=OPS
    )
    assert await _code(bad) == grpc.StatusCode.INVALID_ARGUMENT
    stable = await r.SetStable(
        controlplane_pb2.SetStableRequest(model="cp-other", version="0.1.0"), metadata=OPS
    )
    assert stable.stable
    listed = await r.ListVersions(controlplane_pb2.ListVersionsRequest(model=MODEL), metadata=VIEW)
    assert listed.model.stable_version == "1.0.0"
    by_version = {v.version: v for v in listed.versions}
    assert set(by_version) == {"1.0.0", "1.1.0", "1.2.0"}
    assert {x.precision for x in by_version["1.1.0"].variants} == {"fp32", "int8"}
    failed = by_version["1.2.0"].variants[0]
    assert not failed.servable and failed.validation.validated and not failed.validation.passed
    missing = r.ListVersions(controlplane_pb2.ListVersionsRequest(model="nope"), metadata=VIEW)
    assert await _code(missing) == grpc.StatusCode.NOT_FOUND


async def _read_commands(factory: KafkaFactory, n: int) -> list[tuple[str | None, bytes]]:
    consumer = factory.consumer(
        factory.layout.commands(), options=ConsumerOptions(group_id=None), client_suffix="t"
    )
    await consumer.start()
    out: list[tuple[str | None, bytes]] = []
    try:
        async with asyncio.timeout(20):
            while len(out) < n:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    out += [(decode_key(r.key), r.value or b"") for r in records]
    finally:
        await consumer.stop()
    return out


async def test_start_commands_and_invalid_arguments(api: Api) -> None:
    ro = api.rollouts
    cases = {
        "unknown model": (_spec(model="nope"), grpc.StatusCode.NOT_FOUND),
        "bad semver": (_spec(candidate_version="1.1"), grpc.StatusCode.INVALID_ARGUMENT),
        "unknown version": (_spec(candidate_version="9.9.9"), grpc.StatusCode.NOT_FOUND),
        "failed artifacts": (_spec(candidate_version="1.2.0"), grpc.StatusCode.FAILED_PRECONDITION),
        "steps not rising": (
            _spec(steps=[rollout_pb2.RolloutStep(weight_percent=w) for w in (5, 5, 100)]),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    }
    for name, (spec, code) in cases.items():
        assert await _code(ro.Start(spec, metadata=OPS)) == code, name

    state = await ro.Start(_spec(), metadata=OPS)
    assert state.phase == rollout_pb2.PENDING
    assert state.rollout_id.startswith(f"ro-{MODEL}-")
    assert state.spec.baseline_version == "1.0.0"  # the stable version
    assert state.spec.created_by == "alice"
    assert [s.weight_percent for s in state.spec.steps] == [1, 5, 25, 50, 100]
    again = ro.Start(_spec(), metadata=OPS)
    assert await _code(again) == grpc.StatusCode.FAILED_PRECONDITION

    got = await ro.Get(
        controlplane_pb2.GetRolloutRequest(rollout_id=state.rollout_id), metadata=VIEW
    )
    assert got == state
    listed = await ro.List(controlplane_pb2.ListRolloutsRequest(model=MODEL), metadata=VIEW)
    assert [s.rollout_id for s in listed.rollouts] == [state.rollout_id]
    ghost = ro.Get(controlplane_pb2.GetRolloutRequest(rollout_id="ro-x"), metadata=VIEW)
    assert await _code(ghost) == grpc.StatusCode.NOT_FOUND

    action = controlplane_pb2.RolloutActionRequest(rollout_id=state.rollout_id, reason="look")
    receipt = await ro.Pause(action, metadata=OPS)
    assert receipt.kind == rollout_pb2.COMMAND_PAUSE and receipt.issued_by == "alice"
    for call in (ro.Resume, ro.Promote, ro.Rollback, ro.Abort):
        assert (await call(action, metadata=OPS)).command_id
    assert await _code(ro.Abort(action, metadata=VIEW)) == grpc.StatusCode.PERMISSION_DENIED

    commands = await _read_commands(api.factory, 6)
    assert {key for key, _ in commands} == {MODEL}
    decoded = [decode(rollout_pb2.RolloutCommand, value) for _, value in commands]
    assert [c.kind for c in decoded] == [
        rollout_pb2.COMMAND_START,
        rollout_pb2.COMMAND_PAUSE,
        rollout_pb2.COMMAND_RESUME,
        rollout_pb2.COMMAND_PROMOTE,
        rollout_pb2.COMMAND_ROLLBACK,
        rollout_pb2.COMMAND_ABORT,
    ]
    assert decoded[0].spec == state.spec and decoded[0].rollout_id == state.rollout_id
    assert api.server.store.unsent_commands() == []


async def test_watch_streams_policy_engine_states(api: Api) -> None:
    state = await api.rollouts.Start(_spec(), metadata=OPS)
    stream = api.rollouts.Watch(
        controlplane_pb2.WatchRolloutsRequest(model=MODEL, initial=True), metadata=VIEW
    )
    first = await asyncio.wait_for(stream.read(), 10)
    assert first.rollout_id == state.rollout_id and first.phase == rollout_pb2.PENDING

    progressed = rollout_pb2.RolloutState()
    progressed.CopyFrom(state)
    progressed.phase = rollout_pb2.PROGRESSING
    progressed.candidate_weight_percent = 5.0
    progressed.step_index = 1
    progressed.updated_at_unix_ms = 1_700_000_000_000
    progressed.last_reason = "gates passed"
    layout = api.factory.layout
    await produce_records(api.factory, layout.rollouts(), [(state.rollout_id, encode(progressed))])
    seen = await asyncio.wait_for(stream.read(), 20)
    assert seen.phase == rollout_pb2.PROGRESSING and seen.candidate_weight_percent == 5.0
    stream.cancel()

    got = await api.rollouts.Get(
        controlplane_pb2.GetRolloutRequest(rollout_id=state.rollout_id), metadata=VIEW
    )
    assert got.phase == rollout_pb2.PROGRESSING

    # A finished rollout takes no more commands, and frees the model for a new one.
    done = rollout_pb2.RolloutState()
    done.CopyFrom(progressed)
    done.phase = rollout_pb2.ROLLED_BACK
    done.updated_at_unix_ms += 1000
    await produce_records(api.factory, layout.rollouts(), [(state.rollout_id, encode(done))])

    def finished() -> bool:
        stored = api.server.store.get_rollout(state.rollout_id)
        return stored is None or stored.finished

    await wait_until(finished, timeout=20, what="rollout finished in the store")
    action = controlplane_pb2.RolloutActionRequest(rollout_id=state.rollout_id)
    assert await _code(api.rollouts.Pause(action, metadata=OPS)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert (await api.rollouts.Start(_spec(), metadata=OPS)).rollout_id != state.rollout_id


def _record(i: int, kind: int = audit_pb2.DECISION_HOLD) -> audit_pb2.AuditRecord:
    return audit_pb2.AuditRecord(
        decision_id=f"d-{i}",
        decided_at_unix_ms=1_700_000_000_000 + i * 1000,
        model=MODEL,
        rollout_id="ro-a" if i < 3 else "ro-b",
        version="1.1.0",
        kind=kind,
        rule="min_samples",
        reason=f"decision {i}",
        qos_after=audit_pb2.QosState(active_variant="int8"),
    )


async def test_audit_sink_is_idempotent_and_queryable(api: Api) -> None:
    records = [_record(i) for i in range(4)] + [_record(4, audit_pb2.DECISION_PRECISION_CHANGE)]
    items = [(MODEL, encode(r)) for r in records]
    await produce_records(api.factory, api.factory.layout.audit(), items + items)
    # Every record, duplicates included, has been read once the sink's stored offsets reach
    # the end of the audit topic.
    topic = api.factory.layout.audit()
    ends = await end_offsets(api.factory, topic)
    assert sum(ends.values()) >= len(items) * 2

    def sink_at_end() -> bool:
        stored = api.server.store.sink_offsets(topic)
        return all(stored.get(p, 0) >= end for p, end in ends.items())

    await wait_until(sink_at_end, timeout=20, what="audit sink offsets at the topic end")
    assert len(api.server.store.query_audit(model=MODEL)) == 5
    assert api.server.sink.audit_added == 5

    q = api.audit.Query
    everything = await q(controlplane_pb2.AuditQuery(model=MODEL), metadata=VIEW)
    assert [r.decision_id for r in everything.records] == [f"d-{i}" for i in range(5)]
    one = await q(controlplane_pb2.AuditQuery(rollout_id="ro-a"), metadata=VIEW)
    assert len(one.records) == 3
    ranged = await q(
        controlplane_pb2.AuditQuery(
            model=MODEL, from_unix_ms=1_700_000_001_000, to_unix_ms=1_700_000_003_000
        ),
        metadata=VIEW,
    )
    assert [r.decision_id for r in ranged.records] == ["d-1", "d-2"]
    empty = q(controlplane_pb2.AuditQuery(from_unix_ms=5, to_unix_ms=5), metadata=VIEW)
    assert await _code(empty) == grpc.StatusCode.INVALID_ARGUMENT


async def test_qos_policy(api: Api) -> None:
    policy = rollout_pb2.QosPolicy(
        model=MODEL, version="1.1.0", slo_p99_ms=50, ladder=["fp32", "int8"], enabled=True
    )
    missing = api.qos.GetPolicy(
        controlplane_pb2.GetQosPolicyRequest(model=MODEL, version="1.1.0"), metadata=VIEW
    )
    assert await _code(missing) == grpc.StatusCode.NOT_FOUND
    view = await api.qos.SetPolicy(policy, metadata=OPS)
    assert view.policy.slo_p99_ms == 50 and view.command_id and view.updated_by == "alice"
    assert view.policy.step_up_ratio > 0  # defaults filled in

    bad_ladder = rollout_pb2.QosPolicy()
    bad_ladder.CopyFrom(policy)
    bad_ladder.ladder[:] = ["fp32", "fp16"]
    code = await _code(api.qos.SetPolicy(bad_ladder, metadata=OPS))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    bad_slo = rollout_pb2.QosPolicy()
    bad_slo.CopyFrom(policy)
    bad_slo.slo_p99_ms = -1
    assert await _code(api.qos.SetPolicy(bad_slo, metadata=OPS)) == grpc.StatusCode.INVALID_ARGUMENT
    assert await _code(api.qos.SetPolicy(policy, metadata=VIEW)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )

    decision = _record(9, audit_pb2.DECISION_PRECISION_CHANGE)
    await produce_records(api.factory, api.factory.layout.audit(), [(MODEL, encode(decision))])
    await wait_until(lambda: bool(api.server.store.query_audit(model=MODEL)), timeout=20)
    got = await api.qos.GetPolicy(
        controlplane_pb2.GetQosPolicyRequest(model=MODEL, version="1.1.0"), metadata=VIEW
    )
    assert got.active_variant == "int8" and got.last_reason == "decision 9"
    commands = [
        decode(rollout_pb2.RolloutCommand, v) for _, v in await _read_commands(api.factory, 1)
    ]
    assert commands[0].kind == rollout_pb2.COMMAND_SET_QOS_POLICY
    assert commands[0].qos_policy.model == MODEL


async def test_cli_talks_to_the_control_plane(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    from graylane.app.cli.main import main

    base = ["--addr", f"127.0.0.1:{api.server.port}", "--token", "ops-token-0123456"]

    def cli(*argv: str) -> int:
        return main([*argv[:2], *base, *argv[2:]])

    # The CLI is synchronous; run it off the loop that serves it.
    assert await asyncio.to_thread(cli, "model", "show", MODEL) == 0
    rc = await asyncio.to_thread(
        cli, "rollout", "start", "--model", MODEL, "--candidate", "1.1.0", "--steps", "10,100"
    )
    assert rc == 0
    listed = await api.rollouts.List(controlplane_pb2.ListRolloutsRequest(), metadata=VIEW)
    rollout_id = listed.rollouts[0].rollout_id
    assert await asyncio.to_thread(cli, "rollout", "pause", rollout_id) == 0
    assert await asyncio.to_thread(cli, "audit", "log", "--model", MODEL) == 0
    with pytest.raises(SystemExit, match="PERMISSION_DENIED"):
        await asyncio.to_thread(
            main,
            ["rollout", "abort", "--addr", base[1], "--token", "view-token-012345", rollout_id],
        )
    out = capsys.readouterr().out
    assert "1.1.0" in out and rollout_id in out and "pause of" in out


def _decision(rollout_id: str, i: int, kind: int, rule: str) -> audit_pb2.AuditRecord:
    return audit_pb2.AuditRecord(
        decision_id=f"{rollout_id}-{i}",
        decided_at_unix_ms=now_ms() + i,  # fresh: not older than the verdict's max age
        model=MODEL,
        rollout_id=rollout_id,
        version="1.1.0",
        kind=kind,
        rule=rule,
        reason=f"decision {i}",
        epoch=3,
    )


async def test_the_verdict_endpoint_answers_argo_and_flagger_over_http(api: Api) -> None:
    """Argo's web provider (GET, bearer header) and Flagger's webhook (POST, token in its
    metadata) read the verdict the audit sink stored, as the examples in deploy/progressive
    configure them."""
    assert api.server.verdicts is not None
    base = f"http://127.0.0.1:{api.server.verdicts.port}/v1/verdict"
    argo = yaml.safe_load((ROOT / "deploy/progressive/argo-analysis-template.yaml").read_text())
    metric = argo["spec"]["metrics"][0]
    assert metric["successCondition"] == "result.verdict == 'pass'"
    assert metric["failureCondition"] == "result.verdict == 'fail'"
    assert metric["provider"]["web"]["url"].split("?")[0].endswith("/v1/verdict")
    flagger = yaml.safe_load((ROOT / "deploy/progressive/flagger-canary.yaml").read_text())
    hook = flagger["spec"]["analysis"]["webhooks"][0]
    assert hook["url"].endswith("/v1/verdict") and {"model", "version", "token"} <= set(
        hook["metadata"]
    )
    view = {"authorization": VIEW[0][1]}
    flagger_payload = {
        "name": "chat-api",
        "namespace": "apps",
        "phase": "Progressing",
        "metadata": {"model": MODEL, "version": "1.1.0", "token": VIEW[0][1].split()[1]},
    }
    state = await api.rollouts.Start(_spec(), metadata=OPS)
    layout = api.factory.layout
    async with httpx.AsyncClient(timeout=10) as http:
        query = {"model": MODEL, "version": "1.1.0"}
        assert (await http.get(base, params=query)).status_code == 401
        assert (
            await http.get(base, params=query, headers={"authorization": "Bearer x"})
        ).status_code == 401
        missing = await http.get(base, params={"model": MODEL, "version": "9.9.9"}, headers=view)
        assert missing.status_code == 404

        first = await http.get(base, params=query, headers=view)
        assert first.status_code == 200
        assert (first.json()["verdict"], first.json()["why"]) == ("inconclusive", "no decision yet")

        async def verdict_after(record: audit_pb2.AuditRecord) -> dict[str, object]:
            await produce_records(api.factory, layout.audit(), [(MODEL, encode(record))])
            await wait_until(
                lambda: any(
                    r.decision_id == record.decision_id
                    for r in api.server.store.query_audit(rollout_id=state.rollout_id)
                ),
                timeout=20,
                what="the decision stored by the audit sink",
            )
            got = await http.get(base, params=query, headers=view)
            assert got.status_code == 200
            body: dict[str, object] = got.json()
            return body

        hold = await verdict_after(
            _decision(state.rollout_id, 1, audit_pb2.DECISION_HOLD, "min_samples")
        )
        assert hold["verdict"] == "pass" and hold["rollout_id"] == state.rollout_id
        assert hold["decision"]["epoch"] == 3  # type: ignore[index]
        passed = await http.post(base, json=flagger_payload)
        assert passed.status_code == 200 and passed.json()["verdict"] == "pass"
        await asyncio.sleep(0.01)  # the decision is now older than a 1 ms bound
        stale = await http.get(base, params={**query, "max_age_s": "0.001"}, headers=view)
        assert stale.json()["verdict"] == "inconclusive"

        no_data = await verdict_after(
            _decision(state.rollout_id, 2, audit_pb2.DECISION_HOLD, "no_data")
        )
        assert no_data["verdict"] == "inconclusive"
        failed = await verdict_after(
            _decision(state.rollout_id, 3, audit_pb2.DECISION_GATE_FAILED, "error_rate_sequential")
        )
        assert failed["verdict"] == "fail"
        refused = await http.post(base, json=flagger_payload)
        assert refused.status_code == 412 and refused.json()["verdict"] == "fail"
        forged = {**flagger_payload, "metadata": {"model": MODEL, "token": "not-a-token"}}
        assert (await http.post(base, json=forged)).status_code == 401
