"""The pipelined loop's bookkeeping (:class:`InFlightCycles`), without a broker: which
prefix is committable, what a failure rewinds, what a rebalance forgets, the cap.

The state machine at the end drives it the way the loop does (fetch, settle in any
order, fail, commit, rebalance with positions reset to the group's offsets, a batch
fetched before a rebalance and handled after it) and checks at-least-once after every
step: the group's offset never passes a record that nobody acknowledged.
"""

from __future__ import annotations

import pytest
from aiokafka import ConsumerRecord, TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from graylane.kafka.in_flight import InFlightCycles, Replay
from graylane.kafka.seam import Record

T = "requests.m.v1"
P0, P1, P2 = (TopicPartition(T, p) for p in range(3))


def rec(partition: int, offset: int) -> Record:
    return ConsumerRecord(T, partition, offset, 0, 0, None, b"", None, -1, -1, ())


def recs(partition: int, *offsets: int) -> list[Record]:
    return [rec(partition, o) for o in offsets]


def test_cycles_settled_out_of_order_commit_only_the_settled_prefix() -> None:
    cycles = InFlightCycles(4)
    a, b, c = cycles.open(recs(0, 0, 1)), cycles.open(recs(0, 2, 3)), cycles.open(recs(0, 4, 5))
    cycles.settle(c)
    cycles.settle(b)
    assert cycles.advance() == []  # the oldest is not acknowledged: nothing past it
    assert cycles.ready == {}
    assert len(cycles) == 3
    cycles.settle(a)
    assert cycles.advance() == [a, b, c]
    assert cycles.ready == {P0: 6}
    assert len(cycles) == 0


def test_the_prefix_is_committed_per_partition_at_its_highest_next_offset() -> None:
    cycles = InFlightCycles(4)
    a = cycles.open(recs(0, 0, 1) + recs(1, 0))
    b = cycles.open(recs(1, 1, 2))
    c = cycles.open(recs(0, 2) + recs(2, 7))
    cycles.settle(a)
    cycles.settle(c)
    cycles.advance()
    assert cycles.ready == {P0: 2, P1: 1}  # c waits behind b, though on other partitions
    cycles.settle(b)
    cycles.advance()
    assert cycles.ready == {P0: 3, P1: 3, P2: 8}


def test_committed_offsets_leave_ready_only_what_grew_since() -> None:
    cycles = InFlightCycles(2)
    cycles.settle(cycles.open(recs(0, 0, 1) + recs(1, 4)))
    cycles.advance()
    ready = cycles.ready
    cycles.settle(cycles.open(recs(0, 2)))
    cycles.advance()  # P0 grew to 3 while the commit of `ready` was under way
    cycles.committed(ready)
    assert cycles.ready == {P0: 3}
    cycles.committed({P0: 3})
    assert cycles.ready == {}


def test_a_failure_in_the_middle_drops_the_later_cycles_and_names_the_rewind_offsets() -> None:
    cycles = InFlightCycles(8)
    a = cycles.open(recs(0, 0, 1))
    b = cycles.open(recs(0, 2, 3) + recs(1, 5))
    c = cycles.open(recs(1, 6) + recs(2, 0))
    d = cycles.open(recs(0, 4))
    cycles.settle(c)
    replay = cycles.fail(b)
    assert replay == Replay({P0: 2, P1: 5, P2: 0}, (b, c, d))
    assert cycles.keys == [a]
    assert not cycles.settle(c)  # dropped: its acknowledgement no longer counts
    cycles.settle(a)
    cycles.advance()
    assert cycles.ready == {P0: 2}
    assert cycles.fail(d) == Replay({}, ())  # already dropped


def test_the_cap_is_respected_and_a_settled_cycle_holds_its_slot_until_committable() -> None:
    cycles = InFlightCycles(2)
    a, b = cycles.open(recs(0, 0)), cycles.open(recs(0, 1))
    assert cycles.full
    with pytest.raises(ValueError):
        cycles.open(recs(0, 2))
    cycles.settle(b)
    cycles.advance()
    assert cycles.full  # b waits behind a
    cycles.settle(a)
    cycles.advance()
    assert not cycles.full
    with pytest.raises(ValueError):
        InFlightCycles(0)
    with pytest.raises(ValueError):
        cycles.open([])


def test_forgotten_partitions_are_neither_committed_nor_rewound() -> None:
    cycles = InFlightCycles(4)
    a = cycles.open(recs(0, 0) + recs(1, 0))
    cycles.settle(a)
    cycles.advance()
    b = cycles.open(recs(1, 1))
    c = cycles.open(recs(0, 1) + recs(1, 2))
    assert cycles.partitions_held == {P0, P1}
    assert cycles.forget({P1}) == [b]  # b had nothing else
    assert cycles.ready == {P0: 1}
    assert cycles.partitions(c) == {P0}
    assert cycles.fail(c) == Replay({P0: 1}, (c,))


# -- at-least-once under any interleaving ----------------------------------------------

PARTITIONS = (P0, P1, P2)


class CyclesAgainstAGroup(RuleBasedStateMachine):
    """The loop's use of :class:`InFlightCycles` against a model of a partitioned log
    and its consumer group: positions, the group's offsets, who acknowledged what."""

    @initialize(cap=st.integers(1, 5))
    def start(self, cap: int) -> None:
        self.cycles = InFlightCycles(cap)
        self.position = dict.fromkeys(PARTITIONS, 0)
        self.group = dict.fromkeys(PARTITIONS, 0)  # the group's committed offsets
        self.acked: dict[TopicPartition, set[int]] = {tp: set() for tp in PARTITIONS}
        self.assigned = set(PARTITIONS)
        self.records: dict[int, list[Record]] = {}
        self.held: list[Record] | None = None  # fetched, not yet handled
        self.spanned = False  # a held batch was fetched before a rebalance

    def _fetch(self, counts: list[int]) -> list[Record]:
        batch: list[Record] = []
        for tp, count in zip(PARTITIONS, counts, strict=True):
            if tp in self.assigned:
                start = self.position[tp]
                batch += recs(tp.partition, *range(start, start + count))
                self.position[tp] = start + count
        return batch

    def _open(self, batch: list[Record]) -> None:
        self.records[self.cycles.open(batch)] = batch

    @precondition(lambda self: not self.cycles.full and self.held is None)
    @rule(counts=st.lists(st.integers(0, 3), min_size=3, max_size=3), hold=st.booleans())
    def fetch(self, counts: list[int], hold: bool) -> None:
        batch = self._fetch(counts)
        if not batch:
            return
        if hold:
            self.held = batch  # e.g. a fetch hook still waiting for more
        else:
            self._open(batch)

    @precondition(lambda self: not self.cycles.full and self.held is not None)
    @rule()
    def handle_held(self) -> None:
        batch, self.held = self.held, None
        assert batch is not None
        self._open(batch)

    def _unsettled(self) -> list[int]:
        return [k for k in self.cycles.keys if not self.cycles.settled(k)]

    @precondition(lambda self: bool(self._unsettled()))
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._unsettled()))
        for r in self.records[key]:
            self.acked[TopicPartition(r.topic, r.partition)].add(r.offset)
        assert self.cycles.settle(key)

    # the loop acts on a failure between turns, never with a fetched batch in hand
    @precondition(lambda self: bool(self._unsettled()) and self.held is None)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._unsettled()))
        replay = self.cycles.fail(key)
        assert replay.dropped[0] == key
        assert not any(self.cycles.tracks(k) for k in replay.dropped)
        for tp, offset in replay.offsets.items():
            if tp in self.assigned:  # what seek_back does
                self.position[tp] = offset

    @rule()
    def commit(self) -> None:
        self.cycles.advance()
        ready = self.cycles.ready
        for tp, offset in ready.items():
            if tp in self.assigned:
                self.group[tp] = offset
        self.cycles.committed(ready)  # committed, or given up on a partition gone

    @rule(
        settles=st.lists(st.booleans(), max_size=5),
        keep=st.sets(st.sampled_from(PARTITIONS)),
        others=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    )
    def rebalance(self, settles: list[bool], keep: set[TopicPartition], others: list[int]) -> None:
        """Every partition is revoked (the drain sees the cycles ``settles`` says settle
        in time, then commits), then ``keep`` is assigned back; the other member reads
        and commits some of the rest."""
        self.spanned |= self.held is not None
        for key, settles_in_time in zip(self._unsettled(), settles, strict=False):
            if settles_in_time:
                self.acknowledge_key(key)
        self.commit()
        for tp, extra in zip(PARTITIONS, others, strict=True):
            if tp not in self.assigned:  # the other member's turn on it
                self.acked[tp].update(range(self.group[tp], self.group[tp] + extra))
                self.group[tp] += extra
        self.assigned = set(keep)
        self.cycles.forget(self.cycles.partitions_held - self.assigned)
        for tp in self.assigned:
            self.position[tp] = self.group[tp]  # a new assignment starts from the commit

    def acknowledge_key(self, key: int) -> None:
        for r in self.records[key]:
            self.acked[TopicPartition(r.topic, r.partition)].add(r.offset)
        self.cycles.settle(key)

    @rule()
    def everything_acknowledged_is_committed(self) -> None:
        for _ in range(2):  # what is in flight, then a batch held back
            for key in self._unsettled():
                self.acknowledge_key(key)
            self.commit()
            assert len(self.cycles) == 0
            if self.held is not None:
                self.handle_held()
        for tp in self.assigned:
            passed = [o for o in range(self.position[tp]) if o not in self.acked[tp]]
            assert not passed, (tp, passed)  # nothing the consumer went past is lost
            if not self.spanned:  # (a batch from before a rebalance may commit lower:
                # read again, never lost) nothing read is left uncommitted
                assert self.group[tp] >= self.position[tp], (tp, self.group, self.position)

    @invariant()
    def the_group_never_passes_an_unacknowledged_record(self) -> None:
        for tp, offset in self.group.items():
            missing = [o for o in range(offset) if o not in self.acked[tp]]
            assert not missing, (tp, offset, missing)

    @invariant()
    def at_most_cap_cycles(self) -> None:
        assert len(self.cycles) <= self.cycles.cap


CyclesAgainstAGroup.TestCase.settings = settings(max_examples=300, stateful_step_count=40)
TestCyclesAgainstAGroup = CyclesAgainstAGroup.TestCase


def test_a_batch_fetched_before_a_rebalance_commits_nothing_past_a_cycle_still_in_flight() -> None:
    """The drain timed out with a cycle in flight on a partition the group gives back:
    that cycle stays tracked, so the batch fetched before the rebalance (handled after
    it) cannot commit past the unacknowledged record. (Forgetting every revoked
    partition at the revocation committed offset 2 here with offset 0 unacknowledged.)"""
    machine = CyclesAgainstAGroup()
    machine.start(cap=2)
    machine.fetch([1, 0, 0], hold=False)  # offset 0, in flight
    machine.fetch([1, 0, 0], hold=True)  # offset 1, fetched and not handled yet
    machine.rebalance(settles=[False], keep={P0}, others=[0, 0, 0])
    machine.handle_held()
    [_, late] = machine.cycles.keys
    machine.acknowledge_key(late)
    machine.commit()
    machine.the_group_never_passes_an_unacknowledged_record()
    assert machine.group[P0] == 0
    machine.everything_acknowledged_is_committed()
    assert machine.group[P0] == 2
