"""RoutingTable protobuf <-> :class:`RouteTable` (the adapter edge)."""

from __future__ import annotations

from collections.abc import Sequence

from graylane.routing.table import BucketRange, RouteTable, RoutingRule, VersionRoute, check_rules
from graylane.v1 import control_pb2, rollout_pb2


def rule_from_pb(pb: control_pb2.RoutingRule) -> RoutingRule:
    return RoutingRule(pb.name, tuple(sorted(pb.match_tags.items())), pb.version)


def rule_to_pb(rule: RoutingRule) -> control_pb2.RoutingRule:
    return control_pb2.RoutingRule(
        name=rule.name, match_tags=dict(rule.match_tags), version=rule.version
    )


def route_config_rules(pb: rollout_pb2.RouteConfig) -> tuple[RoutingRule, ...]:
    """The cohort rules of a RouteConfig message, checked (:class:`InvalidRouteRule`)."""
    rules = tuple(rule_from_pb(r) for r in pb.rules)
    check_rules(pb.model, rules)
    return rules


def route_config_to_pb(
    model: str, rules: Sequence[RoutingRule], allow_pinning: bool
) -> rollout_pb2.RouteConfig:
    return rollout_pb2.RouteConfig(
        model=model, rules=[rule_to_pb(r) for r in rules], allow_pinning=allow_pinning
    )


def table_from_pb(pb: control_pb2.RoutingTable) -> RouteTable:
    return RouteTable(
        model=pb.model,
        stable_version=pb.stable_version,
        routes=tuple(
            VersionRoute(
                r.version,
                r.weight_percent,
                tuple(BucketRange(x.start, x.end) for x in r.ranges),
            )
            for r in pb.routes
        ),
        rules=tuple(rule_from_pb(rule) for rule in pb.rules),
        shadow_version=pb.shadow_version or None,
        shadow_share=pb.shadow_share,
        epoch=pb.epoch,
        allow_pinning=pb.allow_pinning,
        rollout_id=pb.rollout_id,
        reason=pb.reason,
    )


def table_to_pb(table: RouteTable, *, updated_at_unix_ms: int = 0) -> control_pb2.RoutingTable:
    return control_pb2.RoutingTable(
        model=table.model,
        stable_version=table.stable_version,
        routes=[
            control_pb2.VersionRoute(
                version=r.version,
                weight_percent=r.weight_percent,
                ranges=[control_pb2.BucketRange(start=x.start, end=x.end) for x in r.ranges],
            )
            for r in table.routes
        ],
        rules=[rule_to_pb(rule) for rule in table.rules],
        shadow_version=table.shadow_version or "",
        shadow_share=table.shadow_share,
        epoch=table.epoch,
        allow_pinning=table.allow_pinning,
        updated_at_unix_ms=updated_at_unix_ms,
        rollout_id=table.rollout_id,
        reason=table.reason,
    )
