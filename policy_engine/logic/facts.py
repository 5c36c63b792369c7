"""Inputs of the rollout controller beyond the window stats.

The policy engine's adapter fills these from what it observes besides
telemetry: the requests the router sent each version, when each version's
telemetry was last seen, the consumer lag of each version topic (read from the
group's committed offsets, so it does not depend on the worker being alive),
and the stats of the newest step alone (the increment the sequential gates
consume, so that they need not wait for a whole disjoint window).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from graylane.policy_engine.logic.window import WindowStats

__all__ = ["LagSample", "RolloutFacts", "VersionLiveness"]


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


@dataclass(frozen=True, kw_only=True)
class RolloutFacts:
    """Everything :func:`~graylane.policy_engine.logic.rollout.evaluate` may use besides windows.

    ``baseline_step`` / ``candidate_step`` are the stats of the newest step
    (``[end - step, end)`` of the same window); without them the sequential
    gates consume whole windows that do not overlap.
    """

    baseline_step: WindowStats | None = None
    candidate_step: WindowStats | None = None
    baseline_liveness: VersionLiveness | None = None
    candidate_liveness: VersionLiveness | None = None
