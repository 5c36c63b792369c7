"""Kafka ACLs per role: the trust boundary as data."""

from __future__ import annotations

import shlex

import pytest

from graylane.acls import (
    AclScope,
    KafkaRole,
    Operation,
    Resource,
    all_acls,
    allows,
    kafka_acls_commands,
    lease_topic,
    role_acls,
)
from graylane.app.cli.main import main
from graylane.topics import TopicLayout

L = TopicLayout(prefix="gl")
SCOPE = AclScope(models=("gpt", "bert"), clients=("app1",))
ACLS = all_acls(L, SCOPE)


def every_topic() -> list[str]:
    topics = [s.name for s in L.shared_specs()]
    for model in (*SCOPE.models, "other"):
        topics += [s.name for s in L.model_specs(model, ["v1", "v2"])]
    return [*topics, L.reply("app1"), L.reply("app2")]


def writable(role: KafkaRole) -> set[str]:
    return {t for t in every_topic() if allows(ACLS[role], Resource.TOPIC, t, Operation.WRITE)}


def readable(role: KafkaRole) -> set[str]:
    return {t for t in every_topic() if allows(ACLS[role], Resource.TOPIC, t, Operation.READ)}


def test_producer_writes_only_ingress_and_cancels_and_reads_only_its_reply_topic() -> None:
    assert writable(KafkaRole.PRODUCER) == {L.ingress("gpt"), L.ingress("bert"), L.cancels()}
    assert readable(KafkaRole.PRODUCER) == {L.reply("app1")}
    rules = ACLS[KafkaRole.PRODUCER]
    for topic in (L.routing(), L.precision(), L.rollouts(), L.commands(), L.audit()):
        for op in Operation:
            if op in (Operation.CREATE, Operation.DESCRIBE_CONFIGS):
                continue
            assert not allows(rules, Resource.TOPIC, topic, op), (topic, op)
    # Not even the version topics: a producer cannot bypass the router.
    assert not allows(rules, Resource.TOPIC, L.version_requests("gpt", "v1"), Operation.WRITE)
    assert not allows(rules, Resource.TOPIC, L.ingress("other"), Operation.WRITE)


def test_the_gateway_writes_like_a_producer_and_reads_only_gateway_reply_topics() -> None:
    rules = ACLS[KafkaRole.GATEWAY]
    # ... and the outcomes of its answers (POST /v1/feedback).
    assert writable(KafkaRole.GATEWAY) == writable(KafkaRole.PRODUCER) | {L.outcomes()}
    assert readable(KafkaRole.GATEWAY) == set()  # no client's reply topic
    for replica in ("gateway-7f9c-x2", "gateway-0"):
        topic = L.reply(replica)
        for op in (Operation.READ, Operation.CREATE, Operation.DESCRIBE_CONFIGS):
            assert allows(rules, Resource.TOPIC, topic, op), (topic, op)
        assert not allows(rules, Resource.TOPIC, topic, Operation.WRITE)
    # It sees which models and versions exist, and may not write a version topic.
    version = L.version_requests("gpt", "v1")
    assert allows(rules, Resource.TOPIC, version, Operation.DESCRIBE)
    assert not allows(rules, Resource.TOPIC, version, Operation.WRITE)
    assert not allows(rules, Resource.TOPIC, L.routing(), Operation.DESCRIBE)
    assert not allows(rules, Resource.GROUP, "gl-router", Operation.READ)


def test_each_service_writes_only_the_topics_of_its_role() -> None:
    replies = {L.reply("app1"), L.reply("app2")}
    versions = {L.version_requests(m, v) for m in SCOPE.models for v in ("v1", "v2")}
    results = {L.results(m) for m in SCOPE.models}
    shadows = {L.shadow(m) for m in SCOPE.models}
    assert writable(KafkaRole.ROUTER) == versions | results | shadows | replies | {L.dlq()}
    assert writable(KafkaRole.WORKER) == (results | shadows | replies | {L.telemetry(), L.dlq()})
    # and the version topics, where a rollout step's evaluation set goes
    assert writable(KafkaRole.POLICY_ENGINE) == versions | {
        L.routing(),
        L.precision(),
        L.rollouts(),
        L.scale(),
        L.audit(),
    }
    assert writable(KafkaRole.SUPERVISOR) == set()
    # commands; the dead letters of notifications no webhook took
    assert writable(KafkaRole.CONTROL_PLANE) == {L.commands(), L.dlq()}
    assert writable(KafkaRole.RESULT_CONSUMER) == set()


def test_control_state_has_one_writer_each() -> None:
    for topic, owner in (
        (L.routing(), KafkaRole.POLICY_ENGINE),
        (L.precision(), KafkaRole.POLICY_ENGINE),
        (L.rollouts(), KafkaRole.POLICY_ENGINE),
        (L.scale(), KafkaRole.POLICY_ENGINE),
        (L.audit(), KafkaRole.POLICY_ENGINE),
        (L.commands(), KafkaRole.CONTROL_PLANE),
    ):
        writers = {r for r in KafkaRole if topic in writable(r)}
        assert writers == {owner}, topic


def test_reads_and_groups() -> None:
    assert readable(KafkaRole.ROUTER) == {L.ingress("gpt"), L.ingress("bert"), L.routing()}
    assert L.version_requests("gpt", "v2") in readable(KafkaRole.WORKER)
    assert L.ingress("gpt") not in readable(KafkaRole.WORKER)
    assert readable(KafkaRole.RESULT_CONSUMER) == {L.results("gpt"), L.results("bert")}
    assert readable(KafkaRole.SUPERVISOR) == {L.scale()}
    assert L.scale() in readable(KafkaRole.CONTROL_PLANE)
    # the supervisor bounds replicas by a version topic's partitions: it may describe them
    version_topic = L.version_requests("gpt", "v1")
    assert allows(ACLS[KafkaRole.SUPERVISOR], Resource.TOPIC, version_topic, Operation.DESCRIBE)
    assert allows(ACLS[KafkaRole.ROUTER], Resource.GROUP, "gl-router", Operation.READ)
    assert allows(ACLS[KafkaRole.WORKER], Resource.GROUP, "gl-worker-gpt-v1", Operation.READ)
    assert allows(ACLS[KafkaRole.POLICY_ENGINE], Resource.GROUP, "gl-policy", Operation.READ)
    assert not allows(ACLS[KafkaRole.PRODUCER], Resource.GROUP, "gl-router", Operation.READ)


def test_the_policy_engine_may_keep_its_lease_and_no_one_else_may_write_it() -> None:
    """Regression: the policy engine had no rule for its lease topic, so under ACLs it
    could not take the lease and never started."""
    from graylane.kafka.seam import KafkaFactory
    from graylane.policy_engine.lease import LeaseKeeper
    from graylane.settings import Settings

    keeper = LeaseKeeper(KafkaFactory(Settings(topic_prefix="gl")), "h")
    assert lease_topic(L) == keeper.topic
    engine = ACLS[KafkaRole.POLICY_ENGINE]
    for op in (Operation.READ, Operation.WRITE):
        assert allows(engine, Resource.TOPIC, keeper.topic, op)
    others = [r for r in KafkaRole if r is not KafkaRole.POLICY_ENGINE]
    assert not any(allows(ACLS[r], Resource.TOPIC, keeper.topic, Operation.WRITE) for r in others)


def test_liveness_probe_and_start_check_may_describe_worker_groups_only() -> None:
    """Regression: neither the policy engine (liveness probe: committed offsets) nor the
    control plane (START check: group members) could Describe the worker groups."""
    for role in (KafkaRole.POLICY_ENGINE, KafkaRole.CONTROL_PLANE):
        rules = ACLS[role]
        for model in SCOPE.models:
            group = L.worker_group(model, "1.2.0")
            assert allows(rules, Resource.GROUP, group, Operation.DESCRIBE), (role, group)
            assert not allows(rules, Resource.GROUP, group, Operation.READ), (role, group)
        assert not allows(rules, Resource.GROUP, L.worker_group("other", "v1"), Operation.DESCRIBE)
        assert not allows(rules, Resource.GROUP, "gl-router", Operation.DESCRIBE), role


def test_no_role_alters_topic_configs() -> None:
    for role, rules in ACLS.items():
        for topic in every_topic():
            assert not allows(rules, Resource.TOPIC, topic, Operation.ALTER_CONFIGS), role


def test_scope_refuses_bad_names() -> None:
    with pytest.raises(ValueError):
        AclScope(models=("a.b",))
    with pytest.raises(ValueError):
        AclScope(models=("gpt",), clients=("x y",))


def test_no_producer_is_granted_a_reply_topic_of_the_gateway() -> None:
    """Pins the shared namespace: a producer's client id ``gateway-<pod>`` got it the
    gateway replica's reply topic."""
    for client in ("gateway", "gateway-0", "gateway-pod-7f9c"):
        with pytest.raises(ValueError, match="gateway's namespace"):
            AclScope(models=("gpt",), clients=(client,))
    assert AclScope(models=("gpt",), clients=("gateways", "my-gateway-0")).clients


def test_kafka_acls_command_lines() -> None:
    lines = kafka_acls_commands(
        role_acls(L, KafkaRole.WORKER, SCOPE),
        "User:worker",
        bootstrap="kafka:9093",
        command_config="admin.properties",
    )
    parsed = [shlex.split(line) for line in lines]
    assert all(
        p[:7]
        == [
            "kafka-acls.sh",
            "--bootstrap-server",
            "kafka:9093",
            "--command-config",
            "admin.properties",
            "--add",
            "--allow-principal",
        ]
        for p in parsed
    )
    versions = next(p for p in parsed if "gl.requests.gpt." in p)
    assert versions[-2:] == ["--resource-pattern-type", "prefixed"]
    assert versions[versions.index("--operation") + 1] == "Read"
    telemetry = next(p for p in parsed if "gl.telemetry" in p)
    assert "--resource-pattern-type" not in telemetry
    assert any("--group" in p for p in parsed)


def test_cli_prints_commands_for_the_principal_map(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAYLANE_TOPIC_PREFIX", "gl")
    code = main(
        [
            "acls",
            "--principal",
            "producer=User:app",
            "--principal",
            "router=User:router",
            "--model",
            "gpt",
            "--bootstrap-server",
            "b:9092",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    producer = [line for line in out if "User:app" in line and not line.startswith("#")]
    assert producer == [
        "kafka-acls.sh --bootstrap-server b:9092 --add --allow-principal User:app "
        "--operation Write --topic gl.requests.gpt",
        "kafka-acls.sh --bootstrap-server b:9092 --add --allow-principal User:app "
        "--operation Write --topic gl.cancels",
    ]
    assert any("User:router" in line and "gl.control.routing" in line for line in out)
    with pytest.raises(SystemExit, match="unknown role"):
        main(["acls", "--principal", "admin=User:x", "--model", "gpt"])
    with pytest.raises(SystemExit, match="--model"):
        main(["acls", "--principal", "router=User:r"])


@pytest.mark.parametrize(("rf", "isr"), [(1, "1"), (2, "2"), (3, "2"), (5, "2")])
def test_topics_get_min_insync_replicas(rf: int, isr: str) -> None:
    layout = TopicLayout(replication_factor=rf)
    specs = layout.shared_specs() + layout.model_specs("gpt", ["v1"]) + [layout.reply_spec("c")]
    assert {s.configs()["min.insync.replicas"] for s in specs} == {isr}


def test_the_scaler_may_only_describe_the_workers_lag() -> None:
    """Regression: KEDA logged in as the worker principal, with its reads and writes."""
    rules = ACLS[KafkaRole.SCALER]
    assert rules and all(r.operations == (Operation.DESCRIBE,) for r in rules)
    assert writable(KafkaRole.SCALER) == set() and readable(KafkaRole.SCALER) == set()
    version_topic = L.version_requests("gpt", "v1")
    assert allows(rules, Resource.TOPIC, version_topic, Operation.DESCRIBE)
    assert allows(rules, Resource.GROUP, "gl-worker-gpt-v1", Operation.DESCRIBE)
    assert not allows(rules, Resource.GROUP, "gl-worker-gpt-v1", Operation.READ)  # no joining
    for topic in (L.ingress("gpt"), L.cancels(), L.precision(), L.results("gpt"), L.audit()):
        assert not allows(rules, Resource.TOPIC, topic, Operation.DESCRIBE), topic
