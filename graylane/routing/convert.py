"""RoutingTable protobuf <-> :class:`RouteTable` (the adapter edge)."""

from __future__ import annotations

from graylane.routing.buckets import BucketRange
from graylane.routing.table import RouteTable, RoutingRule, VersionRoute
from graylane.v1 import control_pb2


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
        rules=tuple(
            RoutingRule(rule.name, tuple(sorted(rule.match_tags.items())), rule.version)
            for rule in pb.rules
        ),
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
        rules=[
            control_pb2.RoutingRule(
                name=rule.name, match_tags=dict(rule.match_tags), version=rule.version
            )
            for rule in table.rules
        ],
        shadow_version=table.shadow_version or "",
        shadow_share=table.shadow_share,
        epoch=table.epoch,
        allow_pinning=table.allow_pinning,
        updated_at_unix_ms=updated_at_unix_ms,
        rollout_id=table.rollout_id,
        reason=table.reason,
    )
