"""Admission at the gateway's edge: API keys, token buckets, priorities, timeouts (pure)."""

from __future__ import annotations

import pytest

from graylane.priority import Priority
from graylane.services.gateway.logic.admission import (
    DEVELOPMENT_KEYS,
    ApiKeyError,
    CallerRole,
    GateVerdict,
    GatewayLimits,
    KeyRing,
    Tenant,
    exposure_problem,
    gate_verdict,
    parse_api_keys,
    parse_priority,
    parse_timeout,
    split_rate,
)
from graylane.services.gateway.state import Admission, BodyBudget, InFlightGate, TokenBucket

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
    limits = GatewayLimits(
        max_in_flight=8, sheddable_share=0.5, critical_headroom=0.25, tenant_share=1, fair_from=1
    )
    gate = InFlightGate(limits)
    admit, full = GateVerdict.ADMIT, GateVerdict.REPLICA_FULL
    assert [gate.cap(p) for p in Priority] == [10, 8, 4]
    for _ in range(4):
        assert gate.enter(Priority.SHEDDABLE) is admit
    assert gate.enter(Priority.SHEDDABLE) is full
    for _ in range(4):
        assert gate.enter(Priority.STANDARD) is admit
    assert gate.enter(Priority.STANDARD) is full
    assert gate.enter(Priority.CRITICAL, "ops") is admit
    assert gate.enter(Priority.CRITICAL, "ops") is admit
    assert gate.enter(Priority.CRITICAL, "ops") is full
    gate.leave()
    assert gate.running == 9 and gate.enter(Priority.STANDARD) is full


def test_one_tenant_cannot_fill_the_gate_and_starve_the_others() -> None:
    """Pins the global gate: one key filled every slot and every other tenant got 503."""
    gate = InFlightGate(GatewayLimits(max_in_flight=100))
    taken = 0
    while gate.enter(Priority.STANDARD, "noisy") is GateVerdict.ADMIT:
        taken += 1
    assert taken == 50  # its cap: half the gate
    assert gate.enter(Priority.STANDARD, "noisy") is GateVerdict.TENANT_CAP
    # past fair_from, a newcomer still gets in, up to its fair share (100 / 2 tenants)
    quiet = sum(gate.enter(Priority.STANDARD, "quiet") is GateVerdict.ADMIT for _ in range(60))
    assert quiet == 50 and gate.running == 100
    gate.leave("noisy")
    assert gate.running_of("noisy") == 49
    # a third tenant's first call fits the freed place; the noisy one is past its share
    assert gate.enter(Priority.STANDARD, "third") is GateVerdict.ADMIT
    gate.leave("third")
    assert gate.running_of("third") == 0


def test_fair_share_shrinks_as_tenants_arrive() -> None:
    limits = GatewayLimits(max_in_flight=90, tenant_share=1.0, fair_from=0.5)
    args = {"priority_cap": 90, "limits": limits}
    # below fair_from of the gate, anyone under its cap may enter
    assert gate_verdict(running=44, tenant_running=44, tenants_running=1, **args) is (
        GateVerdict.ADMIT
    )
    # past it, three tenants share 90: 30 each
    assert gate_verdict(running=60, tenant_running=30, tenants_running=3, **args) is (
        GateVerdict.FAIR_SHARE
    )
    assert gate_verdict(running=60, tenant_running=29, tenants_running=3, **args) is (
        GateVerdict.ADMIT
    )
    assert gate_verdict(running=90, tenant_running=0, tenants_running=4, **args) is (
        GateVerdict.REPLICA_FULL
    )


def test_the_body_budget_holds_per_tenant_and_per_replica() -> None:
    limits = GatewayLimits(max_body_bytes=100, max_buffered_bytes=400, tenant_share=0.5)
    budget = BodyBudget(limits)
    admit = GateVerdict.ADMIT
    assert budget.take("a", 200) is admit
    assert budget.take("a", 1) is GateVerdict.TENANT_CAP  # a's half
    assert budget.take("b", 150) is admit and budget.take("c", 50) is admit
    assert budget.take("c", 1) is GateVerdict.REPLICA_FULL
    budget.give_back("a", 200)
    assert budget.held == 200 and budget.take("c", 100) is admit


def test_keys_state_their_priorities_and_tags() -> None:
    keys = parse_api_keys(
        f"{KEY_A}:infer:team-a,{KEY_B}:infer:team-b:5:10:critical+standard:cohort+region"
    )
    a, b = sorted(keys.values(), key=lambda t: t.name)
    assert a.priorities == {Priority.STANDARD} and not a.may_tag("cohort")
    assert b.priorities == {Priority.CRITICAL, Priority.STANDARD}
    assert b.may_tag("cohort") and b.may_tag("region") and not b.may_tag("other")
    anyone = next(iter(parse_api_keys(f"{KEY_A}:infer:t:::sheddable:*").values()))
    assert anyone.priorities == {Priority.SHEDDABLE} and anyone.may_tag("whatever")
    with pytest.raises(ApiKeyError, match="priorities"):
        parse_api_keys(f"{KEY_A}:infer:t:1:1:urgent")


def test_a_replica_holds_its_share_of_a_rate_limit() -> None:
    """Pins per-replica buckets: N replicas multiplied every key's limit by N."""
    assert split_rate(50.0, 100, 4) == (12.5, 25)
    assert split_rate(1.0, 2, 5) == (0.2, 1)
    now = [0.0]
    admission = Admission(
        GatewayLimits(replicas=4), KeyRing(parse_api_keys(f"{KEY_A}:infer:t:8:8"))
    )
    found = admission.identify(f"Bearer {KEY_A}")
    assert found is not None
    admission.clock = lambda: now[0]
    taken = sum(admission.throttle(*found) == 0.0 for _ in range(10))
    assert taken == 2  # a quarter of the burst of 8
    now[0] = 1.0
    assert sum(admission.throttle(*found) == 0.0 for _ in range(10)) == 2  # 8/s over 4 replicas


def test_committed_development_keys_are_known() -> None:
    ring = KeyRing(parse_api_keys("local-gateway-key-0123456:infer:local," + f"{KEY_A}:infer:a"))
    assert ring.development_tenants() == ["local"]
    assert KeyRing(parse_api_keys(f"{KEY_A}:infer:a")).development_tenants() == []
    assert "local-gateway-key-0123456" in DEVELOPMENT_KEYS


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


def test_no_auth_and_development_keys_stay_on_loopback() -> None:
    """Pins ``--no-auth`` on 0.0.0.0 and the committed local-overlay key off loopback."""
    dev = KeyRing(parse_api_keys("local-gateway-key-0123456:infer:local"))
    real = KeyRing(parse_api_keys(f"{KEY_A}:infer:a"))
    for host in ("127.0.0.1", "::1", "localhost", "[::1]"):
        assert exposure_problem(host, None) is None
        assert exposure_problem(host, dev) is None
    for host in ("0.0.0.0", "::", "10.0.0.7", "gateway.example"):
        problem = exposure_problem(host, None)
        assert problem is not None and "--no-auth-beyond-loopback" in problem
        assert exposure_problem(host, None, forced=True) is None
        development = exposure_problem(host, dev)
        assert development is not None and "development keys" in development
        assert exposure_problem(host, dev, forced=True) is not None  # never, even forced
        assert exposure_problem(host, real) is None


def test_jinja2_is_pinned_past_its_sandbox_escapes() -> None:
    """CVE-2024-56326 and CVE-2025-27516 are fixed in 3.1.6; ``>=3.1`` admitted 3.1.5."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    (jinja,) = [Requirement(d) for d in deps if Requirement(d).name == "jinja2"]
    assert not jinja.specifier.contains("3.1.5") and jinja.specifier.contains("3.1.6")
    installed = tuple(int(x) for x in version("jinja2").split(".")[:3])
    assert installed >= (3, 1, 6)
