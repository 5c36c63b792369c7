"""A PromQL gate end to end: the real policy-engine process asks a real Prometheus, which
scrapes a metric the test exports per version; synthetic telemetry on the real broker
feeds the other gates. A candidate whose metric breaks the condition is held and rolled
back with the readings in the audit; a Prometheus nobody answers at is inconclusive, holds,
and pauses the rollout once the gate's time is up."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from graylane.app.bench.harness import stack_env
from graylane.app.bench.policy_scale import PolicyScaleConfig, TelemetryWriter
from graylane.app.cli.demo import start_service, stop_services
from graylane.deploy.prometheus.server import PrometheusServer, prometheus_binary
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import audit_pb2, rollout_pb2
from tests.support.records import read_audits, send_command
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

QUERY = 'max(test_quality_regressions{model="{{model}}",version="{{candidate}}"})'


def _spec(model: str, pause_s: float) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=f"{model}-r",
        model=model,
        baseline_version="v1",
        candidate_version="v2",
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=10, min_samples=10_000, min_dwell_s=3600),
            rollout_pb2.RolloutStep(weight_percent=100),
        ],
        gates=rollout_pb2.GateSpec(
            metrics=[
                rollout_pb2.MetricGate(
                    name="quality-regressions",
                    query=QUERY,
                    comparison=rollout_pb2.METRIC_LESS,
                    threshold=1.0,
                    pause_after_inconclusive_s=pause_s,
                )
            ]
        ),
        failures_to_rollback=2,
    )


def _start(spec: rollout_pb2.RolloutSpec) -> rollout_pb2.RolloutCommand:
    return rollout_pb2.RolloutCommand(
        command_id=f"c-{spec.rollout_id}",
        rollout_id=spec.rollout_id,
        model=spec.model,
        kind=rollout_pb2.COMMAND_START,
        spec=spec,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _engine_with_telemetry(
    factory: KafkaFactory, model: str, prometheus_url: str, log_name: str
) -> AsyncIterator[None]:
    layout = factory.layout
    await ensure_topics(
        factory,
        [*layout.shared_specs(), *layout.model_specs(model, ["v1", "v2"])],
    )
    engine = start_service(
        log_name,
        [
            "policy",
            "--no-lease",
            "--window-ms",
            "4000",
            "--step-ms",
            "500",
            "--prometheus-url",
            prometheus_url,
        ],
        REPO_ROOT / ".local" / "logs",
        stack_env(factory.settings),
    )
    writer = TelemetryWriter(layout.telemetry(), [model], PolicyScaleConfig(batches_per_s=4.0))
    producer = factory.producer()
    await producer.start()
    stop = asyncio.Event()
    writing = asyncio.create_task(writer.run(producer, stop))
    try:
        yield
    finally:
        stop.set()
        await writing
        await producer.stop()
        stop_services([engine])


def _rules(audits: list[audit_pb2.AuditRecord]) -> list[str]:
    return [a.rule for a in audits]


@pytest.mark.timeout(300)
async def test_a_promql_gate_holds_a_bad_candidate_and_an_unreachable_prometheus_is_inconclusive(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    prometheus_binary()  # installed from Debian when missing
    registry = CollectorRegistry()
    regressions = Gauge(
        "test_quality_regressions",
        "Answers the test's workers judged regressed",
        ["model", "version"],
        registry=registry,
    )
    regressions.labels("gated", "v1").set(0)
    regressions.labels("gated", "v2").set(5)  # the candidate regressed: 5 is not < 1
    exporter, exporter_thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = exporter.server_address[1]
    try:
        with PrometheusServer.start(
            {"test-workers": [f"127.0.0.1:{port}"]}, tmp_path / "prometheus", interval_s=0.5
        ) as prom:

            def scraped() -> bool:
                return any(s.value == 5.0 for s in prom.query("test_quality_regressions"))

            await wait_until(scraped, timeout=60, poll_s=0.5, what="the metric scraped")
            async with _engine_with_telemetry(factory, "gated", prom.url, "policy-metric-gate"):
                await send_command(factory, _start(_spec("gated", 0.0)))

                async def rolled_back() -> bool:
                    audits = await read_audits(factory, model="gated")
                    return any(a.kind == audit_pb2.DECISION_ROLLBACK for a in audits)

                await wait_until(rolled_back, timeout=90, poll_s=0.5, what="a rollback")
    finally:
        exporter.shutdown()
        exporter_thread.join(timeout=5)
    audits = await read_audits(factory, model="gated")
    failed = [a for a in audits if a.kind == audit_pb2.DECISION_GATE_FAILED]
    assert failed and all(a.rule == "metric_gate" for a in failed), _rules(audits)
    (reading,) = failed[0].metric_readings
    assert (reading.gate, reading.value) == ("quality-regressions", 5.0)
    assert any(a.kind == audit_pb2.DECISION_ROLLBACK for a in audits), _rules(audits)
    assert not any(a.kind == audit_pb2.DECISION_ADVANCE for a in audits)

    # The same gate against a Prometheus nobody answers at: held inconclusive, then paused.
    nobody = f"http://127.0.0.1:{_free_port()}"
    other = factory.settings.with_overrides(topic_prefix=factory.settings.topic_prefix + "-x")
    factory2 = KafkaFactory(other)
    async with _engine_with_telemetry(factory2, "silent", nobody, "policy-metric-silent"):
        await send_command(factory2, _start(_spec("silent", 2.0)))

        async def paused() -> bool:
            audits = await read_audits(factory2, model="silent")
            return any(a.rollout_after.phase == rollout_pb2.PAUSED for a in audits)

        await wait_until(paused, timeout=90, poll_s=0.5, what="a pause")
    audits = await read_audits(factory2, model="silent")
    held = [a for a in audits if a.rule == "metric_inconclusive"]
    assert held, _rules(audits)
    assert all("Prometheus unreachable" in r.inconclusive for a in held for r in a.metric_readings)
    assert not any(r.HasField("value") for a in held for r in a.metric_readings)
    assert any(a.rollout_after.phase == rollout_pb2.PAUSED for a in held), _rules(audits)
    assert not any(
        a.kind in (audit_pb2.DECISION_ADVANCE, audit_pb2.DECISION_PROMOTE) for a in audits
    )
