"""Priority-aware shedding: the least urgent requests go first (pure logic)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graylane.engine_worker.logic.admission import (
    NO_DEADLINE,
    Candidate,
    _KeptQueue,
    admit,
    admit_by_priority,
    request_priority,
)
from graylane.priority import PRIORITY_TAG, Priority

NOW = 1_000_000
CRIT, STD, SHED = Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE


def per_row(ms: float):  # type: ignore[no-untyped-def]
    return lambda _position, rows: ms * rows


def test_sheddable_requests_ahead_are_shed_to_keep_a_critical_one_on_time() -> None:
    # 10 ms a row: batch 0 (2 sheddable) done at +20, the critical one behind it at +30;
    # its deadline +15 is met only when the sheddable ones do not run ahead of it
    batches = [
        [Candidate(0, NOW + 100, SHED), Candidate(1, NOW + 100, SHED)],
        [Candidate(2, NOW + 15, CRIT)],
    ]
    plain = admit(batches, NOW, per_row(10))
    assert [s.item for s in plain.shed] == [2]  # without priorities, the critical one is lost
    result = admit_by_priority(batches, NOW, per_row(10))
    assert result.admitted == ((), (2,))
    assert sorted(s.item for s in result.shed) == [0, 1]
    assert all(s.displaced for s in result.shed)
    assert "more urgent" in result.shed[0].reason


def test_a_late_sheddable_request_keeps_its_deadline_reason() -> None:
    batches = [[Candidate(0, NOW + 15, CRIT)], [Candidate(1, NOW + 12, SHED)]]
    result = admit_by_priority(batches, NOW, per_row(10))
    assert result.admitted == ((0,), ())
    (shed,) = result.shed
    assert shed.item == 1 and not shed.displaced
    assert shed.predicted_done_unix_ms == NOW + 20
    assert "8 ms late" in shed.reason


def test_sheddable_requests_that_fit_still_run() -> None:
    batches = [
        [Candidate(0, NOW + 100, CRIT), Candidate(1, NOW + 100, SHED)],
        [Candidate(2, NOW + 32, STD), Candidate(3, NOW + 100, SHED)],
    ]
    # all together: batch 0 done at +20, batch 1 at +40, past the standard one's +32;
    # sheddable 1 fits (batch 1 alone then ends at +30), sheddable 3 would not
    assert [s.item for s in admit(batches, NOW, per_row(10)).shed] == [2]
    result = admit_by_priority(batches, NOW, per_row(10))
    assert result.admitted == ((0, 1), (2,))
    assert [(s.item, s.displaced) for s in result.shed] == [(3, True)]


def test_one_priority_is_plain_admission() -> None:
    batches = [[Candidate(0, NOW + 5), Candidate(1, NOW + 50)], [Candidate(2, NOW + 15)]]
    assert admit_by_priority(batches, NOW, per_row(10)) == admit(batches, NOW, per_row(10))


def test_priority_tag_parsing() -> None:
    assert request_priority({PRIORITY_TAG: "sheddable"}) is SHED
    assert request_priority({PRIORITY_TAG: " Critical "}) is CRIT
    assert request_priority({PRIORITY_TAG: "urgent!"}) is STD
    assert request_priority({}) is STD


@st.composite
def queues(draw: st.DrawFn) -> list[list[Candidate[int]]]:
    sizes = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    batches: list[list[Candidate[int]]] = []
    n = 0
    for size in sizes:
        batch = []
        for _ in range(size):
            deadline = draw(st.one_of(st.just(NO_DEADLINE), st.integers(NOW - 5, NOW + 120)))
            batch.append(Candidate(n, deadline, draw(st.sampled_from(Priority))))
            n += 1
        batches.append(batch)
    return batches


COSTS = st.tuples(st.integers(0, 20), st.integers(0, 15))


def estimate(costs: tuple[int, int]):  # type: ignore[no-untyped-def]
    fixed, row = costs
    return lambda _position, rows: float(fixed + row * rows)


@settings(max_examples=300, deadline=None)
@given(queues(), COSTS, st.booleans())
def test_every_request_is_either_admitted_or_shed_once(
    batches: list[list[Candidate[int]]], costs: tuple[int, int], probe: bool
) -> None:
    result = admit_by_priority(batches, NOW, estimate(costs), probe=probe)
    assert len(result.admitted) == len(batches)
    out = [i for b in result.admitted for i in b] + [s.item for s in result.shed]
    assert sorted(out) == [c.item for b in batches for c in b]
    for position, kept in enumerate(result.admitted):  # admitted keep their batch and order
        assert list(kept) == [c.item for c in batches[position] if c.item in kept]


@settings(max_examples=300, deadline=None)
@given(queues(), COSTS)
def test_the_admitted_plan_is_on_time(
    batches: list[list[Candidate[int]]], costs: tuple[int, int]
) -> None:
    result = admit_by_priority(batches, NOW, estimate(costs))
    kept = {i for b in result.admitted for i in b}
    again = admit([[c for c in b if c.item in kept] for b in batches], NOW, estimate(costs))
    assert again.shed == ()


@settings(max_examples=300, deadline=None)
@given(queues(), COSTS, st.booleans())
def test_less_urgent_traffic_never_changes_a_more_urgent_outcome(
    batches: list[list[Candidate[int]]], costs: tuple[int, int], probe: bool
) -> None:
    result = admit_by_priority(batches, NOW, estimate(costs), probe=probe)
    admitted = {i for b in result.admitted for i in b}
    urgency = [CRIT, STD, SHED]
    for level in range(2):
        allowed = set(urgency[: level + 1])
        alone = [[c for c in b if c.priority in allowed] for b in batches]
        alone_result = admit_by_priority(alone, NOW, estimate(costs), probe=probe)
        alone_admitted = {i for b in alone_result.admitted for i in b}
        urgent_items = {c.item for b in alone for c in b}
        assert admitted & urgent_items == alone_admitted


@settings(max_examples=300, deadline=None)
@given(queues(), COSTS, st.booleans())
def test_each_shed_reason_is_what_admitting_it_would_do(
    batches: list[list[Candidate[int]]], costs: tuple[int, int], probe: bool
) -> None:
    # below the most urgent priority present (that one is plain admission's)
    result = admit_by_priority(batches, NOW, estimate(costs), probe=probe)
    kept = {i for b in result.admitted for i in b}
    levels = {c.priority for b in batches for c in b}
    top = min(levels, key=[CRIT, STD, SHED].index) if levels else CRIT
    priority = {c.item: c.priority for b in batches for c in b}
    for shed in result.shed:
        if priority[shed.item] is top:
            continue
        with_it = [[c for c in b if c.item in kept | {shed.item}] for b in batches]
        trial = admit(with_it, NOW, estimate(costs), probe=probe)
        harmed = {s.item for s in trial.shed} - {shed.item}
        if shed.displaced:
            assert harmed, "a displaced request would have made an admitted one late"
        else:  # late itself (when it was planned it harmed no one; later ones may fit)
            assert shed.item in {s.item for s in trial.shed}


def uneven(costs: tuple[int, int]):  # type: ignore[no-untyped-def]
    """Estimates that are unknown for batch 2 and not monotone in rows elsewhere."""
    fixed, row = costs
    return lambda position, rows: (
        None if position == 2 else float(fixed + row * rows + (7 if rows % 3 == 0 else 0))
    )


@settings(max_examples=300, deadline=None)
@given(queues(), COSTS, st.booleans(), st.booleans(), st.data())
def test_one_more_kept_request_is_judged_as_admit_would(
    batches: list[list[Candidate[int]]],
    costs: tuple[int, int],
    probe: bool,
    monotone: bool,
    data: st.DataObject,
) -> None:
    # the per-batch bookkeeping priority shedding uses instead of re-planning every member
    keys = [(p, i) for p, b in enumerate(batches) for i in range(len(b))]
    if not keys:
        return
    service = estimate(costs) if monotone else uneven(costs)
    extra = data.draw(st.sampled_from(keys))
    kept = {k for k in keys if k != extra and data.draw(st.booleans())}
    position, index = extra
    deadline = batches[position][index].deadline_unix_ms
    answer = _KeptQueue(batches, kept, NOW, service, probe=probe).with_one_more(position, deadline)
    chosen = [
        [c for i, c in enumerate(b) if (p, i) in kept | {extra}] for p, b in enumerate(batches)
    ]
    plan = admit(chosen, NOW, service, probe=probe)
    extra_item = batches[position][index].item
    assert answer.shed == len(plan.shed)
    assert answer.own_shed == (extra_item in {s.item for s in plan.shed})
    assert answer.done == plan.done_unix_ms[position]
