"""Deadline-aware admission: shed at once what cannot finish in time (pure logic).

The worker hands over the batches it has planned for one cycle, in run order,
each with its members' deadlines, and a service-time estimate per batch size
(measured, see :mod:`~graylane.engine_worker.logic.batch_learner`). A request whose
predicted completion (the batches ahead of it plus its own) is past its
deadline is shed: answered ``SHED`` without running, so the client knows
immediately and the requests admitted after it are not delayed by it. With no
estimate (nothing measured yet, or a task the estimate does not cover) every
request is admitted: the worker cannot tell. The native backend's ``admit_cycle`` is the
worker's use of it: deadlines from its requests, estimates for forward batches.

**Priority.** The gateway tags each request with its caller's priority (the
``priority`` tag: ``critical``, ``standard`` or ``sheddable``; untagged is
standard). When a cycle must shed, :func:`admit_by_priority` sheds the least
urgent first: the most urgent requests are planned as if nothing else were
queued, and each less urgent one is admitted only if it still meets its own
deadline without making any request already admitted late. So the outcome of a
more urgent request never depends on the less urgent traffic queued with it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from graylane.priority import PRIORITY_TAG, Priority

__all__ = [
    "ADMISSION_PROBE_MS",
    "NO_DEADLINE",
    "AdmissionPlan",
    "Candidate",
    "ServiceEstimate",
    "Shed",
    "admit",
    "admit_by_priority",
    "effective_deadline",
    "request_priority",
]

NO_DEADLINE = 0


def effective_deadline(own_unix_ms: int, created_unix_ms: int, default_ms: float) -> int:
    """The request's own deadline, else ``created + default_ms``; 0 when neither is set."""
    if own_unix_ms > 0:
        return own_unix_ms
    if default_ms > 0 and created_unix_ms > 0:
        return created_unix_ms + int(default_ms)
    return NO_DEADLINE


ItemT = TypeVar("ItemT")


@dataclass(frozen=True, slots=True)
class Candidate(Generic[ItemT]):
    """A planned request and its absolute deadline (unix ms, 0 = none)."""

    item: ItemT
    deadline_unix_ms: int
    priority: Priority = Priority.STANDARD


_URGENCY = {Priority.CRITICAL: 0, Priority.STANDARD: 1, Priority.SHEDDABLE: 2}
"""Order in which priorities are planned (most urgent first)."""


@dataclass(frozen=True, slots=True)
class Shed(Generic[ItemT]):
    """A request refused, with the completion time that was predicted for it."""

    item: ItemT
    deadline_unix_ms: int
    predicted_done_unix_ms: float
    displaced: bool = False
    """It would have met its own deadline, but only by making a more urgent request late
    (``predicted_done_unix_ms`` is then its deadline: it would have finished by it)."""

    @property
    def reason(self) -> str:
        if self.displaced:
            return "shed to keep more urgent requests on time under the queue ahead"
        late = self.predicted_done_unix_ms - self.deadline_unix_ms
        return f"deadline cannot be met: predicted {late:.0f} ms late under the queue ahead"


@dataclass(frozen=True, slots=True)
class AdmissionPlan(Generic[ItemT]):
    """Per planned batch, the members that run (possibly none), and those shed."""

    admitted: tuple[tuple[ItemT, ...], ...]
    shed: tuple[Shed[ItemT], ...]
    done_unix_ms: tuple[float | None, ...] = ()
    """Per planned batch, the completion its members were judged by (its full size);
    ``None`` where the estimate is unknown."""


ServiceEstimate = Callable[[int, int], float | None]
"""(batch position, rows) -> predicted engine ms for that batch, or None: unknown."""


def admit(
    batches: Sequence[Sequence[Candidate[ItemT]]],
    now_unix_ms: float,
    service_ms: ServiceEstimate,
    *,
    probe: bool = False,
) -> AdmissionPlan[ItemT]:
    """Walk the batches in run order, shedding members that would finish late.

    A batch's completion is predicted as ``now`` plus the estimated time of every
    batch ahead (with its admitted rows only) plus its own. Shedding a member
    only shrinks its batch, which never makes the others later, so one pass
    suffices. Unknown estimates admit the whole batch and add nothing ahead.

    ``probe``: the first batch runs whatever its prediction (its time still
    counts ahead of the others). The caller asks for it when nothing ran for a
    while: estimates come only from batches that ran, so a stale, too
    pessimistic one could otherwise shed everything for ever.
    """
    clock = float(now_unix_ms)
    admitted: list[tuple[ItemT, ...]] = []
    shed: list[Shed[ItemT]] = []
    dones: list[float | None] = []
    for position, batch in enumerate(batches):
        estimate = service_ms(position, len(batch)) if batch else 0.0
        if estimate is None:
            admitted.append(tuple(c.item for c in batch))
            dones.append(None)
            continue
        done = clock + estimate
        dones.append(done)
        keep: list[Candidate[ItemT]] = []
        for c in batch:
            if (
                (probe and position == 0)
                or c.deadline_unix_ms == NO_DEADLINE
                or c.deadline_unix_ms >= done
            ):
                keep.append(c)
            else:
                shed.append(Shed(c.item, c.deadline_unix_ms, done))
        if keep and len(keep) < len(batch):
            smaller = service_ms(position, len(keep))
            estimate = estimate if smaller is None else min(estimate, smaller)
        admitted.append(tuple(c.item for c in keep))
        if keep:
            clock += estimate
    return AdmissionPlan(tuple(admitted), tuple(shed), tuple(dones))


def admit_by_priority(
    batches: Sequence[Sequence[Candidate[ItemT]]],
    now_unix_ms: float,
    service_ms: ServiceEstimate,
    *,
    probe: bool = False,
) -> AdmissionPlan[ItemT]:
    """:func:`admit`, shedding the least urgent requests first (see the module's docstring).

    The most urgent priority present is planned by :func:`admit` alone. Each less
    urgent level is then added whole if that sheds nothing, else member by member in
    run order, each kept only if the plan with it sheds nothing already kept (the
    final plan is the last such plan: nothing kept is late in it). Once a member makes
    a kept request late, the level's other members of that batch are settled from that
    plan's completion for the batch, not planned again: estimates that grow with rows
    make them late alike. When the whole queue fits, or every request has one priority,
    this is :func:`admit`.
    """
    whole = admit(batches, now_unix_ms, service_ms, probe=probe)
    if not whole.shed:
        return whole
    levels = sorted({c.priority for b in batches for c in b}, key=_URGENCY.__getitem__)
    if len(levels) < 2:
        return whole

    def plan(kept: set[tuple[int, int]]) -> AdmissionPlan[tuple[int, int]]:
        chosen = [
            [Candidate((p, i), c.deadline_unix_ms) for i, c in enumerate(b) if (p, i) in kept]
            for p, b in enumerate(batches)
        ]
        return admit(chosen, now_unix_ms, service_ms, probe=probe)

    def members(level: Priority) -> list[tuple[int, int]]:
        return [
            (p, i) for p, b in enumerate(batches) for i, c in enumerate(b) if c.priority is level
        ]

    first = plan(set(members(levels[0])))
    kept = {key for batch in first.admitted for key in batch}
    predicted = {s.item: s.predicted_done_unix_ms for s in first.shed}
    displaced: set[tuple[int, int]] = set()
    for level in levels[1:]:
        trial = plan(kept | set(members(level)))
        if not trial.shed:
            kept |= set(members(level))
            continue
        # Member by member: one more member changes only its batch's size, so the kept
        # set is held as per-batch counts and sorted deadlines (_KeptQueue), not re-planned.
        queue = _KeptQueue(batches, kept, now_unix_ms, service_ms, probe=probe)
        blocking: dict[int, float] = {}  # batch -> its completion with one more member
        for key in members(level):
            position, index = key
            deadline = batches[position][index].deadline_unix_ms
            if position in blocking:
                # Another member of this level made a kept request late with this kept set
                # and batch size: so does this one, unless it is late itself and shed, which
                # shrinks its batch back (then only its batch's kept members can be late).
                done = blocking[position]
                late = deadline != NO_DEADLINE and deadline < done
                exempt = probe and position == 0
                if late and not exempt and not queue.late_in(position, done):
                    predicted[key] = done
                    continue
                displaced.add(key)
                predicted[key] = float(deadline)
                continue
            with_it = queue.with_one_more(position, deadline)
            if with_it.shed == 0:
                kept.add(key)
                queue.add(position, deadline)
                continue
            if with_it.own_shed and with_it.shed == 1:  # late itself, harming no one
                assert with_it.done is not None  # it was judged by its batch's completion
                predicted[key] = with_it.done
                continue
            if with_it.done is not None:
                blocking[position] = with_it.done
            displaced.add(key)
            predicted[key] = float(deadline)
    final = plan(kept)
    admitted = tuple(tuple(batches[p][i].item for p, i in batch) for batch in final.admitted)
    shed = tuple(
        Shed(c.item, c.deadline_unix_ms, predicted[(p, i)], displaced=(p, i) in displaced)
        for p, b in enumerate(batches)
        for i, c in enumerate(b)
        if (p, i) not in kept
    )
    return AdmissionPlan(admitted, shed, final.done_unix_ms)


@dataclass(frozen=True, slots=True)
class _OneMore:
    """:func:`admit` on the kept requests plus one: how many it sheds, whether the added
    one is among them, and the completion its batch is judged by (``None``: unknown)."""

    shed: int
    own_shed: bool
    done: float | None


class _KeptQueue:
    """The kept requests of a priority plan as per-batch counts and sorted deadlines.

    :meth:`with_one_more` answers what :func:`admit` would on the kept requests plus
    one more, exactly, in O(batches x log rows) instead of re-planning every request:
    a batch's members are judged only by their count and deadlines.
    """

    def __init__(
        self,
        batches: Sequence[Sequence[Candidate[ItemT]]],
        kept: set[tuple[int, int]],
        now_unix_ms: float,
        service_ms: ServiceEstimate,
        *,
        probe: bool,
    ) -> None:
        self._now = float(now_unix_ms)
        self._service_ms = service_ms
        self._probe = probe
        self._counts = [0] * len(batches)
        self._deadlines: list[list[int]] = [[] for _ in batches]
        """Per batch, the kept members' deadlines (those that have one), ascending."""
        for position, index in kept:
            self.add(position, batches[position][index].deadline_unix_ms)

    def add(self, position: int, deadline: int) -> None:
        self._counts[position] += 1
        if deadline != NO_DEADLINE:
            insort(self._deadlines[position], deadline)

    def late_in(self, position: int, done: float) -> bool:
        """Whether a kept member of batch ``position`` has a deadline before ``done``."""
        deadlines = self._deadlines[position]
        return bool(deadlines) and deadlines[0] < done

    def with_one_more(self, position: int, deadline: int) -> _OneMore:
        clock, shed, own_shed, done_here = self._now, 0, False, None
        for q, count in enumerate(self._counts):
            n = count + (q == position)
            estimate = self._service_ms(q, n) if n else 0.0
            if estimate is None:
                continue  # admitted whole, adding nothing ahead
            done = clock + estimate
            late = 0
            if not (self._probe and q == 0):
                late = bisect_left(self._deadlines[q], done)
                if q == position and deadline != NO_DEADLINE and deadline < done:
                    late, own_shed = late + 1, True
            if q == position:
                done_here = done
            shed += late
            keep = n - late
            if keep and keep < n:
                smaller = self._service_ms(q, keep)
                estimate = estimate if smaller is None else min(estimate, smaller)
            if keep:
                clock += estimate
        return _OneMore(shed, own_shed, done_here)


def request_priority(tags: Mapping[str, str]) -> Priority:
    """The priority a request's tags name (standard when untagged or unknown)."""
    try:
        return Priority(tags.get(PRIORITY_TAG, Priority.STANDARD.value).strip().lower())
    except ValueError:
        return Priority.STANDARD


ADMISSION_PROBE_MS = 1000
"""After this long without running a batch, admission lets the next one run (a probe)."""
