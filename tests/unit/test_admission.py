"""Deadline-aware admission as pure logic."""

from __future__ import annotations

from graylane.engine_worker.logic.admission import (
    NO_DEADLINE,
    Candidate,
    admit,
    effective_deadline,
)

NOW = 1_000_000


def per_row(ms: float):  # type: ignore[no-untyped-def]
    return lambda _position, rows: ms * rows


def batch(*deadlines: int, start: int = 0) -> list[Candidate[int]]:
    return [Candidate(start + i, d) for i, d in enumerate(deadlines)]


def test_effective_deadline_prefers_the_requests_own() -> None:
    assert effective_deadline(5000, 1000, 250) == 5000
    assert effective_deadline(0, 1000, 250) == 1250
    assert effective_deadline(0, 1000, 0) == NO_DEADLINE
    assert effective_deadline(0, 0, 250) == NO_DEADLINE


def test_everything_admitted_when_deadlines_are_far() -> None:
    result = admit([batch(NOW + 100, NOW + 100), batch(NOW + 100, start=2)], NOW, per_row(10))
    assert result.admitted == ((0, 1), (2,))
    assert result.shed == ()


def test_queue_ahead_sheds_the_requests_that_cannot_make_it() -> None:
    # each batch of 2 rows takes 20 ms: batch 0 done at +20, batch 1 at +40, batch 2 at +60
    batches = [batch(NOW + 50, NOW + 50), batch(NOW + 50, NOW + 50, start=2)]
    batches.append(batch(NOW + 50, NOW + 100, start=4))
    result = admit(batches, NOW, per_row(10))
    # batch 2 would end at +60: the +50 member is shed, the other then runs alone (+50)
    assert result.admitted == ((0, 1), (2, 3), (5,))
    assert [s.item for s in result.shed] == [4]
    shed = result.shed[0]
    assert shed.predicted_done_unix_ms == NOW + 60
    assert "10 ms late" in shed.reason


def test_shedding_keeps_later_requests_on_time() -> None:
    # a hopeless batch ahead is shed entirely and adds no time for those behind it
    batches = [batch(NOW + 5, NOW + 5), batch(NOW + 15, start=2)]
    result = admit(batches, NOW, per_row(10))
    assert result.admitted == ((), (2,))
    assert {s.item for s in result.shed} == {0, 1}


def test_requests_without_deadline_are_always_admitted() -> None:
    result = admit([batch(NO_DEADLINE, NOW + 1)], NOW, per_row(10))
    assert result.admitted == ((0,),)
    assert [s.item for s in result.shed] == [1]


def test_unknown_service_time_admits_everything() -> None:
    result = admit([batch(NOW - 1, NOW + 1)], NOW, lambda _p, _n: None)
    assert result.admitted == ((0, 1),)
    assert result.shed == ()


def test_empty_plan() -> None:
    assert admit([], NOW, per_row(1)).admitted == ()


def test_a_probe_runs_the_first_batch_whatever_its_prediction() -> None:
    """A stale, pessimistic estimate must not shed everything for ever: the probe
    runs the head batch (its time still counts ahead of the rest)."""
    batches = [batch(NOW + 5, NOW + 5), batch(NOW + 30, NOW + 45, start=2)]
    without = admit(batches, NOW, per_row(10))
    assert without.admitted == ((), (2, 3))
    probed = admit(batches, NOW, per_row(10), probe=True)
    # the head (done at +20) runs; behind it batch 1 would end at +40: +30 is shed
    assert probed.admitted == ((0, 1), (3,))
    assert [s.item for s in probed.shed] == [2]
