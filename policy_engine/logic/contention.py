"""Contention: how much of its calibrated speed a rung keeps in the running stack (pure).

``graylane calibrate`` measures the engine alone with the whole machine; in the
running stack the worker shares the CPU with the router, the policy engine,
other workers and the clients, so each request takes longer and a rung's real
capacity is lower. The *contention factor* of a window is

    calibrated service time per request / observed service time per request

of the active rung (``1000 / capacity_rps`` vs the window's busy time per
request, :attr:`WindowStats.service_per_request_ms`), bounded to
[``MIN_FACTOR``, ``MAX_FACTOR``] and smoothed over windows (exponentially,
weight ``SMOOTHING`` for the newest). The active rung's capacity here is its
calibrated one x the factor. Another rung's (:func:`effective_capacity` with
``measured_on_rps``) pays the same *time* per request that the factor adds
on the active rung -- the CPU the rest of the stack takes, the per-call costs
of a small batch -- not the same *share*: at low load an int8 rung may run at
half its calibrated speed while fp32, twice as slow, loses only a third. The
load at which QoS steps back up is then one the rung above can serve here.
"""

from __future__ import annotations

import math

from graylane.policy_engine.logic.window_data import WindowStats

__all__ = [
    "MAX_FACTOR",
    "MIN_FACTOR",
    "MIN_REQUESTS",
    "SMOOTHING",
    "effective_capacity",
    "observed_factor",
    "smoothed_factor",
]

MIN_FACTOR = 0.05
"""Never believe a rung keeps less than 5 % of its calibrated speed."""
MAX_FACTOR = 1.0
"""The stack never makes the engine faster than calibrated alone."""
SMOOTHING = 0.3
"""Weight of the newest window's factor in the running (exponential) mean."""
MIN_REQUESTS = 5
"""Windows with fewer served requests carry too little evidence to move the factor."""


def observed_factor(stats: WindowStats, calibrated_rps: float | None) -> float | None:
    """This window's factor for the rung it ran; None without the evidence."""
    per_request = stats.service_per_request_ms
    if (
        calibrated_rps is None
        or calibrated_rps <= 0.0
        or stats.requests < MIN_REQUESTS
        or per_request <= 0.0
    ):
        return None
    factor = (1000.0 / calibrated_rps) / per_request
    return min(MAX_FACTOR, max(MIN_FACTOR, factor)) if math.isfinite(factor) else None


def smoothed_factor(previous: float, observed: float | None) -> float:
    """The running factor after one window (unchanged without evidence)."""
    if observed is None:
        return previous
    mixed = SMOOTHING * observed + (1.0 - SMOOTHING) * previous
    return min(MAX_FACTOR, max(MIN_FACTOR, mixed))


def effective_capacity(
    calibrated_rps: float | None, factor: float, measured_on_rps: float | None = None
) -> float | None:
    """A rung's capacity in the running stack (None when unknown).

    ``factor`` was measured on the rung calibrated at ``measured_on_rps`` (default:
    this one, whose capacity is then calibrated x factor). The milliseconds it adds
    to each request there are added to each request of this rung.
    """
    if calibrated_rps is None:
        return None
    if calibrated_rps <= 0.0 or factor <= 0.0:
        return 0.0
    on = measured_on_rps if measured_on_rps is not None and measured_on_rps > 0 else calibrated_rps
    added_ms = (1000.0 / on) * (1.0 / factor - 1.0)
    return 1000.0 / (1000.0 / calibrated_rps + added_ms)
