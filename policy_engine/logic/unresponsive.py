"""Is a version answering the traffic it is sent? (pure; see :mod:`.facts`).

A version is **unresponsive** when, for at least ``timeout_ms``:

- requests were routed to it and no telemetry came back since the first of
  them (a dead or hung worker, or none at all), or
- its consumer lag never fell and grew overall while the group's committed
  offsets stood still (nobody consumes the topic); where the committed
  offsets are unknown, the lag must have grown at every sample.

When the lag grew but the committed offsets advanced, the version consumes
slower than it is fed: a capacity problem (**behind**), not a dead version.
A rollout rolls an unresponsive candidate back and holds when the baseline is
unresponsive (nothing can be judged against it, and it is never promoted over).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum

from graylane.policy_engine.logic.facts import LagSample, VersionLiveness

__all__ = [
    "DEFAULT_UNRESPONSIVE_S",
    "Liveness",
    "LivenessAction",
    "LivenessCheck",
    "LivenessVerdict",
    "check_rollout_liveness",
    "judge_liveness",
]

DEFAULT_UNRESPONSIVE_S = 10.0


class Liveness(Enum):
    ALIVE = "alive"
    BEHIND = "behind"
    UNRESPONSIVE = "unresponsive"


@dataclass(frozen=True)
class LivenessVerdict:
    liveness: Liveness
    reason: str = ""


def judge_liveness(facts: VersionLiveness, now_ms: int, timeout_ms: int) -> LivenessVerdict:
    """Judge one version at ``now_ms``; ``timeout_ms`` is the T of the rule."""
    if timeout_ms <= 0:
        raise ValueError(f"timeout {timeout_ms} ms must be positive")
    first = facts.first_routed_since_telemetry_ms
    if facts.routed_since_telemetry > 0 and first is not None and now_ms - first >= timeout_ms:
        last = (
            f"last telemetry {(now_ms - facts.last_telemetry_ms) / 1000:g} s ago"
            if facts.last_telemetry_ms is not None
            else "no telemetry yet"
        )
        return LivenessVerdict(
            Liveness.UNRESPONSIVE,
            f"{facts.version}: {facts.routed_since_telemetry} requests routed over "
            f"{(now_ms - first) / 1000:g} s with no telemetry ({last})",
        )
    return _judge_lag(facts.version, facts.lag, now_ms, timeout_ms)


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
    if first.committed is not None and last.committed is not None:
        if last.committed > first.committed:
            return LivenessVerdict(
                Liveness.BEHIND,
                f"{what} while it consumed {last.committed - first.committed} records",
            )
        return LivenessVerdict(Liveness.UNRESPONSIVE, f"{what} and nothing was consumed")
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
