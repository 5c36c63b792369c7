"""Pure routing: the traffic split, sticky buckets, monotone ranges, rules, pins, shadow.

Room: the library, pure. May import the library's pure modules; no Kafka, no service.
"""

from graylane.routing.table import (
    BUCKETS,
    RouteReason,
    RouteTable,
    RoutingRequest,
    RoutingRule,
    UnknownPinnedVersion,
    assign_ranges,
    bucket_of,
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
