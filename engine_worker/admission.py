"""Deadline-aware admission: shed at once what cannot finish in time (pure logic).

The worker hands over the batches it has planned for one cycle, in run order,
each with its members' deadlines, and a service-time estimate per batch size
(measured, see :mod:`~graylane.engine_worker.batch_learner`). A request whose
predicted completion (the batches ahead of it plus its own) is past its
deadline is shed: answered ``SHED`` without running, so the client knows
immediately and the requests admitted after it are not delayed by it. With no
estimate (nothing measured yet, or a task the estimate does not cover) every
request is admitted: the worker cannot tell. :func:`admit_cycle` is the
worker's use of it: deadlines from its requests, estimates for forward batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from graylane.engine_worker.batching import PlannedBatch
from graylane.engine_worker.requests import Job, TaskKind

__all__ = [
    "ADMISSION_PROBE_MS",
    "NO_DEADLINE",
    "AdmissionPlan",
    "Candidate",
    "ServiceEstimate",
    "Shed",
    "admit",
    "admit_cycle",
    "effective_deadline",
    "forward_only",
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


@dataclass(frozen=True, slots=True)
class Shed(Generic[ItemT]):
    """A request refused, with the completion time that was predicted for it."""

    item: ItemT
    deadline_unix_ms: int
    predicted_done_unix_ms: float

    @property
    def reason(self) -> str:
        late = self.predicted_done_unix_ms - self.deadline_unix_ms
        return f"deadline cannot be met: predicted {late:.0f} ms late under the queue ahead"


@dataclass(frozen=True, slots=True)
class AdmissionPlan(Generic[ItemT]):
    """Per planned batch, the members that run (possibly none), and those shed."""

    admitted: tuple[tuple[ItemT, ...], ...]
    shed: tuple[Shed[ItemT], ...]


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
    for position, batch in enumerate(batches):
        estimate = service_ms(position, len(batch)) if batch else 0.0
        if estimate is None:
            admitted.append(tuple(c.item for c in batch))
            continue
        done = clock + estimate
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
    return AdmissionPlan(tuple(admitted), tuple(shed))


ADMISSION_PROBE_MS = 1000
"""After this long without running a batch, admission lets the next one run (a probe)."""


def forward_only(jobs: Sequence[Job]) -> bool:
    """Whether every job is a plain forward pass (what the learner's estimates cover)."""
    return all(job.task is TaskKind.FORWARD for job in jobs)


def admit_cycle(
    planned: Sequence[PlannedBatch[Job]],
    estimate_ms: Callable[[int, int], float | None],
    *,
    default_deadline_ms: float,
    now_unix_ms: int,
    last_run_unix_ms: int,
) -> AdmissionPlan[Job]:
    """Shed what cannot meet its deadline behind the batches planned ahead of it.

    ``estimate_ms(rows, bucket_len)`` prices forward-only batches (others are
    unknown); the first batch is a probe after ``ADMISSION_PROBE_MS`` without a run.
    """

    def deadline(job: Job) -> int:
        request = job.request
        return effective_deadline(
            request.deadline_unix_ms, request.created_at_unix_ms, default_deadline_ms
        )

    def service_ms(position: int, rows: int) -> float | None:
        batch = planned[position]
        if not forward_only(batch.items):
            return None
        return estimate_ms(rows, batch.bucket_len)

    candidates = [[Candidate(job, deadline(job)) for job in b.items] for b in planned]
    probe = now_unix_ms - last_run_unix_ms > ADMISSION_PROBE_MS
    return admit(candidates, now_unix_ms, service_ms, probe=probe)
