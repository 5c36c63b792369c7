"""The demo's spike, from measured capacity (pure).

The elastic story needs a spike that one worker cannot carry even at the
quality floor, or nothing would scale out; a spike far beyond two workers would
only shed. One request costs the rung's engine time plus the path's overhead
(client, router, broker: measured as the fp32 path's time per request minus
fp32's engine time), so the floor's capacity in this stack is
``1000 / (1000 / floor_engine + overhead)``.
"""

from __future__ import annotations

__all__ = ["floor_path_rps", "spike_rate"]

BEYOND_FLOOR = 1.5
"""The spike is at least this multiple of what one worker serves at the floor here."""


def floor_path_rps(path_rps: float, engine_rps: float, floor_engine_rps: float) -> float:
    """Requests/s one worker serves at the floor rung in this stack (0 when unknown)."""
    if min(path_rps, engine_rps, floor_engine_rps) <= 0.0:
        return 0.0
    overhead_ms = max(0.0, 1000.0 / path_rps - 1000.0 / engine_rps)
    return 1000.0 / (1000.0 / floor_engine_rps + overhead_ms)


def spike_rate(
    base_rps: float, factor: float, path_rps: float, engine_rps: float, floor_engine_rps: float
) -> float:
    """``factor`` x the base load, raised to :data:`BEYOND_FLOOR` x the floor's capacity
    here when that is more (a machine where the floor rung alone would carry x3)."""
    floor = floor_path_rps(path_rps, engine_rps, floor_engine_rps)
    return max(base_rps * factor, BEYOND_FLOOR * floor)
