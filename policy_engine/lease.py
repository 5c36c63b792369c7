"""The lease adapter: read and write the lease topic (see :mod:`.logic.lease` for the rule).

``<p>.control.policy-lease``: compacted, one partition, one key. Each
check reads the (tiny) topic to its end and folds it; a claim is written and
then read back, so the writer knows whether the log made it the holder.

A lease that lapses because the broker cannot be reached does not end the
process: the keeper fences (:attr:`LeaseKeeper.writable` is cleared, nothing is
published), retries with capped backoff, and lifts the fence when it holds the
lease again with no other holder in between. If another live instance took the
lease meanwhile, this one is displaced: it restarts in place as a standby.

A record on the lease topic that is not a valid claim (undecodable, or a claim
the fold cannot take) is skipped and counted (:attr:`LeaseKeeper.skipped`):
every instance skips the same records, so all still agree on the holder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from graylane import serde
from graylane.clock import Clock, now_ms
from graylane.errors import SerdeError
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.logic.lease import Lease, LeaseClaim, fold, holds, next_claim
from graylane.topics import Cleanup, TopicKind, TopicSpec
from graylane.v1 import control_pb2

__all__ = [
    "LeaseKeeper",
    "LeaseRecords",
    "claims_of",
    "default_holder",
    "fence",
    "restart_as_standby",
]

log = logging.getLogger(__name__)

KEY = b"policy-engine"


def fence() -> None:
    """Stop this process at once: it must not write once its lease is gone."""
    logging.shutdown()
    os._exit(3)


def restart_as_standby() -> None:
    """Replace this process by a fresh start of its own command line (same pid, same
    instance id): it waits passive until the lease is free, then restores and resumes."""
    logging.shutdown()
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    try:
        os.execv(sys.executable, [sys.executable, *argv[1:]])
    except OSError:
        os._exit(3)


@dataclass(frozen=True)
class LeaseRecords:
    """The valid claims of the lease topic, in log order, and how many records were not."""

    claims: list[LeaseClaim]
    skipped: int


def claims_of(values: Iterable[bytes | None]) -> LeaseRecords:
    """The claims in the lease topic's values; a tombstone is no claim, a bad record is
    skipped (counted, logged), never fatal."""
    claims: list[LeaseClaim] = []
    skipped = 0
    for value in values:
        if value is None:
            continue
        try:
            pb = serde.decode(control_pb2.PolicyLease, value)
            claims.append(LeaseClaim(pb.holder, pb.term, pb.at_unix_ms, pb.ttl_ms))
        except (SerdeError, ValueError) as exc:
            log.warning("skipping a lease record that is no valid claim: %s", exc)
            skipped += 1
    return LeaseRecords(claims, skipped)


def default_holder() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class LeaseKeeper:
    """Acquire, renew and check the single-writer lease of one topic prefix."""

    def __init__(
        self,
        factory: KafkaFactory,
        holder: str,
        *,
        ttl_ms: int = 6_000,
        renew_ms: int = 2_000,
        clock: Clock = now_ms,
        max_backoff_ms: int | None = None,
    ) -> None:
        if not 0 < renew_ms * 2 <= ttl_ms:
            raise ValueError("renew at least twice per lease period")
        self.max_backoff_ms = max(renew_ms, max_backoff_ms or ttl_ms)
        self.factory = factory
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.renew_ms = renew_ms
        self.clock = clock
        self.topic = f"{factory.layout.prefix}.control.policy-lease"
        self.lease = Lease()
        self.writable = asyncio.Event()
        """Set while this instance may publish; cleared (fenced) once the lease lapsed."""
        self.skipped = 0
        """Records of the lease topic that were not valid claims, at the last read."""

    @property
    def active(self) -> bool:
        """Whether this instance held the lease at its last check and it has not expired."""
        return holds(self.lease, self.holder, self.clock())

    async def prepare(self) -> None:
        layout = self.factory.layout
        spec = TopicSpec(
            name=self.topic,
            kind=TopicKind.ROLLOUTS,
            partitions=1,
            replication_factor=layout.replication_factor,
            cleanup=Cleanup.COMPACT,
            retention_ms=None,
        )
        await ensure_topics(self.factory, [spec])

    async def read(self) -> Lease:
        records = await read_to_end(self.factory, self.topic, client_suffix="lease")
        claims = claims_of(r.value for r in records)
        self.skipped = claims.skipped
        self.lease = fold(claims.claims)
        return self.lease

    async def _write(self, claim: LeaseClaim) -> None:
        producer = self.factory.producer(client_suffix="lease")
        await producer.start()
        try:
            pb = control_pb2.PolicyLease(
                holder=claim.holder, term=claim.term, at_unix_ms=claim.at_ms, ttl_ms=claim.ttl_ms
            )
            await producer.send_and_wait(self.topic, serde.encode(pb), key=KEY)
        finally:
            await producer.stop()

    async def step(self) -> bool:
        """Read, write a renewal or claim when due, read back; whether we hold the lease."""
        lease = await self.read()
        claim = next_claim(lease, self.holder, self.clock(), self.ttl_ms)
        if claim is not None:
            await self._write(claim)
            await self.read()
        return self.active

    async def acquire(self) -> None:
        """Wait, passive, until this instance holds the lease."""
        await self.prepare()
        announced = False
        while not await self.step():
            if not announced:
                log.info(
                    "standby: lease held by %s (term %d); waiting to take over",
                    self.lease.holder,
                    self.lease.term,
                )
                announced = True
            await asyncio.sleep(self.renew_ms / 1000)
        log.info("lease acquired by %s (term %d)", self.holder, self.lease.term)

    async def release(self) -> None:
        """End our lease now (a clean shutdown), so a standby need not wait for expiry."""
        if self.active:
            await self._write(LeaseClaim(self.holder, self.lease.term, self.clock(), 1))

    async def wait_writable(self) -> None:
        """Return at once while the lease is held; else fence and wait until it is again."""
        if self.active:
            return
        self.writable.clear()
        await self.writable.wait()

    async def keep(self, on_displaced: Callable[[], None]) -> None:
        """Renew every ``renew_ms``; fence while the lease is not held and re-acquire it.

        A lapse (e.g. the broker is down) clears :attr:`writable`; failed attempts back
        off (doubling, capped at ``max_backoff_ms``, with jitter). Holding the lease
        again in the next term, with no other holder in between, sets it again.
        ``on_displaced`` is called (then this returns) when another instance holds or
        held the lease meanwhile: this one's state may be stale and it must not write.
        """
        self.writable.set()
        term = self.lease.term
        delay_ms = self.renew_ms
        while True:
            await asyncio.sleep(delay_ms / 1000)
            try:
                held = await self.step()
                reached = True
            except Exception as exc:
                log.warning("lease renewal failed: %s", exc or type(exc).__name__)
                held, reached = self.active, False
            if held:
                if self.lease.term > term + 1:  # someone else held the term(s) between
                    self._displaced(on_displaced)
                    return
                if not self.writable.is_set():
                    log.info("lease regained (term %d); writing again", self.lease.term)
                    self.writable.set()
                term, delay_ms = self.lease.term, self.renew_ms
                continue
            if self.writable.is_set():
                self.writable.clear()
                log.critical(
                    "lease lapsed (holder %s, term %d); fenced: no writes until it is regained",
                    self.lease.holder,
                    self.lease.term,
                )
            if reached and self.lease.holder not in ("", self.holder):
                self._displaced(on_displaced)
                return
            if reached:
                delay_ms = self.renew_ms
            else:
                delay_ms = min(delay_ms * 2, self.max_backoff_ms)
                delay_ms = int(delay_ms * random.uniform(0.8, 1.0))

    def _displaced(self, on_displaced: Callable[[], None]) -> None:
        self.writable.clear()
        log.critical(
            "lease taken by %s (term %d); this instance stops writing and becomes a standby",
            self.lease.holder,
            self.lease.term,
        )
        on_displaced()
