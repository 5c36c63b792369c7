"""Is a version answering the traffic it is sent? (pure).

The adapter (``graylane.policy_engine.liveness_probe``) samples, per version
of an active rollout, the sum of the version topic's end offsets (what the
router sent it) and of the worker group's committed offsets (what a worker
consumed); the core notes each telemetry arrival. :class:`LivenessTracker`
turns that into the :class:`VersionLiveness` the rollout rule judges.

Requests "routed since the last telemetry" count from the end offset seen when
the last telemetry arrived (or from the first sample, before any telemetry),
so records already in the topic before the rollout began never count.

A version is **unresponsive** when, for at least ``timeout_ms``:

- requests were routed to it and no telemetry came back since the first of
  them (a dead or hung worker, or none at all), or
- its consumer lag was above zero at the start of that time, never fell and
  grew overall while the group's committed offsets stood still (nobody
  consumes the topic: a record has waited at least ``timeout_ms``); where
  the committed offsets are unknown, the lag must have grown at every sample.

When the lag grew but the committed offsets advanced, the version consumes
slower than it is fed: a capacity problem (**behind**), not a dead version.
A rollout rolls an unresponsive candidate back and holds when the baseline is
unresponsive (nothing can be judged against it, and it is never promoted over).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "DEFAULT_LAG_HORIZON_MS",
    "DEFAULT_UNRESPONSIVE_S",
    "LagSample",
    "Liveness",
    "LivenessAction",
    "LivenessCheck",
    "LivenessTracker",
    "LivenessVerdict",
    "OffsetSample",
    "VersionLiveness",
    "check_rollout_liveness",
    "judge_liveness",
]


@dataclass(frozen=True)
class LagSample:
    """Consumer lag of a version topic's group at one moment.

    ``committed`` is the sum of the group's committed offsets when known: when
    it advances, the version is consuming (slowly), not dead.
    """

    at_ms: int
    lag: int
    committed: int | None = None


@dataclass(frozen=True, kw_only=True)
class VersionLiveness:
    """Whether one version answers the traffic it is sent.

    ``routed_since_telemetry`` counts the requests (live and shadow) routed to
    the version since its last telemetry (since the rollout began when there
    was none); ``first_routed_since_telemetry_ms`` is when the first of them
    was routed. ``lag`` holds recent lag samples, oldest first.
    """

    version: str
    routed_since_telemetry: int = 0
    first_routed_since_telemetry_ms: int | None = None
    last_telemetry_ms: int | None = None
    lag: tuple[LagSample, ...] = ()

    def __post_init__(self) -> None:
        if self.routed_since_telemetry < 0:
            raise ValueError("routed_since_telemetry must not be negative")
        if any(b.at_ms < a.at_ms for a, b in itertools.pairwise(self.lag)):
            raise ValueError("lag samples must be in time order")


DEFAULT_LAG_HORIZON_MS = 60_000
"""Lag samples older than this are dropped (the rule looks back T, by default 10 s)."""


@dataclass(frozen=True)
class OffsetSample:
    """One probe of a version topic: end offsets, the group's committed offsets and its lag,
    summed over partitions; ``committed`` is None when the group has committed nothing on
    some partition (its lag there counts from offset 0)."""

    at_ms: int
    end: int
    committed: int | None
    lag: int


@dataclass
class _Version:
    ref_end: int | None = None  # end offset when the last telemetry arrived
    latest_end: int | None = None
    first_routed_ms: int | None = None  # first sample above ref_end
    last_telemetry_ms: int | None = None
    lag: deque[LagSample] = field(default_factory=deque)


class LivenessTracker:
    """Per (model, version): routed-since-telemetry, telemetry last seen, lag samples."""

    def __init__(self, horizon_ms: int = DEFAULT_LAG_HORIZON_MS) -> None:
        if horizon_ms <= 0:
            raise ValueError(f"horizon {horizon_ms} ms must be positive")
        self.horizon_ms = horizon_ms
        self._versions: dict[tuple[str, str], _Version] = {}

    def on_telemetry(self, model: str, version: str, at_ms: int) -> None:
        """Telemetry of the version arrived at ``at_ms``: what was routed so far is answered."""
        v = self._versions.setdefault((model, version), _Version())
        v.last_telemetry_ms = max(v.last_telemetry_ms or at_ms, at_ms)
        v.ref_end = v.latest_end
        v.first_routed_ms = None

    def on_offsets(self, model: str, version: str, sample: OffsetSample) -> None:
        v = self._versions.setdefault((model, version), _Version())
        if v.lag and sample.at_ms < v.lag[-1].at_ms:
            return  # a late probe: samples stay in time order
        if v.ref_end is None:
            v.ref_end = sample.end
        elif sample.end > v.ref_end and v.first_routed_ms is None:
            v.first_routed_ms = sample.at_ms
        v.latest_end = sample.end
        v.lag.append(LagSample(sample.at_ms, sample.lag, sample.committed))
        while v.lag and sample.at_ms - v.lag[0].at_ms > self.horizon_ms:
            v.lag.popleft()

    def version_liveness(self, model: str, version: str) -> VersionLiveness | None:
        """What is known of the version; None before any probe or telemetry."""
        v = self._versions.get((model, version))
        if v is None:
            return None
        routed = 0
        if v.ref_end is not None and v.latest_end is not None:
            routed = max(0, v.latest_end - v.ref_end)
        return VersionLiveness(
            version=version,
            routed_since_telemetry=routed,
            first_routed_since_telemetry_ms=v.first_routed_ms if routed else None,
            last_telemetry_ms=v.last_telemetry_ms,
            lag=tuple(v.lag),
        )

    def forget(self, model: str, keep: frozenset[str] = frozenset()) -> None:
        """Drop the model's versions except ``keep`` (a rollout ended)."""
        for key in [k for k in self._versions if k[0] == model and k[1] not in keep]:
            del self._versions[key]


DEFAULT_UNRESPONSIVE_S = 10.0


class Liveness(Enum):
    ALIVE = "alive"
    BEHIND = "behind"
    UNRESPONSIVE = "unresponsive"


@dataclass(frozen=True)
class LivenessVerdict:
    liveness: Liveness
    reason: str = ""


def judge_liveness(liveness: VersionLiveness, now_ms: int, timeout_ms: int) -> LivenessVerdict:
    """Judge one version at ``now_ms``; ``timeout_ms`` is the T of the rule."""
    if timeout_ms <= 0:
        raise ValueError(f"timeout {timeout_ms} ms must be positive")
    first = liveness.first_routed_since_telemetry_ms
    if liveness.routed_since_telemetry > 0 and first is not None and now_ms - first >= timeout_ms:
        last = (
            f"last telemetry {(now_ms - liveness.last_telemetry_ms) / 1000:g} s ago"
            if liveness.last_telemetry_ms is not None
            else "no telemetry yet"
        )
        return LivenessVerdict(
            Liveness.UNRESPONSIVE,
            f"{liveness.version}: {liveness.routed_since_telemetry} requests routed over "
            f"{(now_ms - first) / 1000:g} s with no telemetry ({last})",
        )
    return _judge_lag(liveness.version, liveness.lag, now_ms, timeout_ms)


def _judge_lag(
    version: str, lag: tuple[LagSample, ...], now_ms: int, timeout_ms: int
) -> LivenessVerdict:
    if len(lag) < 2 or now_ms - lag[-1].at_ms > timeout_ms:
        return LivenessVerdict(Liveness.ALIVE)
    last = lag[-1]
    # The span: from the newest sample at least timeout_ms older than the last one.
    starts = [i for i, s in enumerate(lag) if last.at_ms - s.at_ms >= timeout_ms]
    if not starts:
        return LivenessVerdict(Liveness.ALIVE)
    span = lag[starts[-1] :]
    first = span[0]
    known = first.committed is not None and last.committed is not None
    pairs = list(itertools.pairwise(span))
    # Without committed offsets a small lag that wobbles up by chance must not count.
    grows = all(b.lag >= a.lag for a, b in pairs) if known else all(b.lag > a.lag for a, b in pairs)
    if not (grows and last.lag > first.lag):
        return LivenessVerdict(Liveness.ALIVE)
    what = (
        f"{version}: lag grew from {first.lag} to {last.lag} over "
        f"{(last.at_ms - first.at_ms) / 1000:g} s"
    )
    consumed = (
        last.committed - first.committed
        if first.committed is not None and last.committed is not None
        else None
    )
    if consumed is not None and consumed > 0:
        return LivenessVerdict(Liveness.BEHIND, f"{what} while it consumed {consumed} records")
    if first.lag == 0:
        # Nothing was waiting when the span began: no record has gone unconsumed for T yet.
        return LivenessVerdict(Liveness.ALIVE)
    if consumed is not None:
        what += " and nothing was consumed"
    return LivenessVerdict(Liveness.UNRESPONSIVE, what)


class LivenessAction(Enum):
    """What a rollout does about its versions' liveness."""

    CONTINUE = "continue"
    ROLLBACK = "rollback"
    HOLD = "hold"


@dataclass(frozen=True)
class LivenessCheck:
    """The outcome for one rollout; ``candidate_behind`` explains a consuming backlog."""

    action: LivenessAction = LivenessAction.CONTINUE
    reason: str = ""
    candidate_behind: str = ""


def check_rollout_liveness(
    baseline: VersionLiveness | None,
    candidate: VersionLiveness | None,
    now_ms: int,
    timeout_ms: int,
) -> LivenessCheck:
    """Baseline unresponsive -> HOLD (whatever the candidate does: with no
    working baseline nothing can be judged, and a rollback would send the
    traffic to a dead version); else candidate unresponsive -> ROLLBACK.
    """
    b = (
        judge_liveness(baseline, now_ms, timeout_ms)
        if baseline
        else LivenessVerdict(Liveness.ALIVE)
    )
    c = (
        judge_liveness(candidate, now_ms, timeout_ms)
        if candidate
        else LivenessVerdict(Liveness.ALIVE)
    )
    if b.liveness is Liveness.UNRESPONSIVE:
        also = f"; candidate: {c.reason}" if c.reason else ""
        return LivenessCheck(LivenessAction.HOLD, f"baseline unresponsive: {b.reason}{also}")
    if c.liveness is Liveness.UNRESPONSIVE:
        return LivenessCheck(LivenessAction.ROLLBACK, f"candidate unresponsive: {c.reason}")
    behind = c.reason if c.liveness is Liveness.BEHIND else ""
    return LivenessCheck(candidate_behind=behind)
