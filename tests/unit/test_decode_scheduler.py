from __future__ import annotations

import pytest

from graylane.engine_worker.kv_decode import should_compact
from graylane.engine_worker.logic.scheduler import (
    DecodeJoin,
    DecodeScheduler,
    SchedulerError,
    SchedulerLimits,
)


def scheduler(rows: int, prefill: int | None = None) -> DecodeScheduler:
    return DecodeScheduler(SchedulerLimits(max_batch_size=rows, max_prefill_tokens=prefill))


def test_waiting_sequences_fill_free_rows_first_in_first_out() -> None:
    s = scheduler(3)
    for seq_id in (10, 11, 12, 13, 14):
        s.submit(seq_id, 4)
    assert s.admit() == DecodeJoin((10, 11, 12), first_row=0)
    assert s.running == (10, 11, 12)
    assert s.waiting == (13, 14)
    assert s.admit() == DecodeJoin((), first_row=3)  # full: nobody joins


def test_finished_rows_leave_between_steps_and_waiting_ones_join_behind() -> None:
    s = scheduler(3)
    for seq_id in range(5):
        s.submit(seq_id, 2)
    s.admit()
    # Sequence 1 finishes first: the others keep their order, nobody waits for the longest.
    assert s.leave([1]) == (0, 2)
    assert s.running == (0, 2)
    assert s.admit() == DecodeJoin((3,), first_row=2)
    assert s.running == (0, 2, 3)
    assert s.leave([0, 3]) == (1,)
    assert s.admit() == DecodeJoin((4,), first_row=1)
    assert s.running == (2, 4)
    s.leave([2, 4])
    assert s.idle


def test_sequences_submitted_while_running_join_at_the_next_admission() -> None:
    s = scheduler(4)
    s.submit(0, 3)
    s.admit()
    s.submit(1, 5)
    assert s.running == (0,) and s.waiting == (1,)
    assert s.admit() == DecodeJoin((1,), first_row=1)


def test_prefill_budget_caps_prompt_tokens_per_step_but_always_admits_one() -> None:
    s = scheduler(8, prefill=10)
    s.submit(0, 20)  # over budget alone: still joins, or it would never run
    s.submit(1, 6)
    s.submit(2, 4)
    s.submit(3, 1)
    assert s.admit().joining == (0,)
    assert s.admit().joining == (1, 2)
    assert s.admit().joining == (3,)


def test_misuse_is_refused() -> None:
    s = scheduler(2)
    s.submit(0, 1)
    with pytest.raises(SchedulerError):
        s.submit(0, 1)
    with pytest.raises(SchedulerError):
        s.submit(1, 0)
    with pytest.raises(SchedulerError):
        s.leave([0])  # waiting, not running
    s.admit()
    s.leave([0])
    s.submit(0, 1)  # an id may be reused once its sequence has left
    with pytest.raises(SchedulerError):
        SchedulerLimits(max_batch_size=0)
    with pytest.raises(SchedulerError):
        SchedulerLimits(max_batch_size=1, max_prefill_tokens=0)


@pytest.mark.parametrize(
    ("width", "lengths", "expected"),
    [
        (40, [10, 20], True),  # 20 columns of holes in every row, half the width
        (40, [10, 25], False),  # holes under half the width
        (20, [5, 8], False),  # under the 16-column minimum
        (0, [], False),
        (3, [], True),  # no rows left: drop the leftover columns
    ],
)
def test_compaction_only_when_holes_dominate(
    width: int, lengths: list[int], expected: bool
) -> None:
    assert should_compact(width, lengths) is expected
