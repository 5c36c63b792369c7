"""The faust-streaming adapter of :class:`~graylane.policy_engine.core.PolicyCore` (thin).

Agents decode telemetry, commands, shadow results and rated outcomes (raw bytes,
protobuf via ``graylane.serde``) into the core; a task samples the probed versions'
liveness from the broker every step (beside the tick, so broker reads never delay a
decision); a timer calls ``core.tick`` every step, publishes what it returns, then
starts the step evaluations the core says are due
(:class:`~graylane.policy_engine.step_evaluator.StepEvaluator`). Before any agent feeds
the core, a start-up task restores it from the compacted ``rollouts()``, ``routing()``,
``precision()`` and ``scale()`` topics read to their end, and the QoS policies from the
``SET_QOS_POLICY`` commands on record, so a restarted engine resumes its
rollouts and never writes an epoch below one already written.

Every record is taken on its own (:func:`telemetry_into`,
``wire.command_of``, ``wire.shadow_of``): a bad one is skipped, counted and
audited. :class:`PolicyObserver` turns the published outputs into metrics;
:func:`broker_settings` gives faust the same brokers and security as every
other client.

Graylane's topics are created beforehand (``ensure_topics``); faust only
subscribes to them. faust's own state is in memory (``memory://``), its web
server is off, and every record the core emits is produced with the
contract's key.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

import faust
from faust.types import TP
from faust.types.auth import CredentialsT

from graylane import serde
from graylane.clock import Clock, now_ms
from graylane.errors import GraylaneError, SerdeError
from graylane.kafka.admin import ensure_topics, partition_counts
from graylane.kafka.reading import read_latest_per_key, read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.metrics.controlside import PolicyMetrics
from graylane.metrics.process import CONTROL_CAUGHT_UP, ServiceObservability
from graylane.policy_engine import wire
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.isolation import RecordGuard
from graylane.policy_engine.lease import LeaseKeeper, default_holder, restart_as_standby
from graylane.policy_engine.liveness_probe import LivenessProbe
from graylane.policy_engine.logic.outcomes import RatedOutcome
from graylane.policy_engine.logic.qos import QosState
from graylane.policy_engine.logic.scale import ScalePolicy, ScaleState
from graylane.policy_engine.logic.window import (
    DEFAULT_STEP_MS,
    DEFAULT_WINDOW_MS,
    TelemetrySample,
    invalid_sample,
)
from graylane.policy_engine.messages import (
    CommandRejected,
    Output,
    PrecisionPublication,
    QosAudit,
    QosPolicySet,
    RecordSkipped,
    RecordSource,
    RolloutAudit,
    RolloutPublication,
    RoutingPublication,
    ScaleAudit,
    ScalePublication,
    SkipReason,
)
from graylane.policy_engine.metric_probe import PrometheusProbe
from graylane.policy_engine.shards import (
    OwnedShard,
    ShardMap,
    newest_by_epoch,
    precision_epoch,
    restrict,
    rollout_epoch,
    routing_epoch,
    scale_epoch,
)
from graylane.policy_engine.step_evaluator import StepEvaluator
from graylane.policy_engine.wire import (
    Restored,
    command_of,
    outcome_of,
    records_of,
    restore_values,
    running_build_of,
    shadow_of,
)
from graylane.rollouts.errors import PolicyError
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule, Phase
from graylane.settings import KafkaSecurity, SaslMechanism, SecurityProtocol, Settings
from graylane.v1 import telemetry_pb2

__all__ = [
    "FaustBrokerSettings",
    "PolicyConfig",
    "PolicyObserver",
    "UnshardableTopics",
    "UnsupportedSecurity",
    "broker_settings",
    "create_app",
    "credentials",
    "prepare_topics",
    "sample_into",
    "shard_partitions",
    "telemetry_into",
    "telemetry_sample",
]


log = logging.getLogger(__name__)

SESSION_TIMEOUT_S = 10.0
"""The policy engine's group session: a member silent this long loses its partitions."""


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
    prometheus_url: str | None = None
    """Where rollouts' metric gates (PromQL) are asked; None: they read inconclusive."""
    sharded: bool = False
    """Decide only for the models of the partitions the consumer group assigns this
    instance (several instances share the models); False: one instance decides for all."""


async def prepare_topics(settings: Settings, config: PolicyConfig) -> None:
    """Create the topics the engine reads and writes (idempotent), before faust subscribes."""
    factory = KafkaFactory(settings)
    specs = list(factory.layout.shared_specs())
    for model in config.models:
        specs += [s for s in factory.layout.model_specs(model, []) if "shadow" in s.name]
    await ensure_topics(factory, specs)
    if config.sharded:
        await shard_partitions(factory)


class UnshardableTopics(GraylaneError):
    """The topics a sharded policy engine reads are not co-partitioned."""


async def shard_partitions(factory: KafkaFactory) -> int:
    """The partition count shared by telemetry, commands and outcomes (the shards)."""
    layout = factory.layout
    counts = await partition_counts(
        factory, [layout.telemetry(), layout.commands(), layout.outcomes()]
    )
    if len(set(counts.values())) != 1:
        raise UnshardableTopics(
            f"a sharded policy engine needs telemetry, commands and outcomes with one "
            f"partition count, not {counts}; add partitions to the smaller ones "
            f"(kafka-topics --alter --partitions N) or run without --sharded"
        )
    return next(iter(counts.values()))


def create_app(settings: Settings, config: PolicyConfig) -> faust.App:
    factory = KafkaFactory(settings)
    layout = factory.layout
    decided_by = running_build_of(
        version=settings.image_version,
        git_sha=settings.git_sha,
        build_time=settings.build_time,
        instance=config.lease.holder if config.lease else (config.instance_id or default_holder()),
    )
    shards = ShardMap(
        partial(PolicyCore, config.window_ms, config.step_ms, scale_policy=config.scale),
        decided_by,
        sharded=config.sharded,
    )
    probe = LivenessProbe(factory)
    metric_probe = PrometheusProbe(config.prometheus_url) if config.prometheus_url else None
    # The evaluations rollout steps require: run in tasks of their own, judged by the core.
    evaluator = StepEvaluator(
        factory,
        config.clock,
        lambda outcome: any(s.core.on_evaluation(outcome) for s in shards.owned()),
    )
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
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=3.0,
        # A restarted engine (same instance id) takes its partitions back without
        # waiting for its dead self's session: decisions resume within seconds.
        consumer_group_instance_id=config.instance_id or None,
    )
    app.conf.producer_acks = -1
    if not config.sharded:
        app.core = shards.owned()[0].core  # type: ignore[attr-defined]  # for tests
    app.shards = shards  # type: ignore[attr-defined]  # for tests and introspection
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
    outcomes = raw_topic(layout.outcomes())

    async def publish(outputs: list[Output], shard: OwnedShard | None = None) -> None:
        if config.lease is not None:  # fenced while the lease lapsed: wait to hold it again
            await config.lease.wait_writable()
        observer.observe(outputs)
        observer.desired_replicas(s for o in shards.owned() for s in o.core.scaling.states.values())
        stamp = decided_by if shard is None else shard.decided_by
        # All of a tick's records in flight at once, then every acknowledgement awaited:
        # one round trip per tick, not one per record. The producer keeps a partition's
        # records in order (one batch in flight per partition).
        pending = [
            await app.producer.send(
                rec.topic, rec.key, rec.value, partition=None, timestamp=None, headers=None
            )
            for rec in records_of(outputs, layout, decided_by=stamp)
        ]
        for ack in pending:
            await ack

    if config.lease is not None:
        keeper = config.lease

        @app.task  # type: ignore[untyped-decorator]
        async def keep_lease() -> None:
            await keeper.keep(restart_as_standby)

    @app.task  # type: ignore[untyped-decorator]
    async def restore() -> None:
        observability.start(settings.metrics_address(config.metrics_port), settings.build_labels())
        await ensure_topics(factory, layout.shared_specs())
        skipped: list[RecordSkipped] = []
        if config.sharded:  # each partition's models are restored when it is assigned
            shards.partitions = await shard_partitions(factory)
        else:
            (only,) = shards.owned()
            skipped = await _restore(factory, only.core, config.clock())
            only.ready.set()
        await probe.start()
        restored.set()
        if skipped:
            await publish(list(skipped))
        observability.mark(CONTROL_CAUGHT_UP)
        if config.sharded:
            log.info("restored: sharded over %d partitions", shards.partitions)
        else:
            log.info("restored %d active rollouts", len(shards.owned()[0].core.rollouts))

    if config.sharded:

        @app.on_partitions_revoked.connect  # type: ignore[arg-type]
        async def on_revoked(sender: faust.App, *_: object, **__: object) -> None:
            # No decision and no record taken until the group has assigned the partitions
            # again (eager rebalance: every member gives all of its partitions up first);
            # a tick in flight finishes first.
            shards.settled.clear()
            async with shards.lock:
                shards.revoking()

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]
        async def on_assigned(sender: faust.App, *args: object, **_: object) -> None:
            (assigned,) = args
            generation = sender.consumer_generation_id  # of this assignment
            await restored.wait()
            mine = {
                tp.partition for tp in cast("set[TP]", assigned) if tp.topic == layout.commands()
            }
            async with shards.lock:
                gone, new = shards.reassign(mine, generation)
            for shard in gone:
                log.info(
                    "partition %d revoked (generation %d): %s no longer decides for its models",
                    shard.ownership.partition,
                    generation,
                    decided_by.instance,
                )
            if not new:
                return
            values = await _read_owned_control(factory, shards.guard, config.clock())
            for shard in new:
                part = shard.ownership.partition
                restrict(values, shards.models_of(part)).apply(shard.core)
                shard.ready.set()
                log.info(
                    "restored partition %d as instance %s (generation %d, epochs above %d): "
                    "%d active rollouts",
                    part,
                    decided_by.instance,
                    generation,
                    shard.ownership.floor,
                    len(shard.core.rollouts),
                )

    if config.scale.enabled:

        @app.task  # type: ignore[untyped-decorator]
        async def refresh_partitions() -> None:
            await restored.wait()
            while True:
                for shard in shards.ready():
                    await _note_partitions(factory, shard.core)
                await asyncio.sleep(config.partitions_refresh_s)

    # Every record on its own (telemetry_into, wire.command_of, wire.shadow_of): a bad one is
    # skipped, counted and audited, and never stops the records of other rollouts or models.
    guard = shards.guard

    @app.agent(telemetry)
    async def on_telemetry(stream: faust.StreamT[bytes]) -> None:
        await restored.wait()
        async for event in stream.events():
            at = config.clock()
            observer.metrics.telemetry_records.inc()
            written_s = event.message.timestamp
            observer.metrics.telemetry_delay_seconds.observe(max(0.0, at / 1000.0 - written_s))
            sample = telemetry_sample(event.value, guard, at)
            if isinstance(sample, RecordSkipped):
                await publish([sample])
                continue
            core = await shards.core_for(sample.model)
            if core is None:
                continue  # another instance's model
            skipped = sample_into(core, sample, guard, at)
            if skipped is not None:
                await publish([skipped])

    @app.agent(commands)
    async def on_commands(stream: faust.StreamT[bytes]) -> None:
        await restored.wait()
        async for value in stream:
            at = config.clock()
            cmd = command_of(value, guard, at)
            if isinstance(cmd, RecordSkipped):
                await publish([cmd])
            elif isinstance(cmd, CommandRejected):
                if shards.shard_of(cmd.command.model) is not None:  # the model's owner says so
                    await publish([replace(cmd, at_ms=at)], shards.shard_of(cmd.command.model))
            else:
                model = cmd.model
                shard = shards.shard_of(model)
                core = await shards.core_for(model)
                if core is None:
                    continue  # another instance's model
                await publish(
                    guard.run(
                        partial(core.on_command, cmd, at), RecordSource.COMMANDS, at, model=model
                    ),
                    shard,
                )

    @app.agent(outcomes)
    async def on_outcomes(stream: faust.StreamT[bytes]) -> None:
        await restored.wait()
        async for value in stream:
            at = config.clock()
            outcome = outcome_of(value, guard, at)
            if isinstance(outcome, RecordSkipped):
                await publish([outcome])
                continue
            core = await shards.core_for(outcome.model)
            if core is None:
                continue  # another instance's model
            failed = guard.run(
                partial(_joined, core, outcome), RecordSource.OUTCOMES, at, model=outcome.model
            )
            if failed:
                await publish(failed)

    for i, topic in enumerate(shadows):

        async def on_shadow(stream: faust.StreamT[bytes], _model: str = config.models[i]) -> None:
            await restored.wait()
            async for value in stream:
                output = shadow_of(value, guard, config.clock())
                if isinstance(output, RecordSkipped):
                    await publish([output])
                else:
                    core = await shards.core_for(_model)
                    if core is not None:  # sharded: the owner's share of the pairs
                        core.on_shadow_result(_model, output)

        app.agent(topic, name=f"shadow-{config.models[i]}")(on_shadow)

    @app.task  # type: ignore[untyped-decorator]
    async def sample_liveness() -> None:
        # Liveness read from the broker beside the tick, never inside it: a dead worker
        # cannot hide (its group's offsets are read every step), and a slow answer from
        # the broker delays the next sample, not every decision of every model.
        await restored.wait()
        while True:
            started = asyncio.get_running_loop().time()
            with observer.metrics.liveness_probe_seconds.time():
                for shard in shards.ready():
                    owner = shard.core
                    for key, sample in await probe.sample(owner.liveness_targets(), config.clock()):
                        owner.on_offsets(key, sample)
            spent = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(0.0, config.step_ms / 1000.0 - spent))

    @app.timer(interval=config.step_ms / 1000.0)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        observability.note_assignment(app.consumer.assignment())
        if not restored.is_set():
            return
        if config.lease is not None and not config.lease.active:
            return  # fenced: no decisions until the lease is held again
        # Held while deciding and publishing: a rebalance waits for the tick to finish,
        # and a revoked partition's models get no decision from here after it.
        async with shards.lock:
            if not shards.may_decide(asyncio.get_running_loop().time(), SESSION_TIMEOUT_S):
                return  # rebalancing, or silent past the session: maybe no longer the owner
            with observer.metrics.tick_seconds.time():
                await tick_shards()

    async def tick_shards() -> None:
        for shard in shards.ready():
            core = shard.core
            await read_metric_gates(core, metric_probe, config.clock())
            try:
                outputs = core.tick(config.clock())
            except PolicyError:
                log.exception("a decision failed; the rollout keeps its state")
                continue
            await publish(outputs, shard)
            evaluator.schedule(core.evaluations_due(config.clock()))

    @app.task  # type: ignore[untyped-decorator]
    async def close_probe() -> None:
        try:
            await asyncio.Event().wait()  # until the app stops and cancels its tasks
        finally:
            await evaluator.close()
            await probe.stop()
            if metric_probe is not None:
                await metric_probe.close()

    return app


async def read_metric_gates(core: PolicyCore, probe: PrometheusProbe | None, at_ms: int) -> None:
    """Every active rollout's metric gates read into the core before it decides."""
    targets = core.metric_targets()
    if not targets:
        return
    if probe is None:
        for target in targets:
            core.on_metric(target, None, "no Prometheus configured (--prometheus-url)", at_ms)
        return
    for target, value, why in await probe.read(targets):
        core.on_metric(target, value, why, at_ms)


def _joined(core: PolicyCore, outcome: RatedOutcome) -> list[Output]:
    core.on_outcome(outcome)
    return []


async def _restore(factory: KafkaFactory, core: PolicyCore, at_ms: int) -> list[RecordSkipped]:
    """Rebuild ``core`` from the control topics; the records that had to be skipped."""
    restored = await _read_control(factory, core.guard, at_ms)
    restored.apply(core)
    return restored.skipped


async def _read_control(factory: KafkaFactory, guard: RecordGuard, at_ms: int) -> Restored:
    """The control topics read to their end, and the QoS policies among the commands."""
    layout = factory.layout
    commands = await read_to_end(factory, layout.commands(), client_suffix="policy-restore")
    return restore_values(
        await read_latest_per_key(factory, layout.routing()),
        await read_latest_per_key(factory, layout.precision()),
        await read_latest_per_key(factory, layout.rollouts()),
        guard,
        at_ms,
        scale=await read_latest_per_key(factory, layout.scale()),
        commands=[record.value for record in commands],
    )


async def _read_owned_control(factory: KafkaFactory, guard: RecordGuard, at_ms: int) -> Restored:
    """:func:`_read_control` for a new owner: per key the record of the highest epoch, not
    merely the latest (what an instance that lost the partition wrote on is passed over)."""
    layout = factory.layout

    async def newest(topic: str, epoch_of: Callable[[bytes], int]) -> dict[bytes, bytes | None]:
        records = await read_to_end(factory, topic, client_suffix="policy-restore")
        return newest_by_epoch(((r.key, r.value) for r in records), epoch_of)

    commands = await read_to_end(factory, layout.commands(), client_suffix="policy-restore")
    return restore_values(
        await newest(layout.routing(), routing_epoch),
        await newest(layout.precision(), precision_epoch),
        await newest(layout.rollouts(), rollout_epoch),
        guard,
        at_ms,
        scale=await newest(layout.scale(), scale_epoch),
        commands=[record.value for record in commands],
    )


async def _note_partitions(factory: KafkaFactory, core: PolicyCore) -> None:
    """Partition counts of the scaled versions' topics (they bound the replicas)."""
    topics = {
        factory.layout.version_requests(k.model, k.version): k for k in core.scaled_versions()
    }
    try:
        counts = await partition_counts(factory, list(topics))
    except Exception as exc:  # the next refresh retries; the bound keeps its last value
        log.warning("partition counts not read: %s", exc)
        return
    core.note_partitions({topics[topic]: n for topic, n in counts.items()})


def telemetry_into(
    core: PolicyCore, value: bytes | None, guard: RecordGuard, at_ms: int
) -> RecordSkipped | None:
    """Feed one telemetry record to the core; what was skipped, if it was."""
    sample = telemetry_sample(value, guard, at_ms)
    if isinstance(sample, RecordSkipped):
        return sample
    return sample_into(core, sample, guard, at_ms)


def telemetry_sample(
    value: bytes | None, guard: RecordGuard, at_ms: int
) -> TelemetrySample | RecordSkipped:
    """One telemetry record decoded, or why it was skipped."""
    try:
        return wire.telemetry_from_pb(serde.decode(telemetry_pb2.BatchTelemetry, value))
    except SerdeError as exc:
        return guard.skip(RecordSource.TELEMETRY, SkipReason.UNDECODABLE, str(exc), at_ms)
    except Exception as exc:  # a histogram without a valid scheme, ...
        detail = f"{type(exc).__name__}: {exc}"
        return guard.skip(RecordSource.TELEMETRY, SkipReason.INVALID, detail, at_ms)


def sample_into(
    core: PolicyCore, sample: TelemetrySample, guard: RecordGuard, at_ms: int
) -> RecordSkipped | None:
    """Feed one decoded telemetry sample to the core; what was skipped, if it was."""
    problem = invalid_sample(sample, core.window.scheme)
    if problem is None:
        try:
            core.on_telemetry(sample, received_ms=at_ms)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        return guard.skip(
            RecordSource.TELEMETRY,
            SkipReason.INVALID,
            problem,
            at_ms,
            model=sample.model,
            version=sample.version,
        )
    return None


_PHASES = tuple(p.value for p in Phase)
_ACTIVE = {Phase.PENDING, Phase.SHADOWING, Phase.PROGRESSING, Phase.AB_HOLDING, Phase.PAUSED}


@dataclass
class PolicyObserver:
    """Feed it every batch of outputs the engine publishes."""

    metrics: PolicyMetrics
    _policies: dict[tuple[str, str], QosPolicy] = field(default_factory=dict)

    def observe(self, outputs: Iterable[Output]) -> None:
        for out in outputs:
            self._one(out)

    def _one(self, out: Output) -> None:
        m = self.metrics
        if isinstance(out, RolloutAudit):
            rd = out.decision
            m.decisions.labels(out.spec.model, rd.kind.value, str(rd.rule)).inc()
        elif isinstance(out, RolloutPublication):
            state, spec = out.state, out.spec
            m.set_phase(spec.model, spec.candidate, state.phase.value, _PHASES)
            m.rollout_step.labels(spec.model, spec.candidate).set(state.step_index)
            m.set_roles(spec.model, spec.baseline, spec.candidate, state.phase in _ACTIVE)
        elif isinstance(out, RoutingPublication):
            m.routing_epoch.labels(out.plan.model).set(out.plan.epoch)
        elif isinstance(out, QosAudit):
            qd = out.decision
            m.decisions.labels(qd.after.model, qd.kind.value, str(qd.rule)).inc()
            self._qos(qd.after)
        elif isinstance(out, PrecisionPublication):
            self._qos(out.decision.after)
        elif isinstance(out, QosPolicySet):
            policy = out.policy
            self._policies[(policy.model, policy.version)] = policy
            mv = (policy.model, policy.version)
            m.qos_slo_p99.labels(*mv).set(policy.slo_p99_ms / 1000.0)
            m.qos_slo_ttft_p99.labels(*mv).set(policy.slo_ttft_p99_ms / 1000.0)
            m.qos_slo_tpot_p99.labels(*mv).set(policy.slo_tpot_p99_ms / 1000.0)
            self._qos(out.after)
        elif isinstance(out, ScalePublication):
            after = out.decision.after
            m.desired_replicas.labels(after.model, after.version).set(after.desired)
        elif isinstance(out, ScaleAudit):
            d = out.decision
            m.decisions.labels(d.after.model, d.kind.value, str(d.rule)).inc()
        elif isinstance(out, RecordSkipped):
            m.skipped_records.labels(out.source.value, out.reason.value).inc()
            if out.reason is SkipReason.FAILED:
                m.decision_errors.labels(out.model, out.source.value).inc()
        elif isinstance(out, CommandRejected):
            m.decisions.labels(
                out.command.model, "rejected", str(DecisionRule.COMMAND_REJECTED)
            ).inc()

    def desired_replicas(self, states: Iterable[ScaleState]) -> None:
        """Every scaled version's desired replicas (also those restored or not yet changed)."""
        for state in states:
            self.metrics.desired_replicas.labels(state.model, state.version).set(state.desired)

    def _qos(self, state: QosState) -> None:
        labels = (state.model, state.version)
        m = self.metrics
        m.qos_breaching.labels(*labels).set(int(state.breach_since_ms is not None))
        policy = self._policies.get(labels)
        if policy is None or state.active_variant not in policy.ladder:
            return
        floor = policy.quality_floor or policy.ladder[-1]
        m.qos_variant_index.labels(*labels).set(policy.ladder.index(state.active_variant))
        m.qos_at_floor.labels(*labels).set(int(state.active_variant == floor))


class UnsupportedSecurity(GraylaneError):
    """The security settings cannot be expressed as faust credentials."""


@dataclass(frozen=True)
class FaustBrokerSettings:
    """The ``faust.App`` keyword arguments that say how to reach the brokers."""

    broker: list[str]
    broker_client_id: str
    broker_credentials: CredentialsT | None


def credentials(security: KafkaSecurity) -> CredentialsT | None:
    """faust credentials equivalent to ``security`` (None for plaintext)."""
    options = security.client_options()  # validates, and builds the SSL context
    context = options.get("ssl_context")
    ssl_context = context if isinstance(context, ssl.SSLContext) else None
    if security.protocol is SecurityProtocol.PLAINTEXT:
        return None
    if security.protocol is SecurityProtocol.SSL:
        return faust.SSLCredentials(ssl_context)
    mechanism = security.sasl_mechanism
    if mechanism is SaslMechanism.GSSAPI:
        return faust.GSSAPICredentials(mechanism=mechanism.value, ssl_context=ssl_context)
    if mechanism is SaslMechanism.OAUTHBEARER or mechanism is None:
        raise UnsupportedSecurity(
            f"SASL mechanism {mechanism} needs a token provider; the policy engine has none"
        )
    return faust.SASLCredentials(
        username=security.sasl_username,
        password=security.sasl_password,
        ssl_context=ssl_context,
        mechanism=mechanism.value,
    )


def broker_settings(settings: Settings, *, client_suffix: str = "policy") -> FaustBrokerSettings:
    return FaustBrokerSettings(
        broker=[f"kafka://{b.strip()}" for b in settings.bootstrap_servers.split(",")],
        broker_client_id=f"{settings.client_id}-{client_suffix}",
        broker_credentials=credentials(settings.security),
    )
