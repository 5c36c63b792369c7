"""The quality costs a QoS policy carries (pure): each ladder rung's measured drop.

The registry holds each rung's newest score on an evaluation set beside its reference
rung's (``graylane eval --record``). A policy set or re-sent carries, for each rung of
its ladder, the drop measured there (reference score - rung score); a drop the caller
gave for a rung the registry has not measured stays (a policy written by hand).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["ladder_quality_drops"]


def ladder_quality_drops(
    ladder: Sequence[str], measured: Mapping[str, float], given: Mapping[str, float]
) -> dict[str, float]:
    """The drop of each ladder rung: the registry's measurement, else the caller's."""
    drops: dict[str, float] = {}
    for rung in ladder:
        if rung in measured:
            drops[rung] = measured[rung]
        elif rung in given:
            drops[rung] = given[rung]
    return drops
