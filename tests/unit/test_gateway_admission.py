"""Admission at the gateway's edge: API keys, token buckets, priorities, timeouts (pure)."""

from __future__ import annotations

import pytest

from graylane.services.gateway.logic.admission import (
    ApiKeyError,
    CallerRole,
    GatewayLimits,
    KeyRing,
    Priority,
    Tenant,
    parse_api_keys,
    parse_priority,
    parse_timeout,
)
from graylane.services.gateway.state import Admission, InFlightGate, TokenBucket

KEY_A = "a" * 16 + "-alpha"
KEY_B = "b" * 16 + "-bravo"


def test_keys_are_held_as_digests_and_name_their_tenant() -> None:
    keys = parse_api_keys(f"{KEY_A}:infer:team-a  # comment\n{KEY_B}:INFER:team-b:2.5:7")
    assert KEY_A not in keys and KEY_B not in keys
    assert sorted(keys.values(), key=lambda t: t.name) == [
        Tenant("team-a", CallerRole.INFER),
        Tenant("team-b", CallerRole.INFER, 2.5, 7),
    ]
    ring = KeyRing(keys)
    found = ring.tenant_of(f"Bearer {KEY_B}")
    assert found is not None and found[1].name == "team-b"
    assert ring.tenant_of(f"bearer  {KEY_A} ") is not None
    assert ring.tenant_of(f"Basic {KEY_A}") is None
    assert ring.tenant_of("Bearer someone-elses-key-000000") is None
    assert ring.tenant_of(None) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("short:infer:team", "fewer than 16"),
        (f"{KEY_A}:admin:team", "unknown role"),
        (f"{KEY_A}:infer", "KEY:ROLE:TENANT"),
        (f"{KEY_A}:infer:team:fast", "numbers"),
        (f"{KEY_A}:infer:team:-1", ">= 0"),
        (f"{KEY_A}:infer:a,{KEY_A}:infer:b", "twice"),
    ],
)
def test_unusable_key_entries_are_refused_without_showing_the_key(text: str, why: str) -> None:
    with pytest.raises(ApiKeyError, match=why) as refused:
        parse_api_keys(text)
    assert KEY_A not in str(refused.value)


def test_no_keys_at_all_is_refused() -> None:
    with pytest.raises(ApiKeyError, match="--no-auth"):
        KeyRing.from_sources("", None)


def test_a_token_bucket_allows_its_burst_then_says_when_the_next_token_comes() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)
    assert [bucket.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(10.0) == pytest.approx(0.5)
    assert bucket.take(10.25) == pytest.approx(0.25)  # half a token came back
    assert bucket.take(10.5) == 0.0
    assert bucket.take(100.0) == 0.0  # refilled, but never above the burst
    assert [bucket.take(100.0) for _ in range(3)][-1] == pytest.approx(0.5)


def test_each_key_has_its_own_bucket_and_a_key_without_a_rate_gets_the_default() -> None:
    now = [0.0]
    keys = KeyRing(parse_api_keys(f"{KEY_A}:infer:team-a:1:1,{KEY_B}:infer:team-b"))
    admission = Admission(GatewayLimits(default_burst=2), keys, clock=lambda: now[0])
    a = admission.identify(f"Bearer {KEY_A}")
    b = admission.identify(f"Bearer {KEY_B}")
    assert a is not None and b is not None
    assert admission.throttle(*a) == 0.0
    assert admission.throttle(*a) == pytest.approx(1.0)
    assert [admission.throttle(*b) for _ in range(3)] == [0.0, 0.0, pytest.approx(1 / 50)]
    now[0] = 1.0
    assert admission.throttle(*a) == 0.0


def test_an_open_gateway_calls_everyone_anonymous() -> None:
    admission = Admission(GatewayLimits(), None)
    assert admission.identify(None) == ("", Admission.ANONYMOUS)


def test_sheddable_calls_are_refused_first_and_critical_ones_last() -> None:
    gate = InFlightGate(GatewayLimits(max_in_flight=8, sheddable_share=0.5, critical_headroom=0.25))
    assert [gate.cap(p) for p in Priority] == [10, 8, 4]
    for _ in range(4):
        assert gate.enter(Priority.SHEDDABLE)
    assert not gate.enter(Priority.SHEDDABLE)
    for _ in range(4):
        assert gate.enter(Priority.STANDARD)
    assert not gate.enter(Priority.STANDARD)
    assert gate.enter(Priority.CRITICAL) and gate.enter(Priority.CRITICAL)
    assert not gate.enter(Priority.CRITICAL)
    gate.leave()
    assert gate.running == 9 and not gate.enter(Priority.STANDARD)


def test_priority_and_timeout_headers() -> None:
    assert parse_priority(None) is Priority.STANDARD
    assert parse_priority(" Sheddable ") is Priority.SHEDDABLE
    with pytest.raises(ValueError, match="critical, standard, sheddable"):
        parse_priority("urgent")
    assert parse_timeout(None, None, default_s=60, max_s=600) == (60, False)
    assert parse_timeout("1500", 99, default_s=60, max_s=600) == (1.5, True)  # header first
    assert parse_timeout(None, 2, default_s=60, max_s=600) == (2.0, True)
    assert parse_timeout(None, 9999, default_s=60, max_s=600) == (600, True)
    for header, body in (("soon", None), ("-5", None), (None, True), (None, 0)):
        with pytest.raises(ValueError):
            parse_timeout(header, body, default_s=60, max_s=600)
