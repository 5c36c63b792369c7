"""Apply :mod:`graylane.acls` rules to a broker (CreateAcls through the Kafka admin API).

The same rules ``graylane acls`` prints as ``kafka-acls.sh`` lines; this adapter grants them
directly, for ``graylane acls --apply`` and the secured-broker tests. It needs a principal
allowed to Alter the cluster (the super user of a local secured broker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, CreateAclsRequestStruct

from graylane.acls import AclRule, Operation, Pattern, Resource
from graylane.errors import GraylaneError

__all__ = ["AclApplyError", "AclBinding", "apply_acls", "bindings_for"]


class _ResourceType(IntEnum):  # org.apache.kafka.common.resource.ResourceType
    TOPIC = 2
    GROUP = 3


class _PatternType(IntEnum):  # PatternType
    LITERAL = 3
    PREFIXED = 4


class _AclOperation(IntEnum):  # AclOperation
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11


_ALLOW = 3  # AclPermissionType.ALLOW
_RESOURCES = {Resource.TOPIC: _ResourceType.TOPIC, Resource.GROUP: _ResourceType.GROUP}
_PATTERNS = {Pattern.LITERAL: _PatternType.LITERAL, Pattern.PREFIXED: _PatternType.PREFIXED}
_OPERATIONS = {
    Operation.READ: _AclOperation.READ,
    Operation.WRITE: _AclOperation.WRITE,
    Operation.CREATE: _AclOperation.CREATE,
    Operation.DESCRIBE: _AclOperation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS: _AclOperation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS: _AclOperation.ALTER_CONFIGS,
}


class _CreateManyAcls(CreateAclsRequest):  # type: ignore[misc]
    """CreateAcls (v1+) with many creations in one request; aiokafka's sends one."""

    def __init__(self, creations: Sequence[tuple[int, str, int, str, str, int, int]]) -> None:
        self._creations = list(creations)

    def build(self, request_struct_class: type[CreateAclsRequestStruct]) -> CreateAclsRequestStruct:
        if request_struct_class.API_VERSION < 1:  # v0 has no pattern type (prefixed ACLs)
            raise AclApplyError("the broker does not speak CreateAcls v1 (Kafka >= 2.0)")
        return request_struct_class(self._creations)


class AclApplyError(GraylaneError):
    """The broker refused one or more ACL bindings."""


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW binding on the wire: (resource, pattern, principal, operation)."""

    resource: Resource
    name: str
    pattern: Pattern
    principal: str
    operation: Operation

    def as_creation(self) -> tuple[int, str, int, str, str, int, int]:
        return (
            int(_RESOURCES[self.resource]),
            self.name,
            int(_PATTERNS[self.pattern]),
            self.principal,
            "*",
            int(_OPERATIONS[self.operation]),
            _ALLOW,
        )


def bindings_for(grants: Mapping[str, Sequence[AclRule]]) -> list[AclBinding]:
    """One binding per (principal, rule, operation), in a stable order."""
    return [
        AclBinding(rule.resource, rule.name, rule.pattern, principal, op)
        for principal, rules in grants.items()
        for rule in rules
        for op in rule.operations
    ]


async def apply_acls(admin: AIOKafkaAdminClient, bindings: Sequence[AclBinding]) -> int:
    """Create ``bindings`` (idempotent on the broker); returns how many were sent."""
    if not bindings:
        return 0
    request = _CreateManyAcls([b.as_creation() for b in bindings])
    response = await admin._send_request(request)
    refused = [
        f"{bindings[i].principal} {bindings[i].operation.value} {bindings[i].name}: "
        f"{message or code}"
        for i, (code, message) in enumerate(response.creation_responses)
        if code != 0
    ]
    if refused:
        raise AclApplyError("the broker refused ACLs:\n  " + "\n  ".join(refused))
    return len(bindings)
