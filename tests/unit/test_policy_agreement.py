"""Shadow output agreement: pairing, comparison, bounds, expiry, duplicates."""

from __future__ import annotations

import pytest

from graylane.policy_engine.logic.agreement import (
    AgreementStats,
    AgreementTracker,
    OutputField,
    ShadowOutput,
    outputs_agree,
)


def out(rid: str, version: str, at: int = 0, **kw: object) -> ShadowOutput:
    return ShadowOutput(request_id=rid, version=version, at_ms=at, **kw)  # type: ignore[arg-type]


def test_comparison_rules() -> None:
    assert outputs_agree(out("a", "x", tokens=(1, 2, 3)), out("a", "y", tokens=(1, 2, 3)))
    assert not outputs_agree(out("a", "x", tokens=(1, 2, 3)), out("a", "y", tokens=(1, 2, 4)))
    assert outputs_agree(out("a", "x", label=7), out("a", "y", label=7))
    assert outputs_agree(out("a", "x", vector=(1.0, 2.0)), out("a", "y", vector=(1.005, 2.0)))
    assert not outputs_agree(out("a", "x", vector=(1.0, 2.0)), out("a", "y", vector=(1.2, 2.0)))
    assert not outputs_agree(out("a", "x", vector=(1.0,)), out("a", "y", vector=(1.0, 2.0)))
    assert outputs_agree(out("a", "x", error=True), out("a", "y", error=True))
    assert not outputs_agree(out("a", "x", error=True), out("a", "y", label=1))
    assert not outputs_agree(out("a", "x", label=1), out("a", "y", tokens=(1,)))


def test_pairs_in_either_order() -> None:
    t = AgreementTracker("v1", "v2")
    assert t.add(out("r1", "v1", 10, label=1)) is None
    r = t.add(out("r1", "v2", 25, label=1))
    assert r is not None and r.agreed and r.completed_at_ms == 25
    assert t.add(out("r2", "v2", 30, label=1)) is None
    r = t.add(out("r2", "v1", 40, label=2))
    assert r is not None and not r.agreed
    assert t.stats() == AgreementStats(2, 1)
    assert t.stats().rate == 0.5
    assert t.stats(since_ms=30) == AgreementStats(1, 0)
    assert t.stats(until_ms=30) == AgreementStats(1, 1)
    assert t.pending == 0


def test_duplicates_and_foreign_versions_are_ignored() -> None:
    t = AgreementTracker("v1", "v2")
    t.add(out("r1", "v1", label=1))
    assert t.add(out("r1", "v1", label=1)) is None
    t.add(out("r1", "v2", label=1))
    assert t.add(out("r1", "v2", label=1)) is None  # redelivered after pairing
    assert t.add(out("r9", "v7", label=1)) is None
    assert (t.duplicates, t.foreign, t.pending) == (2, 1, 0)
    assert t.stats() == AgreementStats(1, 1)


def test_pending_map_is_bounded_and_expires() -> None:
    t = AgreementTracker("v1", "v2", max_pending=3, ttl_ms=1_000)
    for i in range(5):
        t.add(out(f"r{i}", "v1", at=i * 100, label=1))
    assert t.pending == 3 and t.evicted == 2
    # r0's first half was evicted: its second half waits alone (and evicts r2).
    assert t.add(out("r0", "v2", at=0, label=1)) is None
    assert t.evicted == 3
    assert t.expire(1_300) == 2  # r0 (0 ms) and r3 (300 ms) waited 1 s; r4 has not
    assert t.pending == 1


def test_stats_validation_and_merge() -> None:
    with pytest.raises(ValueError):
        AgreementStats(3, 4)
    assert AgreementStats(3, 2).merge(AgreementStats(7, 7)) == AgreementStats(10, 9)
    assert AgreementStats().rate == 0.0
    with pytest.raises(ValueError):
        AgreementTracker("v1", "v1")


def test_one_client_request_id_never_pairs_across_router_pairs() -> None:
    """Pairs are keyed by the router's pair id, not the client's request id: two requests
    with one request id and different post-processing, answered out of order, pair each
    baseline with its own candidate, and the different schemas never meet."""
    argmax = (OutputField("label", "int64", (1,)),)
    topk = (OutputField("indices", "int64", (1, 5)), OutputField("values", "float32", (1, 5)))
    t = AgreementTracker("v1", "v2")
    assert t.add(out("dup", "v1", 1, label=3, schema=argmax, pair_id="0-1-5")) is None
    assert t.add(out("dup", "v2", 2, label=9, schema=topk, pair_id="0-2-6")) is None
    first = t.add(out("dup", "v1", 3, label=9, schema=topk, pair_id="0-2-6"))
    second = t.add(out("dup", "v2", 4, label=3, schema=argmax, pair_id="0-1-5"))
    assert first is not None and first.agreed
    assert second is not None and second.agreed
    assert t.mismatch is None and t.stats() == AgreementStats(2, 2)
    assert t.duplicates == 0


def test_answers_with_and_without_a_pair_id_never_pair() -> None:
    """An answer from a component that predates pair ids pairs by request id only with
    another such answer: a client's request id cannot complete a router's pair."""
    t = AgreementTracker("v1", "v2")
    assert t.add(out("r1", "v1", 1, label=1, pair_id="0-7-1")) is None
    assert t.add(out("0-7-1", "v2", 2, label=2)) is None
    assert t.add(out("r1", "v2", 3, label=2)) is None
    assert t.pending == 3
    legacy = t.add(out("0-7-1", "v1", 4, label=2))
    assert legacy is not None and legacy.agreed
    paired = t.add(out("r9", "v2", 5, label=1, pair_id="0-7-1"))
    assert paired is not None and paired.agreed and paired.request_id == "r1"


def test_a_redelivered_pair_id_is_a_duplicate() -> None:
    t = AgreementTracker("v1", "v2")
    t.add(out("a", "v1", 1, label=1, pair_id="p"))
    assert t.add(out("a", "v2", 2, label=1, pair_id="p")) is not None
    assert t.add(out("a", "v2", 3, label=1, pair_id="p")) is None
    assert t.duplicates == 1
