"""Pure routing: sticky buckets, monotone ranges, rules, pins and shadow sampling."""

from graylane.routing.buckets import BUCKETS, BucketRange, assign_ranges, bucket_of, sample_fraction
from graylane.routing.table import (
    RouteDecision,
    RouteReason,
    RouteTable,
    RoutingRequest,
    RoutingRule,
    UnknownPinnedVersion,
    VersionRoute,
    route,
    table_for_weights,
)

__all__ = [
    "BUCKETS",
    "BucketRange",
    "RouteDecision",
    "RouteReason",
    "RouteTable",
    "RoutingRequest",
    "RoutingRule",
    "UnknownPinnedVersion",
    "VersionRoute",
    "assign_ranges",
    "bucket_of",
    "route",
    "sample_fraction",
    "table_for_weights",
]
