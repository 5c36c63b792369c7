from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane.routing.convert import table_from_pb, table_to_pb
from graylane.routing.table import (
    BUCKETS,
    RouteReason,
    RoutingRequest,
    RoutingRule,
    UnknownPinnedVersion,
    WeightError,
    assign_ranges,
    bucket_of,
    route,
    table_for_weights,
)

KEYS = [f"user-{i}" for i in range(100_000)]


@pytest.mark.parametrize("candidate_percent", [1.0, 5.0, 25.0, 50.0, 90.0])
def test_split_over_100k_keys_is_within_one_point_of_the_weights(candidate_percent: float) -> None:
    table = table_for_weights(model="m", stable_version="v1", weights=[("v2", candidate_percent)])
    counts = Counter(route(table, RoutingRequest(k, k)).version for k in KEYS)
    share = 100.0 * counts["v2"] / len(KEYS)
    assert abs(share - candidate_percent) <= 1.0, share
    assert counts["v1"] + counts["v2"] == len(KEYS)


def test_three_way_split() -> None:
    table = table_for_weights(model="m", stable_version="v1", weights=[("v2", 20.0), ("v3", 30.0)])
    counts = Counter(route(table, RoutingRequest(k, k)).version for k in KEYS)
    assert abs(100 * counts["v2"] / len(KEYS) - 20) <= 1
    assert abs(100 * counts["v3"] / len(KEYS) - 30) <= 1
    assert abs(100 * counts["v1"] / len(KEYS) - 50) <= 1


def test_a_key_on_the_candidate_stays_there_as_the_weight_rises() -> None:
    weights = [0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0]
    first_on_candidate: dict[str, int] = {}
    for i, w in enumerate(weights):
        table = table_for_weights(model="m", stable_version="v1", weights=[("v2", w)])
        for k in KEYS[:20_000]:
            on_candidate = route(table, RoutingRequest(k, k)).version == "v2"
            if k in first_on_candidate:
                assert on_candidate, f"{k} left the candidate at {w}%"
            elif on_candidate:
                first_on_candidate[k] = i
    assert len(first_on_candidate) == 20_000  # at 100% everyone is on it


@given(st.text(max_size=40))
def test_bucket_is_stable_and_in_range(key: str) -> None:
    b = bucket_of(key)
    assert 0 <= b < BUCKETS
    assert bucket_of(key) == b


def test_bucket_is_a_fixed_function_of_the_key() -> None:
    # Pinned values: changing the hash would move users between versions.
    assert [bucket_of(k) for k in ("alice", "bob", "")] == [
        bucket_of("alice"),
        bucket_of("bob"),
        bucket_of(""),
    ]
    assert len({bucket_of(f"k{i}") for i in range(1000)}) > 900


def test_rules_come_before_weights() -> None:
    table = table_for_weights(
        model="m",
        stable_version="v1",
        weights=[("v2", 0.0)],
        rules=[RoutingRule("testers", (("group", "internal"),), "v2")],
    )
    d = route(table, RoutingRequest("r1", "user-1", {"group": "internal"}))
    assert (d.version, d.reason, d.rule) == ("v2", RouteReason.RULE, "testers")
    d = route(table, RoutingRequest("r2", "user-1", {"group": "public"}))
    assert (d.version, d.reason) == ("v1", RouteReason.BUCKET)


def test_rule_with_no_tags_matches_nothing() -> None:
    table = table_for_weights(model="m", stable_version="v1", rules=[RoutingRule("x", (), "v2")])
    assert route(table, RoutingRequest("r", "k", {"a": "b"})).version == "v1"


def test_pins_are_honoured_only_when_allowed() -> None:
    closed = table_for_weights(model="m", stable_version="v1", weights=[("v2", 0.0)])
    assert route(closed, RoutingRequest("r", "k", pinned_version="v2")).version == "v1"
    open_ = table_for_weights(
        model="m", stable_version="v1", weights=[("v2", 0.0)], allow_pinning=True
    )
    d = route(open_, RoutingRequest("r", "k", pinned_version="v2"))
    assert (d.version, d.reason) == ("v2", RouteReason.PINNED)
    with pytest.raises(UnknownPinnedVersion, match="v9"):
        route(open_, RoutingRequest("r", "k", pinned_version="v9"))


def test_shadow_share_is_sampled_per_request() -> None:
    table = table_for_weights(model="m", stable_version="v1", shadow_version="v2", shadow_share=0.2)
    decisions = [route(table, RoutingRequest(f"req-{i}", "same-user")) for i in range(20_000)]
    assert all(d.version == "v1" for d in decisions)
    share = sum(d.shadow_version == "v2" for d in decisions) / len(decisions)
    assert abs(share - 0.2) < 0.01


def test_no_shadow_copy_of_a_request_already_on_the_shadow_version() -> None:
    table = table_for_weights(
        model="m",
        stable_version="v1",
        weights=[("v2", 100.0)],
        shadow_version="v2",
        shadow_share=1.0,
    )
    assert route(table, RoutingRequest("r", "k")).shadow_version is None


@pytest.mark.parametrize(
    "weights",
    [
        [("v2", 60.0), ("v3", 50.0)],
        [("v2", -1.0)],
        [("v2", 101.0)],
        [("v1", 5.0)],
        [("v2", 5.0), ("v2", 5.0)],
    ],
)
def test_bad_weights_are_rejected(weights: list[tuple[str, float]]) -> None:
    with pytest.raises(WeightError):
        assign_ranges("v1", weights)


def test_protobuf_round_trip() -> None:
    table = table_for_weights(
        model="m",
        stable_version="v1",
        weights=[("v2", 5.0)],
        rules=[RoutingRule("testers", (("group", "internal"),), "v2")],
        shadow_version="v3",
        shadow_share=0.1,
        epoch=42,
        allow_pinning=True,
        rollout_id="ro-1",
        reason="advance",
    )
    assert table_from_pb(table_to_pb(table)) == table
