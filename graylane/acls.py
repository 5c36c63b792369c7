"""Kafka ACLs per role, as data derived from the topic layout.

The trust boundary: a producer writes only ingress topics and reads only its
own reply topic; the API gateway is a producer for many callers, its replicas each
reading a reply topic of their own (``<p>.reply.gateway-<replica>-<secret>``, a prefix: replicas
come and go) and seeing which request topics exist (the models and versions it lists);
every service writes only the topics of its role (router:
version topics, error replies, dlq; workers: results/replies, telemetry,
shadow, dlq; policy engine: control.routing/precision/rollouts/scale, audit
and its lease topic; control plane: control.commands). The policy engine's
liveness probe and the control plane's START check Describe the worker groups
of the served models (committed offsets, members), nothing else of them. The local supervisor
(``graylane supervise``) only reads control.scale and describes the version
topics (their partition count bounds the replicas). KEDA's Kafka scaler logs in as the
scaler role: it may only Describe the version topics and the worker groups (the lag it
scales on), never read a record, write one or join a group. Services may create and describe any
Graylane topic (they ensure their topics at start-up) but never alter a
topic's configs: repairing drift is the operator's ``graylane stack topics``.

Kafka implies Describe from Read/Write and DescribeConfigs from AlterConfigs;
:func:`allows` follows the same rule.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from graylane.topics import TopicLayout, TopicNameError, check_model_name

__all__ = [
    "EVALUATION_CLIENT_ID",
    "GATEWAY_CLIENT",
    "AclRule",
    "AclScope",
    "KafkaRole",
    "Operation",
    "Pattern",
    "Resource",
    "all_acls",
    "allows",
    "kafka_acls_commands",
    "lease_topic",
    "role_acls",
]


class KafkaRole(Enum):
    """The Kafka principal a Graylane component logs in as; each gets its own ACLs."""

    ROUTER = "router"
    WORKER = "worker"
    POLICY_ENGINE = "policy-engine"
    CONTROL_PLANE = "control-plane"
    SUPERVISOR = "supervisor"
    SCALER = "scaler"
    """KEDA's Kafka scaler: describes the workers' lag, nothing more."""
    PRODUCER = "producer"
    GATEWAY = "gateway"
    RESULT_CONSUMER = "result-consumer"


class Operation(Enum):
    """Kafka ACL operations, spelled as ``kafka-acls.sh --operation`` takes them."""

    READ = "Read"
    WRITE = "Write"
    DESCRIBE = "Describe"
    CREATE = "Create"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"


class Resource(Enum):
    TOPIC = "topic"
    GROUP = "group"


class Pattern(Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


_IMPLIED: Mapping[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}


@dataclass(frozen=True, kw_only=True)
class AclRule:
    """Allow ``operations`` on a topic or group (one name or a name prefix)."""

    resource: Resource
    name: str
    pattern: Pattern
    operations: tuple[Operation, ...]

    def covers(self, resource: Resource, name: str) -> bool:
        if resource is not self.resource:
            return False
        if self.pattern is Pattern.PREFIXED:
            return name.startswith(self.name)
        return name == self.name


GATEWAY_CLIENT = "gateway"
"""The client ids ``gateway-*`` (their reply topics ``<p>.reply.gateway-*``) are the
gateway role's: no producer is granted one."""


@dataclass(frozen=True, kw_only=True)
class AclScope:
    """What the ACLs are for: the served models and the known client ids."""

    models: tuple[str, ...]
    clients: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in (*self.models, *self.clients):
            check_model_name(name)
        for client in self.clients:
            if client == GATEWAY_CLIENT or client.startswith(f"{GATEWAY_CLIENT}-"):
                raise TopicNameError(
                    f"client id {client!r} is in the gateway's namespace: its reply topics "
                    "belong to the gateway role only"
                )


def allows(rules: Iterable[AclRule], resource: Resource, name: str, op: Operation) -> bool:
    """Whether ``rules`` allow ``op`` on ``name`` (with Kafka's implied operations)."""
    wanted = {op} | _IMPLIED.get(op, frozenset())
    return any(r.covers(resource, name) and wanted & set(r.operations) for r in rules)


_R, _W = Operation.READ, Operation.WRITE


def _topic(name: str, *ops: Operation, prefixed: bool = False) -> AclRule:
    pattern = Pattern.PREFIXED if prefixed else Pattern.LITERAL
    return AclRule(resource=Resource.TOPIC, name=name, pattern=pattern, operations=ops)


def _group(name: str, op: Operation = _R, *, prefixed: bool = False) -> AclRule:
    pattern = Pattern.PREFIXED if prefixed else Pattern.LITERAL
    return AclRule(resource=Resource.GROUP, name=name, pattern=pattern, operations=(op,))


def _worker_groups(layout: TopicLayout, model: str, op: Operation) -> AclRule:
    """The consumer groups of every version of ``model``'s workers."""
    return _group(f"{layout.prefix}-worker-{model}-", op, prefixed=True)


EVALUATION_CLIENT_ID = "policy-evaluations"
"""The client id the policy engine's step evaluations send under (their reply topic)."""


def lease_topic(layout: TopicLayout) -> str:
    """The policy engine's single-writer lease topic."""
    return f"{layout.prefix}.control.policy-lease"


def _setup(layout: TopicLayout) -> AclRule:
    """Create and describe any Graylane topic (services ensure theirs at start)."""
    return _topic(
        f"{layout.prefix}.",
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        prefixed=True,
    )


def _reply_prefix(layout: TopicLayout) -> str:
    return f"{layout.prefix}.reply."


def role_acls(layout: TopicLayout, role: KafkaRole, scope: AclScope) -> tuple[AclRule, ...]:
    """The ACLs one role needs, nothing more."""
    p, models = layout.prefix, scope.models
    rules: list[AclRule]
    if role is KafkaRole.ROUTER:
        rules = [_setup(layout), _topic(layout.routing(), _R), _topic(layout.dlq(), _W)]
        rules.append(_topic(_reply_prefix(layout), _W, prefixed=True))  # error replies
        for m in models:
            rules += [
                _topic(layout.ingress(m), _R),
                _topic(f"{layout.ingress(m)}.", _W, prefixed=True),  # version topics
                _topic(layout.results(m), _W),  # error results
                _topic(layout.shadow(m), _W),  # error results of shadow copies
            ]
        rules.append(_group(f"{p}-router"))
    elif role is KafkaRole.WORKER:
        rules = [_setup(layout), _topic(layout.precision(), _R), _topic(layout.cancels(), _R)]
        rules += [_topic(t, _W) for t in (layout.telemetry(), layout.dlq())]
        rules.append(_topic(_reply_prefix(layout), _W, prefixed=True))
        for m in models:
            rules += [
                _topic(f"{layout.ingress(m)}.", _R, prefixed=True),
                _topic(layout.results(m), _W),
                _topic(layout.shadow(m), _W),
                _worker_groups(layout, m, _R),
            ]
    elif role is KafkaRole.POLICY_ENGINE:
        rules = [_setup(layout)]
        rules += [_topic(t, _R) for t in (layout.telemetry(), layout.commands(), layout.outcomes())]
        rules += [
            _topic(t, _R, _W)
            for t in (layout.routing(), layout.precision(), layout.rollouts(), layout.scale())
        ]
        rules += [_topic(layout.audit(), _W), _topic(lease_topic(layout), _R, _W)]
        rules += [_topic(layout.shadow(m), _R) for m in models]
        # Step evaluations: the set goes to both versions' topics, answers to its reply topic.
        rules += [_topic(f"{layout.ingress(m)}.", _W, prefixed=True) for m in models]
        rules.append(
            _topic(
                layout.reply(EVALUATION_CLIENT_ID), _R, Operation.CREATE, Operation.DESCRIBE_CONFIGS
            )
        )
        rules.append(_group(f"{p}-policy"))
        # The liveness probe reads the worker groups' committed offsets.
        rules += [_worker_groups(layout, m, Operation.DESCRIBE) for m in models]
    elif role is KafkaRole.CONTROL_PLANE:
        rules = [
            _setup(layout),
            _topic(layout.commands(), _W),
            _topic(layout.audit(), _R),
            _topic(layout.rollouts(), _R),
            _topic(layout.scale(), _R),
            _topic(layout.dlq(), _W),  # notifications no webhook took
        ]
        # The START check: does a worker consume the candidate's topic?
        rules += [_worker_groups(layout, m, Operation.DESCRIBE) for m in models]
    elif role is KafkaRole.SUPERVISOR:
        # Reads the desired replicas; Describe of the version topics (their
        # partition count) comes with the setup rule.
        rules = [_setup(layout), _topic(layout.scale(), _R)]
    elif role is KafkaRole.SCALER:
        # The lag: offsets of the version topics (ListOffsets, Metadata) and the worker
        # groups' committed offsets (OffsetFetch, DescribeGroups). Describe only.
        rules = []
        for m in models:
            rules += [
                _topic(f"{layout.ingress(m)}.", Operation.DESCRIBE, prefixed=True),
                _worker_groups(layout, m, Operation.DESCRIBE),
            ]
    elif role is KafkaRole.PRODUCER:
        # Describe of other ingress topics is implied by Write; nothing else is visible.
        rules = [_topic(layout.ingress(m), _W) for m in models]
        rules.append(_topic(layout.cancels(), _W))  # cancels of its own generations
        for client in scope.clients:
            rules.append(
                _topic(
                    layout.reply(client),
                    _R,
                    Operation.CREATE,
                    Operation.DESCRIBE_CONFIGS,
                )
            )
    elif role is KafkaRole.GATEWAY:
        rules = [_topic(layout.ingress(m), _W) for m in models]
        rules.append(_topic(layout.cancels(), _W))
        rules.append(_topic(layout.outcomes(), _W))  # feedback on its answers
        rules.append(
            _topic(
                f"{_reply_prefix(layout)}gateway-",
                _R,
                Operation.CREATE,
                Operation.DESCRIBE_CONFIGS,
                prefixed=True,
            )
        )
        rules.append(_topic(f"{p}.requests.", Operation.DESCRIBE, prefixed=True))
    else:
        rules = [_topic(layout.results(m), _R) for m in models]
        rules.append(_group(f"{p}-results-", prefixed=True))
    return tuple(rules)


def all_acls(layout: TopicLayout, scope: AclScope) -> dict[KafkaRole, tuple[AclRule, ...]]:
    return {role: role_acls(layout, role, scope) for role in KafkaRole}


def kafka_acls_commands(
    rules: Sequence[AclRule],
    principal: str,
    *,
    bootstrap: str,
    command_config: str = "",
) -> list[str]:
    """``kafka-acls.sh --add`` command lines that grant ``rules`` to ``principal``."""
    head = ["kafka-acls.sh", "--bootstrap-server", bootstrap]
    if command_config:
        head += ["--command-config", command_config]
    head += ["--add", "--allow-principal", principal]
    lines = []
    for rule in rules:
        args = [*head]
        for op in rule.operations:
            args += ["--operation", op.value]
        args += [f"--{rule.resource.value}", rule.name]
        if rule.pattern is Pattern.PREFIXED:
            args += ["--resource-pattern-type", "prefixed"]
        lines.append(shlex.join(args))
    return lines
