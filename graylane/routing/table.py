"""The routing function: (table, request facts) -> where the request goes.

Order of precedence: tag rules, then an explicit version pin (when the table
allows pinning), then the sticky bucket ranges. Without a table, the model's
stable version from configuration serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from graylane.errors import GraylaneError
from graylane.routing.buckets import BucketRange, assign_ranges, bucket_of, sample_fraction


class RouteReason(Enum):
    RULE = "rule"
    PINNED = "pinned"
    BUCKET = "bucket"
    NO_TABLE = "no-table"


class UnknownPinnedVersion(GraylaneError, LookupError):
    """A request pinned a version the model does not route to."""


@dataclass(frozen=True)
class RoutingRule:
    """Requests whose tags contain every ``match_tags`` pair go to ``version``."""

    name: str
    match_tags: tuple[tuple[str, str], ...]
    version: str

    def matches(self, tags: Mapping[str, str]) -> bool:
        return bool(self.match_tags) and all(tags.get(k) == v for k, v in self.match_tags)


@dataclass(frozen=True)
class VersionRoute:
    version: str
    weight_percent: float
    ranges: tuple[BucketRange, ...]


@dataclass(frozen=True, kw_only=True)
class RouteTable:
    model: str
    stable_version: str
    routes: tuple[VersionRoute, ...] = ()
    rules: tuple[RoutingRule, ...] = ()
    shadow_version: str | None = None
    shadow_share: float = 0.0
    epoch: int = 0
    allow_pinning: bool = False
    rollout_id: str = ""
    reason: str = ""

    def versions(self) -> frozenset[str]:
        found = {self.stable_version, *(r.version for r in self.routes)}
        found.update(rule.version for rule in self.rules)
        if self.shadow_version:
            found.add(self.shadow_version)
        return frozenset(found)

    def weight_of(self, version: str) -> float:
        return sum(r.weight_percent for r in self.routes if r.version == version)


@dataclass(frozen=True)
class RouteDecision:
    version: str
    reason: RouteReason
    bucket: int
    rule: str | None = None
    shadow_version: str | None = None
    epoch: int = 0


@dataclass(frozen=True)
class RoutingRequest:
    """What the router knows of a request when it routes it."""

    request_id: str
    routing_key: str
    tags: Mapping[str, str] = field(default_factory=dict)
    pinned_version: str = ""


def table_for_weights(
    *,
    model: str,
    stable_version: str,
    weights: Sequence[tuple[str, float]] = (),
    rules: Sequence[RoutingRule] = (),
    shadow_version: str | None = None,
    shadow_share: float = 0.0,
    epoch: int = 0,
    allow_pinning: bool = False,
    rollout_id: str = "",
    reason: str = "",
) -> RouteTable:
    """Build a table from weights in percent; the stable version gets the rest."""
    ranges = assign_ranges(stable_version, weights)
    total = sum(w for _, w in weights)
    routes = (
        *tuple(VersionRoute(v, w, (ranges[v],)) for v, w in weights),
        VersionRoute(stable_version, max(0.0, 100.0 - total), (ranges[stable_version],)),
    )
    if not 0.0 <= shadow_share <= 1.0:
        raise ValueError(f"shadow share {shadow_share} is outside 0..1")
    return RouteTable(
        model=model,
        stable_version=stable_version,
        routes=routes,
        rules=tuple(rules),
        shadow_version=shadow_version,
        shadow_share=shadow_share,
        epoch=epoch,
        allow_pinning=allow_pinning,
        rollout_id=rollout_id,
        reason=reason,
    )


def route(table: RouteTable, facts: RoutingRequest) -> RouteDecision:
    """Where one request goes, and whether a shadow copy goes to the candidate."""
    bucket = bucket_of(facts.routing_key or facts.request_id)
    decision = _primary(table, facts, bucket)
    shadow = table.shadow_version
    if (
        shadow
        and shadow != decision.version
        and table.shadow_share > 0.0
        and sample_fraction(facts.request_id) < table.shadow_share
    ):
        decision = RouteDecision(
            decision.version, decision.reason, bucket, decision.rule, shadow, table.epoch
        )
    return decision


def _primary(table: RouteTable, facts: RoutingRequest, bucket: int) -> RouteDecision:
    if facts.pinned_version and facts.pinned_version not in table.versions():
        raise UnknownPinnedVersion(
            f"version {facts.pinned_version[:128]!r} of model {table.model!r} is not served; "
            f"served versions: {', '.join(sorted(table.versions()))}"
        )
    for rule in table.rules:
        if rule.matches(facts.tags):
            return RouteDecision(
                rule.version, RouteReason.RULE, bucket, rule.name, None, table.epoch
            )
    if facts.pinned_version and table.allow_pinning:
        return RouteDecision(
            facts.pinned_version, RouteReason.PINNED, bucket, None, None, table.epoch
        )
    for r in table.routes:
        if any(bucket in rng for rng in r.ranges):
            return RouteDecision(r.version, RouteReason.BUCKET, bucket, None, None, table.epoch)
    return RouteDecision(table.stable_version, RouteReason.BUCKET, bucket, None, None, table.epoch)


def table_problem(table: RouteTable) -> str | None:
    """Why ``table`` cannot be applied (a name no topic can carry), or None."""
    from graylane.topics import TopicNameError, check_model_name, check_version_name

    try:
        check_model_name(table.model)
        for version in sorted(table.versions()):
            check_version_name(version)
    except TopicNameError as exc:
        return str(exc)[:300]
    return None


def default_table(model: str, stable_version: str) -> RouteTable:
    """The table used before the policy engine has published one."""
    return RouteTable(model=model, stable_version=stable_version, epoch=0)


def route_without_table(model: str, stable_version: str, facts: RoutingRequest) -> RouteDecision:
    """The stable version; a pin of any other version is ``UnknownPinnedVersion``."""
    if facts.pinned_version and facts.pinned_version != stable_version:
        raise UnknownPinnedVersion(
            f"version {facts.pinned_version[:128]!r} of model {model!r} is not served; "
            f"served versions: {stable_version}"
        )
    bucket = bucket_of(facts.routing_key or facts.request_id)
    return RouteDecision(stable_version, RouteReason.NO_TABLE, bucket)
