"""The worker's device-load signal: busy share of the engine over a sliding few seconds."""

from __future__ import annotations

import time

__all__ = ["LoadMeter"]


class LoadMeter:
    """Busy share of the engine over a sliding few seconds (the device load signal)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._window_s = window_s
        self._start = time.monotonic()
        self._busy = 0.0
        self._last = 0.0

    def add(self, busy_s: float) -> float:
        now = time.monotonic()
        self._busy += busy_s
        elapsed = now - self._start
        self._last = min(1.0, self._busy / elapsed) if elapsed > 0 else 0.0
        if elapsed > self._window_s:
            self._start, self._busy = now, 0.0
        return self._last
