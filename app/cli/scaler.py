"""The local stack supervisor: worker processes per model version, as ``<p>.control.scale`` asks.

:class:`ScaleSupervisor` follows the compacted scale topic (every ``ScaleRequest``
the policy engine wrote, then each new one) and keeps, per supervised
(model, version), :func:`target_replicas` worker processes running: the
desired replicas, at least ``min_workers``, at most ``max_workers`` and never
more than the version topic's partitions (a consumer beyond them would sit
idle, so the partitions must be >= the most replicas wanted). Extra workers
are stopped newest first with SIGTERM (they finish their batch and leave the
group), and killed after ``grace_s``. A worker that dies is restarted after
``restart_backoff_s`` (crash-only services).

With ``warm_standby`` (``--warm-standby N``) the supervisor also keeps up to N
*standby* workers per version (``graylane worker --standby``: engines loaded
and warmed, out of the consumer group, not ready) while the version runs fewer
than it may. A scale-out then signals a standby to join (``SIGUSR1``, about a
second to serve) instead of starting a process whose import, ONNX Runtime load
and warm-up take seconds of the CPU the overloaded workers need. A used standby
is replaced ``refill_delay_s`` after the scale-out, once the burst has passed.

``graylane supervise`` runs it in the foreground; ``graylane up --worker ...``
starts the broker and then the same; the demo starts it as a process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from graylane import serde
from graylane.app.cli.demo import Service, start_service
from graylane.engine_worker.standby import ACTIVATE
from graylane.errors import SerdeError
from graylane.kafka.admin import partition_counts
from graylane.kafka.reading import CompactedFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import control_pb2

__all__ = [
    "ScaleSupervisor",
    "WorkerTemplate",
    "parse_workers",
    "register",
    "target_replicas",
]

log = logging.getLogger(__name__)

Key = tuple[str, str]
Launcher = Callable[["WorkerTemplate", int], Service]


@dataclass(frozen=True, kw_only=True)
class WorkerTemplate:
    """How to start one worker of a model version: ``graylane worker`` with ``args``."""

    model: str
    version: str
    args: tuple[str, ...] = ("--from-registry",)

    @property
    def key(self) -> Key:
        return (self.model, self.version)

    def argv(self) -> list[str]:
        return ["worker", "--model", self.model, "--version", self.version, *self.args]


def target_replicas(
    desired: int | None, *, min_workers: int, max_workers: int, partitions: int
) -> int:
    """Workers to run: the request (or ``min_workers`` without one), within the bounds."""
    bound = min(max_workers, partitions) if partitions > 0 else max_workers
    want = min_workers if desired is None else max(desired, min_workers)
    return max(1, min(want, bound))


def parse_workers(items: Sequence[str], args: Sequence[str]) -> list[WorkerTemplate]:
    """``MODEL=VERSION`` items, each started with ``args``."""
    templates = []
    for item in items:
        model, sep, version = item.partition("=")
        if not sep or not model or not version:
            raise SystemExit(f"--worker {item!r}: expected MODEL=VERSION")
        templates.append(WorkerTemplate(model=model, version=version, args=tuple(args)))
    return templates


@dataclass
class _Pool:
    template: WorkerTemplate
    running: list[Service] = field(default_factory=list)
    standby: list[Service] = field(default_factory=list)
    started: int = 0
    next_start_s: float = 0.0
    refill_at_s: float = 0.0

    @property
    def standby_template(self) -> WorkerTemplate:
        return replace(self.template, args=(*self.template.args, "--standby"))


class ScaleSupervisor:
    """Keeps worker processes per supervised version at the requested replicas."""

    def __init__(
        self,
        factory: KafkaFactory,
        templates: Sequence[WorkerTemplate],
        *,
        max_workers: int,
        min_workers: int = 1,
        launcher: Launcher | None = None,
        log_dir: Path = REPO_ROOT / ".local" / "logs",
        grace_s: float = 20.0,
        restart_backoff_s: float = 5.0,
        poll_s: float = 0.5,
        warm_standby: int = 0,
        refill_delay_s: float = 20.0,
        first_standby_delay_s: float | None = None,
    ) -> None:
        if not 1 <= min_workers <= max_workers:
            raise ValueError(
                f"need 1 <= --min-workers {min_workers} <= --max-workers {max_workers}"
            )
        if warm_standby < 0:
            raise ValueError(f"--warm-standby {warm_standby} must be >= 0")
        self.warm_standby = warm_standby
        self.refill_delay_s = refill_delay_s
        self.first_standby_delay_s = (
            refill_delay_s if first_standby_delay_s is None else first_standby_delay_s
        )
        self.factory = factory
        self.max_workers = max_workers
        self.min_workers = min_workers
        self.pools = {t.key: _Pool(t) for t in templates}
        self.desired: dict[Key, int] = {}
        self.epochs: dict[Key, int] = {}
        self.partitions: dict[Key, int] = {}
        self.stopping: list[tuple[Service, float]] = []
        self.grace_s = grace_s
        self.restart_backoff_s = restart_backoff_s
        self.poll_s = poll_s
        self._changed = asyncio.Event()
        settings = factory.settings
        env = {
            "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
            "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        }
        self._launch = launcher or _process_launcher(log_dir, env)

    # -- state -------------------------------------------------------------------

    def running(self, model: str, version: str) -> list[Service]:
        """The live worker processes of (model, version)."""
        pool = self.pools.get((model, version))
        return [s for s in pool.running if s.process.poll() is None] if pool else []

    def standing_by(self, model: str, version: str) -> list[Service]:
        """The warm standby processes of (model, version) (not in the group)."""
        pool = self.pools.get((model, version))
        return [s for s in pool.standby if s.process.poll() is None] if pool else []

    def bound(self, key: Key) -> int:
        """The most workers (model, version) may run: ``max_workers``, at most its partitions."""
        partitions = self.partitions.get(key, 0)
        return min(self.max_workers, partitions) if partitions > 0 else self.max_workers

    def target(self, key: Key) -> int:
        return target_replicas(
            self.desired.get(key),
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            partitions=self.partitions.get(key, 0),
        )

    def on_record(self, record: Record) -> None:
        """Apply one ScaleRequest (a lower epoch than one applied is ignored)."""
        if record.value is None:
            return
        try:
            req = serde.decode(control_pb2.ScaleRequest, record.value)
        except SerdeError as exc:
            log.warning("undecodable scale request skipped: %s", exc)
            return
        key = (req.model, req.version)
        if key not in self.pools or req.epoch < self.epochs.get(key, 0):
            return
        self.epochs[key] = req.epoch
        self.desired[key] = req.desired_replicas
        log.info(
            "%s/%s: %d replicas asked for (epoch %d): %s",
            req.model,
            req.version,
            req.desired_replicas,
            req.epoch,
            req.detail,
        )
        self._changed.set()

    # -- processes -----------------------------------------------------------------

    def reconcile(self, now_s: float | None = None) -> None:
        """Start or stop processes so each pool runs its target (never blocks)."""
        now = time.monotonic() if now_s is None else now_s
        for key, pool in self.pools.items():
            alive = [s for s in pool.running if s.process.poll() is None]
            for gone in pool.running:
                if gone not in alive:
                    _withdraw(gone)
            if len(alive) < len(pool.running):
                died = len(pool.running) - len(alive)
                log.warning("%s/%s: %d worker(s) exited; restarting", *key, died)
                pool.next_start_s = now + self.restart_backoff_s
            pool.running = alive
            for gone in [s for s in pool.standby if s.process.poll() is not None]:
                log.warning("%s/%s: standby %s exited", *key, gone.name)
                _withdraw(gone)
                pool.standby.remove(gone)
                pool.refill_at_s = max(pool.refill_at_s, now + self.restart_backoff_s)
            target = self.target(key)
            while len(pool.running) < target and pool.standby:
                service = pool.standby.pop(0)
                service.process.send_signal(ACTIVATE)
                pool.running.append(service)
                pool.refill_at_s = now + self.refill_delay_s
                log.info(
                    "%s/%s: standby %s activated (%d of %d)",
                    *key,
                    service.name,
                    len(pool.running),
                    target,
                )
            while len(pool.running) < target and now >= pool.next_start_s:
                pool.started += 1
                pool.running.append(self._launch(pool.template, pool.started))
                log.info(
                    "%s/%s: worker %d started (%d of %d)",
                    *key,
                    pool.started,
                    len(pool.running),
                    target,
                )
            while len(pool.running) > target:
                service = pool.running.pop()  # newest first
                service.process.send_signal(signal.SIGTERM)
                self.stopping.append((service, now + self.grace_s))
                log.info(
                    "%s/%s: %s stopping (%d of %d)", *key, service.name, len(pool.running), target
                )
            self._keep_standby(key, pool, target, now)
        still = []
        for service, deadline in self.stopping:
            if service.process.poll() is not None:
                _withdraw(service)
                continue
            if now >= deadline:
                service.process.kill()
                _withdraw(service)
                continue
            still.append((service, deadline))
        self.stopping = still

    def _keep_standby(self, key: Key, pool: _Pool, target: int, now: float) -> None:
        """Start a standby while the version may still grow and is settled; stop extras.

        The first one starts ``first_standby_delay_s`` (default ``refill_delay_s``)
        after the pool's first worker, whose own start it would otherwise slow down."""
        if not pool.refill_at_s and pool.running:
            pool.refill_at_s = now + self.first_standby_delay_s
        want = min(self.warm_standby, max(0, self.bound(key) - len(pool.running)))
        settled = len(pool.running) >= target
        if len(pool.standby) < want and settled and now >= max(pool.refill_at_s, pool.next_start_s):
            pool.started += 1
            pool.standby.append(self._launch(pool.standby_template, pool.started))
            log.info("%s/%s: standby worker %d started", *key, pool.started)
        while len(pool.standby) > want:
            service = pool.standby.pop()
            service.process.send_signal(signal.SIGTERM)
            self.stopping.append((service, now + self.grace_s))

    async def shutdown(self) -> None:
        """SIGTERM every worker, wait up to ``grace_s``, kill the rest."""
        every = [s for pool in self.pools.values() for s in (*pool.running, *pool.standby)]
        every += [s for s, _ in self.stopping]
        for pool in self.pools.values():
            pool.running = []
            pool.standby = []
        self.stopping = []
        for s in every:
            if s.process.poll() is None:
                s.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for s in every:
            while s.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if s.process.poll() is None:
                s.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    s.process.wait(5)
            _withdraw(s)

    async def refresh_partitions(self) -> None:
        layout = self.factory.layout
        topics = {layout.version_requests(*key): key for key in self.pools}
        try:
            counts = await partition_counts(self.factory, list(topics))
        except Exception as exc:  # the next refresh retries
            log.warning("partition counts not read: %s", exc)
            return
        for topic, n in counts.items():
            self.partitions[topics[topic]] = n

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Follow the scale topic and keep the pools at their targets until ``stop``."""
        await self.refresh_partitions()
        follower = CompactedFollower(
            self.factory, self.factory.layout.scale(), self.on_record, client_suffix="supervisor"
        )
        await follower.catch_up()
        follow = asyncio.create_task(follower.follow(stop))
        refreshed = time.monotonic()
        try:
            self.reconcile()
            if ready is not None:
                ready.set()
            while not stop.is_set() and not follow.done():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.poll_s)
                if time.monotonic() - refreshed > 30.0:
                    await self.refresh_partitions()
                    refreshed = time.monotonic()
                self.reconcile()
            if follow.done() and not stop.is_set():
                follow.result()  # a dead follower ends the supervisor (crash-only)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follow
            await follower.stop()
            await self.shutdown()


def _withdraw(service: Service) -> None:
    """Take a stopped worker out of the local Prometheus' targets."""
    from graylane.app.cli.local_prometheus import withdraw

    with contextlib.suppress(OSError):
        withdraw(service.name)


def _process_launcher(log_dir: Path, env: Mapping[str, str]) -> Launcher:
    def launch(template: WorkerTemplate, index: int) -> Service:
        name = f"worker-{template.model}-{template.version}-{index}"
        return start_service(name, template.argv(), log_dir, env)

    return launch


# -- CLI --------------------------------------------------------------------------


def add_supervisor_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        required=required,
        metavar="MODEL=VERSION",
        help="a model version whose workers to supervise (repeatable)",
    )
    parser.add_argument(
        "--max-workers",
        type=int,
        default=2,
        help="most worker processes per version (also never more than its topic's partitions)",
    )
    parser.add_argument(
        "--min-workers", type=int, default=1, help="never fewer workers per version than this"
    )
    parser.add_argument(
        "--warm-standby",
        type=int,
        default=0,
        help="warmed workers kept out of the group per version while it may still grow: "
        "a scale-out signals one instead of cold-starting a process",
    )
    parser.add_argument(
        "--worker-args",
        default="--from-registry",
        help='arguments of each `graylane worker` (one string, e.g. "--from-registry --threads 1")',
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sup = sub.add_parser(
        "supervise",
        help="run worker processes per model version as the policy engine's scale requests ask",
    )
    add_supervisor_args(sup, required=True)
    sup.set_defaults(handler=_supervise)


def run_supervisor(settings: Settings, args: argparse.Namespace) -> int:
    """Run the supervisor in the foreground until SIGINT/SIGTERM."""
    from graylane.app.cli.services import run_service

    templates = parse_workers(args.worker, shlex.split(args.worker_args))
    try:
        supervisor = ScaleSupervisor(
            KafkaFactory(settings),
            templates,
            max_workers=args.max_workers,
            min_workers=args.min_workers,
            warm_standby=args.warm_standby,
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    layout = supervisor.factory.layout
    for t in templates:
        topic = layout.version_requests(t.model, t.version)
        print(
            f"supervising {t.model}/{t.version}: {args.min_workers}..{args.max_workers} workers "
            f"(never more than the partitions of {topic})",
            flush=True,
        )
    return run_service(supervisor.run)


def _supervise(args: argparse.Namespace) -> int:
    logging.getLogger("graylane").setLevel(logging.INFO)
    return run_supervisor(Settings.from_env(), args)
