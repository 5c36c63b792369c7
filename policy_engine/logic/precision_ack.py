"""Did the workers follow a precision command? Confirmed or refused, from telemetry.

Telemetry says which variant served each batch. After a switch of
(model, version) to ``variant`` at ``since_ms``:

- a batch of ``variant`` completed at or after ``since_ms`` confirms it;
- ``bound_ms`` after the switch, batches of *other* variants only (the
  workers serve, but not what was commanded: the variant is missing, the
  command was ignored) refuse it, naming what was served instead;
- no batch at all is no evidence: the switch stays pending (a dead worker is
  not a refusal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = ["DEFAULT_ACK_BOUND_MS", "AckVerdict", "PendingSwitch", "judge_switch"]

DEFAULT_ACK_BOUND_MS = 15_000


class AckVerdict(Enum):
    PENDING = "pending"
    CONFIRMED = "confirmed"
    REFUSED = "refused"


@dataclass(frozen=True)
class PendingSwitch:
    model: str
    version: str
    variant: str
    epoch: int
    since_ms: int
    previous: str


def judge_switch(
    switch: PendingSwitch,
    served_at: Mapping[str, int],
    now_ms: int,
    bound_ms: int = DEFAULT_ACK_BOUND_MS,
) -> tuple[AckVerdict, str]:
    """The verdict and the variant actually served (``served_at``: variant -> last batch time)."""
    if served_at.get(switch.variant, -1) >= switch.since_ms:
        return AckVerdict.CONFIRMED, switch.variant
    if now_ms - switch.since_ms < bound_ms:
        return AckVerdict.PENDING, ""
    others = sorted(
        ((at, v) for v, at in served_at.items() if v != switch.variant and at >= switch.since_ms),
        reverse=True,
    )
    if others:
        return AckVerdict.REFUSED, others[0][1]
    return AckVerdict.PENDING, ""
