"""Pure routing: sticky buckets, monotone ranges, rules, pins and shadow sampling."""

from graylane.routing.buckets import BUCKETS, assign_ranges, bucket_of
from graylane.routing.table import (
    RouteReason,
    RouteTable,
    RoutingRequest,
    RoutingRule,
    UnknownPinnedVersion,
    route,
    table_for_weights,
)

__all__ = [
    "BUCKETS",
    "RouteReason",
    "RouteTable",
    "RoutingRequest",
    "RoutingRule",
    "UnknownPinnedVersion",
    "assign_ranges",
    "bucket_of",
    "route",
    "table_for_weights",
]
