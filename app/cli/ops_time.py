"""Times on the command line: ISO 8601, unix milliseconds, or an age such as ``15m``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from graylane.clock import now_ms as clock_now_ms

__all__ = ["parse_time"]

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Unix ms of ``text``; empty gives 0 (unbounded). Naive ISO times are UTC."""
    text = text.strip()
    if not text:
        return 0
    now = clock_now_ms() if now_ms is None else now_ms
    ago = _AGO.match(text)
    if ago:
        return now - int(float(ago.group(1)) * _UNIT_S[ago.group(2)] * 1000)
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(
            f"time {text!r}: use ISO 8601 (2026-01-31T10:42), unix ms, or an age like 15m / 2h"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
