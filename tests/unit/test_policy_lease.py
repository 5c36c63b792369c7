"""The single-writer lease fold: one holder, takeover only after expiry, racing claims."""

from __future__ import annotations

from graylane.policy_engine.logic.lease import Lease, LeaseClaim, fold, holds, next_claim

TTL = 6_000


def test_first_claim_takes_the_lease_and_renewals_extend_it() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL), LeaseClaim("a", 1, 2_000, TTL)])
    assert lease == Lease("a", 1, 8_000)
    assert holds(lease, "a", 7_999) and not holds(lease, "a", 8_000)
    assert not holds(lease, "b", 1_000)


def test_a_standby_cannot_claim_a_live_lease() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL)])
    assert next_claim(lease, "b", 5_999, TTL) is None
    # even if it writes one (a stale view), the fold ignores it
    assert fold([LeaseClaim("b", 2, 3_000, TTL)], lease) == lease


def test_takeover_after_expiry_and_the_old_holder_is_fenced() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL)])
    claim = next_claim(lease, "b", 6_000, TTL)
    assert claim == LeaseClaim("b", 2, 6_000, TTL)
    taken = fold([claim], lease)
    assert taken.holder == "b" and taken.term == 2
    # the old holder's late renewal (term 1) changes nothing
    assert fold([LeaseClaim("a", 1, 6_500, TTL)], taken) == taken
    assert not holds(taken, "a", 6_500)


def test_of_two_racing_claims_the_first_in_the_log_wins() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL)])
    b, c = LeaseClaim("b", 2, 7_000, TTL), LeaseClaim("c", 2, 7_001, TTL)
    assert fold([b, c], lease).holder == "b"
    assert fold([c, b], lease).holder == "c"


def test_a_release_lets_the_standby_in_at_once() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL), LeaseClaim("a", 1, 1_000, 1)])
    assert next_claim(lease, "b", 1_001, TTL) == LeaseClaim("b", 2, 1_001, TTL)


def test_an_expired_holder_reclaims_with_a_new_term() -> None:
    lease = fold([LeaseClaim("a", 1, 0, TTL)])
    assert next_claim(lease, "a", 7_000, TTL) == LeaseClaim("a", 2, 7_000, TTL)
