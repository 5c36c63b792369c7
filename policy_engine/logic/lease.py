"""The policy engine's single-writer lease, as a pure fold over the lease topic.

Why an explicit lease rather than faust's leader election: faust's
``on_leader`` only gates timers, while our agents (commands, telemetry) would
still be split between the instances of the consumer group, so two replicas
would each take half of the commands and both publish. With a lease, a
passive instance does not join the group at all; it waits, and starts the
faust app only once it holds the lease, so exactly one instance consumes and
publishes (a restarted active one resumes from the compacted topics).

Every instance folds the same records in the same (offset) order, so all
agree on the holder. A claim names the term it opens (``term + 1``) and is
taken only when the current lease has expired by the claim's own time; a
renewal keeps the term and is taken only from the current holder. Of two
racing claims the first in the log wins and the second is ignored, whatever
each writer believed. A holder that sees it no longer holds the lease (or
cannot renew before expiry) must stop writing at once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lease", "LeaseClaim", "apply_claim", "fold", "holds", "next_claim"]


@dataclass(frozen=True)
class LeaseClaim:
    """One record on the lease topic."""

    holder: str
    term: int
    at_ms: int
    ttl_ms: int

    def __post_init__(self) -> None:
        if not self.holder or self.ttl_ms <= 0 or self.term <= 0:
            raise ValueError(f"invalid lease claim {self}")


@dataclass(frozen=True)
class Lease:
    """Who holds the lease, in which term, until when (no holder: ``term`` 0)."""

    holder: str = ""
    term: int = 0
    expires_ms: int = 0


def apply_claim(lease: Lease, claim: LeaseClaim) -> Lease:
    """The lease after ``claim``: a renewal by the holder, a takeover after expiry, or unchanged."""
    if lease.holder and claim.holder == lease.holder and claim.term == lease.term:
        return Lease(lease.holder, lease.term, claim.at_ms + claim.ttl_ms)
    if claim.term == lease.term + 1 and claim.at_ms >= lease.expires_ms:
        return Lease(claim.holder, claim.term, claim.at_ms + claim.ttl_ms)
    return lease


def fold(claims: list[LeaseClaim], lease: Lease | None = None) -> Lease:
    out = lease or Lease()
    for claim in claims:
        out = apply_claim(out, claim)
    return out


def holds(lease: Lease, me: str, now_ms: int) -> bool:
    return lease.holder == me and now_ms < lease.expires_ms


def next_claim(lease: Lease, me: str, now_ms: int, ttl_ms: int) -> LeaseClaim | None:
    """What ``me`` should write now: a renewal, a claim of an expired lease, or nothing."""
    if lease.holder == me and now_ms < lease.expires_ms:
        return LeaseClaim(me, lease.term, now_ms, ttl_ms)
    if now_ms >= lease.expires_ms:
        return LeaseClaim(me, lease.term + 1, now_ms, ttl_ms)
    return None
