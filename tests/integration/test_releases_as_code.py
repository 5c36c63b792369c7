"""Releases as code on the real broker: a Rollout document applied through the CLI and
the control plane drives the policy engine over real workers; approval steps wait for
an operator; every transition reaches a webhook receiver, signed and in order; a
receiver that is down delays no decision."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from graylane.engine_worker.faults import FaultInjection
from graylane.kafka.backoff import BackoffPolicy
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.notifications.sender import SenderPolicy
from graylane.notifications.webhook import verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.registry.repository import open_registry
from graylane.settings import Settings
from graylane.v1 import audit_pb2, controlplane_pb2, controlplane_pb2_grpc, rollout_pb2
from tests.support.brokers import free_port
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.releases import (
    BASE,
    CANDIDATE,
    MODEL,
    VIEWER,
    assert_replays_the_same,
    audit_of,
    cli,
    control_plane,
    demo_versions,
    phase_of,
    register,
    rollout_document,
    stable_of,
    until_phase,
    until_stable,
    until_stored_phase,
    webhook_receiver,
)
from tests.support.stack import dead_letters, running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SECRET = b"webhook-secret-0123"


async def test_a_document_applied_twice_updated_paused_and_resumed_notifies_each_step(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    paths = demo_versions(tmp_path)
    secret = tmp_path / "hook.secret"
    secret.write_bytes(SECRET + b"\n")
    name = "cli-gpt-1-1-0"
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    with webhook_receiver() as receiver:
        hooks = (
            f"      - url: http://127.0.0.1:{receiver.port}/events\n"
            f"        secretFile: {secret}\n"
            f"      - url: http://127.0.0.1:{receiver.port}/slack\n"
            f"        format: slack\n"
            f"        secretFile: {secret}\n"
        )
        # Step 1 dwells 10 minutes: nothing moves until the schedule changes.
        first = tmp_path / "v1" / "rollout.yaml"
        first.parent.mkdir()
        first.write_text(
            rollout_document(
                name,
                "    - {weight: 10, samples: 10, dwell: 10m}\n"
                "    - {weight: 50, samples: 10, dwell: 2s}\n"
                "    - {weight: 100}\n",
                webhooks=hooks,
            )
        )
        changed = tmp_path / "v2.yaml"
        changed.write_text(
            rollout_document(
                name,
                "    - {weight: 20, samples: 10, dwell: 2s}\n"
                "    - pause: {}\n"
                "    - {weight: 50, samples: 10, dwell: 2s}\n"
                "    - {weight: 100}\n",
                webhooks=hooks,
            )
        )
        async with (
            control_plane(factory, monkeypatch, http_port=0) as server,
            running_stack(factory, model=MODEL, versions=paths, stable=BASE),
        ):
            with policy_engine(settings, tmp_path / "policy.log", MODEL):
                await wait_ready(tmp_path / "policy.log")
                async with RoutingWatch(factory, MODEL) as routing, steady_load(factory, MODEL):
                    out = await cli(capsys, "apply", "-f", str(first.parent))
                    assert f"rollout/{name} created" in out
                    await routing.until(lambda t: routing.weight(t, CANDIDATE) == 10.0, 30)

                    # The same file again: nothing changes, no command is sent.
                    out = await cli(capsys, "apply", "-f", str(first))
                    assert f"rollout/{name} unchanged" in out
                    assert len(server.store.commands_of(name)) == 1
                    assert (await cli(capsys, "diff", "-f", str(first))).endswith("unchanged\n")

                    # The changed schedule: diff shows it, apply updates the running rollout.
                    out = await cli(capsys, "diff", "-f", str(changed), code=1)
                    assert "steps: [10% 10 samples 600s" in out and "pause until resumed" in out
                    out = await cli(capsys, "apply", "-f", str(changed))
                    assert f"rollout/{name} updated" in out
                    await routing.until(lambda t: routing.weight(t, CANDIDATE) == 20.0, 30)

                    # Step 1 passes and pauses for approval; weights stay frozen.
                    await until_phase(factory, name, rollout_pb2.PAUSED, 60)
                    await asyncio.sleep(5)  # five policy ticks: it must not move on alone
                    assert await phase_of(factory, name) == rollout_pb2.PAUSED
                    assert routing.weight(routing.tables[-1][1], CANDIDATE) == 20.0

                    # A read-only token may look, not approve.
                    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
                    stub = controlplane_pb2_grpc.RolloutsStub(channel)
                    ask = controlplane_pb2.RolloutActionRequest(rollout_id=name)
                    with pytest.raises(grpc.aio.AioRpcError) as denied:
                        await stub.Resume(ask, metadata=(("authorization", f"Bearer {VIEWER}"),))
                    assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
                    await channel.close()

                    await cli(capsys, "rollout", "resume", name, "--reason", "dashboards ok")
                    _, final = await routing.until(lambda t: t.stable_version == CANDIDATE, 60)
                    await until_phase(factory, name, rollout_pb2.PROMOTED, 30)
                    await until_stored_phase(server, name, rollout_pb2.PROMOTED)
                    live = yaml.safe_load(await cli(capsys, "get", "rollout", name, "-o", "yaml"))
                await wait_until(
                    lambda: (
                        "promoted" in receiver.types("/events")
                        and "promoted" in receiver.types("/slack")
                    ),
                    timeout=30,
                    what="the promotion at both webhooks",
                )
                records = audit_of(server, name)

    # The recorded decisions, the spec update and the approval included, replay the same.
    await assert_replays_the_same(capsys, name)

    # get rollout -o yaml: the live object in the document's schema, the new schedule.
    assert live["kind"] == "Rollout" and live["metadata"]["name"] == name
    assert [s.get("weight") for s in live["spec"]["steps"]] == [20.0, None, 50.0, 100.0]
    assert live["spec"]["steps"][1] == {"pause": {}}
    assert live["status"]["phase"] == "promoted"

    # The audit: the digest of each applied document, and who approved, when.
    started = next(r for r in records if r.kind == audit_pb2.DECISION_ROLLOUT_STARTED)
    updated = next(r for r in records if r.rule == "spec_updated")
    digests = {
        started.rollout_after.spec.document_digest,
        updated.rollout_after.spec.document_digest,
    }
    assert len(digests) == 2 and all(d.startswith("sha256:") for d in digests)
    assert live["status"]["documentDigest"] == updated.rollout_after.spec.document_digest
    paused = next(r for r in records if r.rule == "approval_pause")
    approved = next(r for r in records if r.rule == "manual_resume")
    assert approved.actor == "alice" and "approved step 1/3" in approved.reason
    assert approved.decided_at_unix_ms >= paused.decided_at_unix_ms
    assert "dashboards ok" in approved.reason

    # Each transition, signed, in the order decided, at both receivers.
    expected = ["started", "updated", "paused", "resumed", "step_advanced", "promoted"]
    for path in ("/events", "/slack"):
        got = [t for t in receiver.types(path) if t not in ("held", "gate_failed")]
        assert got == expected, (path, receiver.types(path))
    assert all(verify(SECRET, r.body, r.signature) for r in receiver.seen)
    events = [json.loads(r.body) for r in receiver.seen if r.path == "/events"]
    times = [e["data"]["decidedAtMs"] for e in events]
    assert times == sorted(times)
    assert events[0]["specversion"] == "1.0" and events[0]["subject"] == name
    assert final.stable_version == CANDIDATE


async def test_a_receiver_that_is_down_does_not_delay_the_rollback(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register(settings)
    paths = demo_versions(tmp_path)
    name = "cli-gpt-bad"
    down = free_port()  # nothing listens there
    # The down receiver's first notification is retried for minutes: any decision
    # that waited on it could not come before its dead letter.
    slow = SenderPolicy(attempts=4, backoff=BackoffPolicy(base_s=60.0, cap_s=60.0, jitter=0.0))
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    faults = {CANDIDATE: FaultInjection(error_rate=0.3)}
    with webhook_receiver() as receiver:
        spec = tmp_path / "bad.yaml"
        spec.write_text(
            rollout_document(
                name,
                "    - {weight: 10, samples: 10, dwell: 30s}\n"
                "    - {weight: 50, samples: 10, dwell: 30s}\n"
                "    - {weight: 100}\n",
                webhooks=f"      - url: http://127.0.0.1:{down}/hook\n"
                f"      - url: http://127.0.0.1:{receiver.port}/up\n",
            )
        )
        async with (
            control_plane(factory, monkeypatch, webhooks=slow, http_port=0) as server,
            running_stack(factory, model=MODEL, versions=paths, stable=BASE, faults=faults),
        ):
            with policy_engine(settings, tmp_path / "policy.log", MODEL):
                await wait_ready(tmp_path / "policy.log")
                async with steady_load(factory, MODEL):
                    await cli(capsys, "apply", "-f", str(spec))
                    await until_phase(factory, name, rollout_pb2.ROLLED_BACK, 60)
                await wait_until(
                    lambda: "rolled_back" in receiver.types("/up"),
                    timeout=30,
                    what="the rollback at the receiver that is up",
                )
                records = audit_of(server, name)
                # Recorded while the down receiver's first notification is still being tried.
                still_trying = server.webhooks.dead_lettered
                # What Argo's web provider and Flagger's webhook gate read, over HTTP.
                assert server.verdicts is not None
                base = f"http://127.0.0.1:{server.verdicts.port}"
                async with httpx.AsyncClient(base_url=base) as http:
                    verdict = (
                        await http.get(
                            "/v1/verdict",
                            params={"model": MODEL, "version": CANDIDATE},
                            headers={"authorization": f"Bearer {VIEWER}"},
                        )
                    ).json()
                    hook = {"metadata": {"model": MODEL, "version": CANDIDATE, "token": VIEWER}}
                    gate = await http.post("/v1/verdict", json=hook)
        # The down receiver was sent what the up one got: each ends as a dead letter.
        letters = await dead_letters(factory, expect=len(receiver.types("/up")))

    assert verdict["verdict"] == "fail" and verdict["rollout_id"] == name
    assert gate.status_code == 412
    rollback = next(r for r in records if r.kind == audit_pb2.DECISION_ROLLBACK)
    started = next(r for r in records if r.kind == audit_pb2.DECISION_ROLLOUT_STARTED)
    assert started.decided_at_unix_ms < rollback.decided_at_unix_ms
    assert still_trying == 0
    # The up receiver got every transition in order, the rollback last.
    up = receiver.types("/up")
    assert up[0] == "started" and up[-1] == "rolled_back", up
    # The down receiver's notifications end on the dead-letter topic, each after the
    # rollback was decided: the decision never waited for them.
    about_down = [d for d in letters if f":{down}/hook" in d.reason]
    assert about_down, [d.reason for d in letters]
    assert all(d.original_key == name.encode() for d in about_down)
    assert all(d.failed_at_unix_ms > rollback.decided_at_unix_ms for d in about_down)
    kinds = [json.loads(d.original_value)["data"]["transition"] for d in about_down]
    assert kinds == up, (kinds, up)
    assert all(d.service == "controlplane-notifier" for d in about_down)


async def test_undo_to_revision_returns_to_a_version_two_promotions_back(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = "undo-gpt"
    versions = ("1.0.0", "1.1.0", "1.2.0")
    registry = open_registry(settings.db_url)
    registry.register_model(model, "three stable revisions")
    for version in versions:
        registry.register_version(model, version, "a" * 64)
    registry.set_stable(model, versions[0])
    registry.engine.dispose()
    paths = {
        v: write_demo_gpt(tmp_path / f"{v}.onnx", "tiny", seed=i + 1)
        for i, v in enumerate(versions)
    }
    await prepare_topics(settings, PolicyConfig(models=(model,)))
    async with (
        control_plane(factory, monkeypatch, http_port=0) as server,
        running_stack(factory, model=model, versions=paths, stable=versions[0]),
    ):
        with policy_engine(settings, tmp_path / "policy.log", model):
            await wait_ready(tmp_path / "policy.log")
            async with RoutingWatch(factory, model) as routing, steady_load(factory, model):
                for candidate in versions[1:]:
                    spec = tmp_path / f"{candidate}.yaml"
                    name = f"undo-{candidate.replace('.', '-')}"
                    spec.write_text(
                        rollout_document(
                            name,
                            "    - {weight: 10, dwell: 10m}\n    - {weight: 100}\n",
                            model=model,
                            baseline=stable_of(settings, model),
                            candidate=candidate,
                        )
                    )
                    await cli(capsys, "apply", "-f", str(spec))
                    await until_phase(factory, name, rollout_pb2.PROGRESSING, 30)
                    await cli(capsys, "rollout", "promote", name)
                    await until_stable(settings, candidate, model)
                history = await cli(capsys, "rollout", "history", model, "-o", "json")
                revisions = json.loads(history)["items"]
                assert [(r["revision"], r["version"]) for r in revisions] == [
                    (3, "1.2.0"),
                    (2, "1.1.0"),
                    (1, "1.0.0"),
                ]
                out = await cli(capsys, "rollout", "undo", model, "--to-revision", "1")
                assert "to 1.0.0" in out
                _, table = await routing.until(
                    lambda t: t.stable_version == "1.0.0" and t.reason.startswith("reverted"), 30
                )
                assert routing.weight(table, "1.0.0") == 100.0
                again = json.loads(await cli(capsys, "rollout", "history", model, "-o", "json"))
                # Refused: revision 9 was never, and the current one is where it is.
                await cli(capsys, "rollout", "undo", model, "--to-revision", "9", code=1)

                def reverted() -> bool:
                    found = server.store.query_audit(model=model)
                    return any(r.rule == "stable_reverted" for r in found)

                await wait_until(reverted, timeout=30, what="the revert on record")
                records = server.store.query_audit(model=model)
    assert [(r["revision"], r["version"]) for r in again["items"]][:2] == [
        (4, "1.0.0"),
        (3, "1.2.0"),
    ]
    undo = next(r for r in records if r.rule == "stable_reverted")
    assert "undo to revision 1 (1.0.0)" in undo.reason and "from 1.2.0" in undo.reason
    assert undo.actor == "alice"
    promotions = [
        r.rollout_after.spec.candidate_version
        for r in records
        if r.kind == audit_pb2.DECISION_MANUAL_COMMAND and r.rule == "manual_promote"
    ]
    assert promotions == ["1.1.0", "1.2.0"]
