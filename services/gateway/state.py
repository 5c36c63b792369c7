"""The state a gateway replica owns: a token bucket per key and the calls in flight.

Room: ``state.py`` of the gateway. :class:`Admission` holds, for one replica, the
callers' keys, a :class:`TokenBucket` per key (created at its first call) and the
:class:`InFlightGate` that admits by priority; they change only through their methods,
on the one event loop. The rules they apply are pure
(:mod:`~graylane.services.gateway.logic.admission`). Nothing here is durable: a
restarted replica starts with full buckets and no call in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from graylane.priority import Priority
from graylane.services.gateway.logic.admission import CallerRole, GatewayLimits, KeyRing, Tenant

__all__ = ["Admission", "InFlightGate", "TokenBucket"]


@dataclass
class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` held; starts full."""

    rate_per_s: float
    burst: int
    tokens: float = field(init=False)
    updated_s: float = field(init=False, default=-1.0)

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least 1")
        self.tokens = float(self.burst)

    def take(self, now_s: float) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there is one."""
        if self.updated_s >= 0:
            elapsed = max(0.0, now_s - self.updated_s)
            self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate_per_s)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class InFlightGate:
    """Counts running calls; admits by priority (single event loop: no lock)."""

    def __init__(self, limits: GatewayLimits) -> None:
        cap = limits.max_in_flight
        self._caps = {
            Priority.SHEDDABLE: max(1, int(cap * limits.sheddable_share)),
            Priority.STANDARD: cap,
            Priority.CRITICAL: cap + max(1, int(cap * limits.critical_headroom)),
        }
        self.running = 0

    def cap(self, priority: Priority) -> int:
        return self._caps[priority]

    def enter(self, priority: Priority) -> bool:
        if self.running >= self._caps[priority]:
            return False
        self.running += 1
        return True

    def leave(self) -> None:
        self.running = max(0, self.running - 1)


class Admission:
    """Keys, buckets per key and the in-flight gate of one replica.

    ``keys`` None is an open gateway (``--no-auth``): every caller is the tenant
    ``anonymous`` with one shared bucket.
    """

    ANONYMOUS = Tenant("anonymous", CallerRole.INFER)

    def __init__(
        self,
        limits: GatewayLimits,
        keys: KeyRing | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.keys = keys
        self.clock = clock
        self.gate = InFlightGate(limits)
        self._buckets: dict[str, TokenBucket] = {}

    def identify(self, authorization: str | None) -> tuple[str, Tenant] | None:
        if self.keys is None:
            return "", self.ANONYMOUS
        return self.keys.tenant_of(authorization)

    def throttle(self, key_id: str, tenant: Tenant) -> float:
        """0.0 when the key may call now, else seconds until it may (429)."""
        bucket = self._buckets.get(key_id)
        if bucket is None:
            if tenant.rate_per_s > 0:
                rate, burst = tenant.rate_per_s, tenant.burst or max(1, int(tenant.rate_per_s))
            else:
                rate, burst = (
                    self.limits.default_rate_per_s,
                    tenant.burst or self.limits.default_burst,
                )
            bucket = TokenBucket(rate, burst)
            self._buckets[key_id] = bucket
        return bucket.take(self.clock())
