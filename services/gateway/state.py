"""The state a gateway replica owns: a token bucket per key, the calls in flight, the
body bytes held.

Room: ``state.py`` of the gateway. :class:`Admission` holds, for one replica, the
callers' keys, a :class:`TokenBucket` per key (created at its first call, holding this
replica's share of the key's limit), the :class:`InFlightGate` that admits by priority
and tenant, and the :class:`BodyBudget` of bytes read and not yet parsed; they change
only through their methods, on the one event loop. The rules they apply are pure
(:mod:`~graylane.services.gateway.logic.admission`). Nothing here is durable: a
restarted replica starts with full buckets and no call in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from graylane.priority import Priority
from graylane.services.gateway.logic.admission import (
    CallerRole,
    GateVerdict,
    GatewayLimits,
    KeyRing,
    Tenant,
    gate_verdict,
    split_rate,
)

__all__ = ["Admission", "BodyBudget", "InFlightGate", "TokenBucket"]


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
    """Counts running calls, in all and per tenant; admits by priority and fair share
    (:func:`~graylane.services.gateway.logic.admission.gate_verdict`; single event loop:
    no lock)."""

    def __init__(self, limits: GatewayLimits) -> None:
        cap = limits.max_in_flight
        self.limits = limits
        self._caps = {
            Priority.SHEDDABLE: max(1, int(cap * limits.sheddable_share)),
            Priority.STANDARD: cap,
            Priority.CRITICAL: cap + max(1, int(cap * limits.critical_headroom)),
        }
        self.running = 0
        self._by_tenant: dict[str, int] = {}

    def cap(self, priority: Priority) -> int:
        return self._caps[priority]

    def running_of(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def enter(self, priority: Priority, tenant: str = "") -> GateVerdict:
        own = self._by_tenant.get(tenant, 0)
        verdict = gate_verdict(
            running=self.running,
            priority_cap=self._caps[priority],
            tenant_running=own,
            tenants_running=len(self._by_tenant) + (0 if own else 1),
            limits=self.limits,
        )
        if verdict is GateVerdict.ADMIT:
            self.running += 1
            self._by_tenant[tenant] = own + 1
        return verdict

    def leave(self, tenant: str = "") -> None:
        self.running = max(0, self.running - 1)
        own = self._by_tenant.get(tenant, 0) - 1
        if own > 0:
            self._by_tenant[tenant] = own
        else:
            self._by_tenant.pop(tenant, None)


class BodyBudget:
    """Bytes of request bodies read and not yet parsed, in all and per tenant: reading
    takes bytes from it as they arrive, and a body that does not fit is refused."""

    def __init__(self, limits: GatewayLimits) -> None:
        self.total_cap = limits.max_buffered_bytes
        self.tenant_cap = limits.tenant_buffered_bytes
        self.held = 0
        self._by_tenant: dict[str, int] = {}

    def take(self, tenant: str, size: int) -> GateVerdict:
        """ADMIT (the bytes are held), TENANT_CAP or REPLICA_FULL (nothing taken)."""
        own = self._by_tenant.get(tenant, 0)
        if own + size > self.tenant_cap:
            return GateVerdict.TENANT_CAP
        if self.held + size > self.total_cap:
            return GateVerdict.REPLICA_FULL
        self.held += size
        self._by_tenant[tenant] = own + size
        return GateVerdict.ADMIT

    def give_back(self, tenant: str, size: int) -> None:
        self.held = max(0, self.held - size)
        own = self._by_tenant.get(tenant, 0) - size
        if own > 0:
            self._by_tenant[tenant] = own
        else:
            self._by_tenant.pop(tenant, None)


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
        self.bodies = BodyBudget(limits)
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
            bucket = TokenBucket(*split_rate(rate, burst, self.limits.replicas))
            self._buckets[key_id] = bucket
        return bucket.take(self.clock())
