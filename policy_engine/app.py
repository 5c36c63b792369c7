"""The faust-streaming adapter of :class:`~graylane.policy_engine.core.PolicyCore` (thin).

Agents decode telemetry, commands and shadow results (raw bytes, protobuf via
``graylane.serde``) into the core; a timer calls ``core.tick`` every step and
publishes what it returns. Before any agent feeds the core, a start-up task
restores it from the compacted ``rollouts()``, ``routing()``,
``precision()`` and ``scale()`` topics read to their end, and the QoS policies from the
``SET_QOS_POLICY`` commands on record, so a restarted engine resumes its
rollouts and never writes an epoch below one already written.

Graylane's topics are created beforehand (``ensure_topics``); faust only
subscribes to them. faust's own state is in memory (``memory://``), its web
server is off, and every record the core emits is produced with the
contract's key.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, field, replace
from functools import partial

import faust

from graylane import serde
from graylane.clock import Clock, now_ms
from graylane.errors import SerdeError
from graylane.kafka.admin import ensure_topics, partition_counts
from graylane.kafka.reading import read_latest_per_key, read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.metrics import CONTROL_CAUGHT_UP, PolicyMetrics, ServiceObservability
from graylane.policy_engine import convert
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.core_scale import restore_scale
from graylane.policy_engine.faust_settings import broker_settings
from graylane.policy_engine.intake import command_of, restore_values, shadow_of, telemetry_into
from graylane.policy_engine.lease import LeaseKeeper, restart_as_standby
from graylane.policy_engine.liveness_probe import LivenessProbe
from graylane.policy_engine.logic.scale import ScalePolicy
from graylane.policy_engine.logic.window import DEFAULT_STEP_MS, DEFAULT_WINDOW_MS
from graylane.policy_engine.messages import CommandRejected, Output, RecordSkipped, RecordSource
from graylane.policy_engine.observe import PolicyObserver
from graylane.policy_engine.publish import records_of
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.qos_policy import QosPolicy
from graylane.settings import Settings
from graylane.v1 import control_pb2, rollout_pb2

__all__ = ["PolicyConfig", "create_app", "prepare_topics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    window_ms: int = DEFAULT_WINDOW_MS
    step_ms: int = DEFAULT_STEP_MS
    models: tuple[str, ...] = field(default_factory=tuple)
    clock: Clock = now_ms
    lease: LeaseKeeper | None = None  # held before the app starts; renewed while it runs
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""
    scale: ScalePolicy = field(default_factory=ScalePolicy)
    """Replica bounds and timings (the default never scales)."""
    partitions_refresh_s: float = 30.0
    instance_id: str = ""
    """Static group membership (and lease holder): a restart rejoins at once; "" = dynamic."""


async def prepare_topics(settings: Settings, config: PolicyConfig) -> None:
    """Create the topics the engine reads and writes (idempotent), before faust subscribes."""
    factory = KafkaFactory(settings)
    specs = list(factory.layout.shared_specs())
    for model in config.models:
        specs += [s for s in factory.layout.model_specs(model, []) if "shadow" in s.name]
    await ensure_topics(factory, specs)


def create_app(settings: Settings, config: PolicyConfig) -> faust.App:
    factory = KafkaFactory(settings)
    layout = factory.layout
    core = PolicyCore(config.window_ms, config.step_ms)
    core.scale_policy = config.scale
    probe = LivenessProbe(factory)
    restored = asyncio.Event()
    brokers = broker_settings(settings)  # security included, like every other client
    app = faust.App(
        f"{settings.topic_prefix}-policy",
        broker=brokers.broker,
        broker_client_id=brokers.broker_client_id,
        broker_credentials=brokers.broker_credentials,
        store="memory://",
        # Not faust's default "<name>-data" in the working directory: a temp folder (TMPDIR).
        datadir=f"{tempfile.gettempdir()}/graylane-{settings.topic_prefix}-policy-data",
        web_enabled=False,
        topic_partitions=1,
        topic_allow_declare=False,
        topic_disable_leader=True,
        # A first start reads commands on record; later starts resume at committed offsets.
        consumer_auto_offset_reset="earliest",
        # A standby that takes the lease over joins the group only once the dead
        # writer's session has expired: keep that short (faust's default is 60 s).
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        # A restarted engine (same instance id) takes its partitions back without
        # waiting for its dead self's session: decisions resume within seconds.
        consumer_group_instance_id=config.instance_id or None,
    )
    app.conf.producer_acks = -1
    app.core = core  # type: ignore[attr-defined]  # for tests and introspection
    observability = ServiceObservability("policy-engine")
    observer = PolicyObserver(PolicyMetrics.create(observability.registry))
    app.observability = observability  # type: ignore[attr-defined]

    def raw_topic(name: str) -> faust.TopicT:
        return app.topic(
            name, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
        )

    telemetry = raw_topic(layout.telemetry())
    commands = raw_topic(layout.commands())
    shadows = [raw_topic(layout.shadow(m)) for m in config.models]

    async def publish(outputs: list[Output]) -> None:
        if config.lease is not None:  # fenced while the lease lapsed: wait to hold it again
            await config.lease.wait_writable()
        observer.observe(outputs)
        observer.desired_replicas(core.scale_states.values())
        for rec in records_of(outputs, layout):
            await app.producer.send_and_wait(
                rec.topic, rec.key, rec.value, partition=None, timestamp=None, headers=None
            )

    if config.lease is not None:
        keeper = config.lease

        @app.task  # type: ignore[untyped-decorator]
        async def keep_lease() -> None:
            await keeper.keep(restart_as_standby)

    @app.task  # type: ignore[untyped-decorator]
    async def restore() -> None:
        observability.start(settings.metrics_address(config.metrics_port), settings.build_labels())
        await ensure_topics(factory, layout.shared_specs())
        skipped = await _restore(factory, core, config.clock())
        await probe.start()
        restored.set()
        if skipped:
            await publish(list(skipped))
        observability.mark(CONTROL_CAUGHT_UP)
        log.info("restored %d active rollouts", len(core.rollouts))

    if config.scale.enabled:

        @app.task  # type: ignore[untyped-decorator]
        async def refresh_partitions() -> None:
            await restored.wait()
            while True:
                await _note_partitions(factory, core)
                await asyncio.sleep(config.partitions_refresh_s)

    # Every record on its own (graylane.policy_engine.intake): a bad one is skipped,
    # counted and audited, and never stops the records of other rollouts or models.
    isolation = core.isolation

    @app.agent(telemetry)
    async def on_telemetry(stream: faust.StreamT[bytes]) -> None:
        await restored.wait()
        async for value in stream:
            skipped = telemetry_into(core, value, isolation, config.clock())
            if skipped is not None:
                await publish([skipped])

    @app.agent(commands)
    async def on_commands(stream: faust.StreamT[bytes]) -> None:
        await restored.wait()
        async for value in stream:
            at = config.clock()
            cmd = command_of(value, isolation, at)
            if isinstance(cmd, RecordSkipped):
                await publish([cmd])
            elif isinstance(cmd, CommandRejected):
                await publish([replace(cmd, at_ms=at)])
            else:
                model = cmd.model
                await publish(
                    isolation.guard(
                        partial(core.on_command, cmd, at), RecordSource.COMMANDS, at, model=model
                    )
                )

    for i, topic in enumerate(shadows):

        async def on_shadow(stream: faust.StreamT[bytes], _model: str = config.models[i]) -> None:
            await restored.wait()
            async for value in stream:
                output = shadow_of(value, isolation, config.clock())
                if isinstance(output, RecordSkipped):
                    await publish([output])
                else:
                    core.on_shadow_result(_model, output)

        app.agent(topic, name=f"shadow-{config.models[i]}")(on_shadow)

    @app.timer(interval=config.step_ms / 1000.0)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        observability.note_assignment(app.consumer.assignment())
        if not restored.is_set():
            return
        if config.lease is not None and not config.lease.active:
            return  # fenced: no decisions until the lease is held again
        # Liveness facts first: read from the broker, so a dead worker cannot hide.
        for model, version, sample in await probe.sample(core.liveness_targets(), config.clock()):
            core.on_offsets(model, version, sample)
        try:
            outputs = core.tick(config.clock())
        except PolicyError:
            log.exception("a decision failed; the rollout keeps its state")
            return
        await publish(outputs)

    @app.task  # type: ignore[untyped-decorator]
    async def close_probe() -> None:
        try:
            await asyncio.Event().wait()  # until the app stops and cancels its tasks
        finally:
            await probe.stop()

    return app


async def _restore(factory: KafkaFactory, core: PolicyCore, at_ms: int) -> list[RecordSkipped]:
    """Rebuild ``core`` from the control topics; the records that had to be skipped."""
    layout = factory.layout
    restored = restore_values(
        await read_latest_per_key(factory, layout.routing()),
        await read_latest_per_key(factory, layout.precision()),
        await read_latest_per_key(factory, layout.rollouts()),
        core.isolation,
        at_ms,
    )
    restored.qos_policies = await _qos_policies(factory)
    restored.apply(core)
    for value in (await read_latest_per_key(factory, layout.scale())).values():
        if not value:
            continue
        try:
            req = serde.decode(control_pb2.ScaleRequest, value)
        except SerdeError as exc:  # one bad record never blocks the others
            log.warning("skipping an undecodable scale request: %s", exc)
            continue
        key = (req.model, req.version)
        restore_scale(core, key, req.desired_replicas, req.epoch, req.decided_at_unix_ms)
    return restored.skipped


async def _note_partitions(factory: KafkaFactory, core: PolicyCore) -> None:
    """Partition counts of the scaled versions' topics (they bound the replicas)."""
    live = core.window.keys()  # a SlidingWindow, not a dict
    keys = {(k.model, k.version) for k in live} | set(core.scale_states)
    topics = {factory.layout.version_requests(m, v): (m, v) for m, v in sorted(keys)}
    try:
        counts = await partition_counts(factory, list(topics))
    except Exception as exc:  # the next refresh retries; the bound keeps its last value
        log.warning("partition counts not read: %s", exc)
        return
    for topic, n in counts.items():
        core.partitions[topics[topic]] = n


async def _qos_policies(factory: KafkaFactory) -> list[QosPolicy]:
    """The latest SET_QOS_POLICY per (model, version) on the commands topic."""
    latest: dict[tuple[str, str], QosPolicy] = {}
    for record in await read_to_end(
        factory, factory.layout.commands(), client_suffix="policy-restore"
    ):
        try:
            pb = serde.decode(rollout_pb2.RolloutCommand, record.value)
            if pb.kind == rollout_pb2.COMMAND_SET_QOS_POLICY:
                p = convert.qos_policy_from_pb(pb.qos_policy)
                latest[(p.model, p.version)] = p
        except Exception:  # a bad record is skipped, never fatal at restore
            continue
    return list(latest.values())
