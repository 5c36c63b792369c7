"""The metric catalogue: names, labels and units as Prometheus scrapes them."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from collections.abc import Awaitable
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from graylane.kafka.consume_loop import ConsumeLoop, LoopHooks
from graylane.kafka.seam import ConsumerOptions, Record
from graylane.metrics.catalogue import catalogue, series_names
from graylane.metrics.controlside import AuditSinkMetrics, ControlPlaneMetrics, PolicyMetrics
from graylane.metrics.dataplane import RouterMetrics, WorkerMetrics
from graylane.metrics.gpu import NvmlCollector
from graylane.metrics.process import (
    BuildLabels,
    LoopHeartbeats,
    MetricsAddress,
    Readiness,
    ServiceObservability,
    process_heartbeats,
    serve_observability,
)
from graylane.metrics.units import MillisecondHistogram, build_info
from graylane.settings import Settings
from tests.support.memory_kafka import MemoryBroker, MemoryFactory


def _scrape(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples


def test_worker_takes_milliseconds_and_exports_seconds() -> None:
    registry = CollectorRegistry()
    m = WorkerMetrics.create(registry)
    labels = ("demo-gpt", "1.2.0", "fp16")
    m.queue_wait_ms.labels(*labels).observe(40.0)
    m.compute_ms.labels(*labels).observe(2000.0)
    m.e2e_latency_ms.labels(*labels).observe(120.0)
    m.service_ms.labels(*labels).observe(80.0)
    m.requests.labels(*labels).inc(3)
    m.errors.labels(*labels, "DEADLINE_EXCEEDED").inc()
    m.shed.labels(*labels, "deadline").inc()
    m.consumer_lag.labels("demo-gpt", "1.2.0", "gl.demo-gpt.1.2.0.requests").set(17)
    got = _scrape(registry)
    want = {"model": "demo-gpt", "version": "1.2.0", "variant": "fp16"}
    assert got["graylane_worker_queue_wait_seconds_sum"] == [(want, pytest.approx(0.04))]
    assert got["graylane_worker_compute_seconds_sum"] == [(want, pytest.approx(2.0))]
    assert got["graylane_e2e_latency_seconds_sum"] == [(want, pytest.approx(0.12))]
    assert got["graylane_worker_service_seconds_sum"] == [(want, pytest.approx(0.08))]
    assert got["graylane_worker_requests_total"] == [(want, 3.0)]
    assert got["graylane_worker_errors_total"] == [({**want, "code": "DEADLINE_EXCEEDED"}, 1.0)]
    assert got["graylane_worker_shed_total"] == [({**want, "reason": "deadline"}, 1.0)]
    lag = got["graylane_worker_consumer_lag_messages"]
    assert lag == [
        ({"model": "demo-gpt", "version": "1.2.0", "topic": "gl.demo-gpt.1.2.0.requests"}, 17.0)
    ]
    buckets = {lbl["le"] for lbl, _ in got["graylane_e2e_latency_seconds_bucket"]}
    assert {"0.1", "0.25", "+Inf"} <= buckets


def test_router_table_applied_sets_epoch_weights_and_age() -> None:
    now = [1000.0]
    registry = CollectorRegistry()
    m = RouterMetrics.create(registry, clock=lambda: now[0])
    m.table_applied("demo-gpt", 7, {"1.0.0": 0.9, "1.1.0": 0.1})
    now[0] += 42.5
    m.routed.labels("demo-gpt", "1.1.0", "weighted").inc()
    m.shed.labels("demo-gpt", "overload").inc()
    got = _scrape(registry)
    assert got["graylane_router_table_epoch"] == [({"model": "demo-gpt"}, 7.0)]
    assert sorted(got["graylane_router_weight_ratio"], key=lambda s: s[0]["version"]) == [
        ({"model": "demo-gpt", "version": "1.0.0"}, 0.9),
        ({"model": "demo-gpt", "version": "1.1.0"}, 0.1),
    ]
    assert got["graylane_router_table_age_seconds"] == [({"model": "demo-gpt"}, 42.5)]
    assert got["graylane_router_requests_total"][0][0]["reason"] == "weighted"
    assert got["graylane_router_shed_total"] == [({"model": "demo-gpt", "reason": "overload"}, 1.0)]


def test_policy_phase_is_a_state_set_and_roles_switch_off() -> None:
    registry = CollectorRegistry()
    m = PolicyMetrics.create(registry)
    phases = ("pending", "progressing", "ab_holding", "promoted")
    m.set_phase("demo-gpt", "1.1.0", "progressing", phases)
    m.set_roles("demo-gpt", "1.0.0", "1.1.0", active=True)
    m.set_roles("demo-gpt", "1.0.0", "1.1.0", active=False)
    m.decisions.labels("demo-gpt", "hold", "p99_regression").inc()
    m.desired_replicas.labels("demo-gpt", "1.1.0").set(3)
    m.qos_slo_p99.labels("demo-gpt", "1.0.0").set(0.25)
    got = _scrape(registry)
    phase = {lbl["phase"]: v for lbl, v in got["graylane_rollout_phase"]}
    assert phase == {"pending": 0, "progressing": 1, "ab_holding": 0, "promoted": 0}
    assert {lbl["role"]: v for lbl, v in got["graylane_rollout_role"]} == {
        "baseline": 0.0,
        "candidate": 0.0,
    }
    dec = got["graylane_policy_decisions_total"]
    assert dec == [({"model": "demo-gpt", "kind": "hold", "rule": "p99_regression"}, 1.0)]
    assert got["graylane_desired_replicas"] == [({"model": "demo-gpt", "version": "1.1.0"}, 3.0)]


def test_every_service_registers_into_one_registry_with_build_info() -> None:
    for create in (
        RouterMetrics.create,
        WorkerMetrics.create,
        PolicyMetrics.create,
        ControlPlaneMetrics.create,
        AuditSinkMetrics.create,
    ):
        registry = CollectorRegistry()
        create(registry)
        build_info(registry, service="x", version="0.1.0", git_sha="abc123")
        got = _scrape(registry)
        assert got["graylane_build_info"] == [
            (
                {"service": "x", "version": "0.1.0", "git_sha": "abc123", "build_time": "unknown"},
                1.0,
            )
        ]


def test_catalogue_follows_prometheus_naming() -> None:
    families = catalogue()
    assert len(families) >= 35
    for name, kind in families.items():
        assert name.startswith("graylane_"), name
        assert not name.endswith(("_ms", "_total")), name
        if kind == "histogram" and name != "graylane_worker_batch_size":
            assert name.endswith("_seconds"), f"{name}: durations are in seconds"
    names = series_names()
    assert "graylane_router_requests_total" in names
    assert "graylane_e2e_latency_seconds_bucket" in names
    assert "graylane_router_requests" not in names


def test_gpu_collector_without_nvml_exports_nothing_and_with_it_reads_each_gpu() -> None:
    assert list(NvmlCollector("m", "1.0.0", None).collect()) == []
    fake = SimpleNamespace(
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=37),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2**30, total=2**34),
    )
    registry = CollectorRegistry()
    registry.register(NvmlCollector("m", "1.0.0", fake))
    got = _scrape(registry)
    labels = {"model": "m", "version": "1.0.0", "gpu": "0"}
    assert got["graylane_gpu_utilization_ratio"] == [(labels, 0.37)]
    assert got["graylane_gpu_memory_used_bytes"] == [(labels, float(2**30))]
    assert got["graylane_gpu_memory_total_bytes"] == [(labels, float(2**34))]


def test_readiness_needs_every_condition() -> None:
    ready = Readiness(("group_joined", "control_caught_up"))
    assert not ready() and ready.missing() == ("group_joined", "control_caught_up")
    ready.mark("group_joined")
    ready.mark("control_caught_up")
    assert ready()
    ready.mark("group_joined", met=False)
    assert ready.missing() == ("group_joined",)
    with pytest.raises(KeyError):
        ready.mark("nonsense")
    with pytest.raises(ValueError):
        Readiness(("a", "a"))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_server_answers_metrics_healthz_and_readyz() -> None:
    registry = CollectorRegistry()
    build_info(registry, service="router", version="0.1.0", git_sha="abc")
    ready = Readiness(("group_joined",))
    server = serve_observability(registry, MetricsAddress(host="127.0.0.1", port=0), ready)
    base = f"http://127.0.0.1:{server.port}"
    try:
        code, body = _get(base + "/metrics")
        assert code == 200 and 'graylane_build_info{build_time="unknown",git_sha="abc"' in body
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz") == (503, "not ready: group_joined\n")
        ready.mark("group_joined")
        assert _get(base + "/readyz") == (200, "ready\n")
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_address_rejects_bad_port() -> None:
    with pytest.raises(ValueError):
        MetricsAddress(port=70000)


def test_a_millisecond_histogram_must_export_seconds() -> None:
    with pytest.raises(ValueError, match="seconds"):
        MillisecondHistogram.create("graylane_x_ms", "doc", ["model"], CollectorRegistry())


def test_healthz_fails_while_a_loop_has_not_beaten_within_the_bound() -> None:
    now = [1000.0]
    beats = LoopHeartbeats(stale_after_s=30.0, clock=lambda: now[0])
    address = MetricsAddress(host="127.0.0.1", port=0)
    server = serve_observability(CollectorRegistry(), address, alive=beats)
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        assert _get(url) == (200, "ok\n")  # no loop running yet
        with beats.loop("router") as beat:
            assert _get(url)[0] == 200  # counted from its first beat
            beat()
            now[0] += 30.0
            assert _get(url)[0] == 200
            now[0] += 1.0
            assert _get(url) == (503, "stalled: router (no progress for 31 s)\n")
            beat()
            assert _get(url) == (200, "ok\n")
            now[0] += 31.0
            assert beats.stalled() == [("router", 31.0)]
        assert _get(url) == (200, "ok\n")  # a loop that ended is no longer watched
    finally:
        server.close()
    with pytest.raises(ValueError):
        LoopHeartbeats(stale_after_s=0)


async def test_a_consume_loop_stuck_in_a_turn_makes_its_service_healthz_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: ``/healthz`` answered 200 whatever the process was doing, so a service
    whose consume loop hung was never restarted by its liveness probe."""
    now = [1000.0]
    beats = process_heartbeats()
    monkeypatch.setattr(beats, "clock", lambda: now[0])
    monkeypatch.setattr(beats, "stale_after_s", 30.0)
    factory = MemoryFactory(
        MemoryBroker(), Settings(topic_prefix="t", partitions=1, instance_id="healthz-test")
    )
    factory.broker.create_topic("t.in", 1)
    factory.broker.append("t.in", b"r0", partition=0)
    loop = ConsumeLoop(
        "router",
        factory,
        ["t.in"],
        ConsumerOptions(group_id="g"),
        role="test",
        client_suffix="test",
        poll_ms=10,
    )
    stuck = asyncio.Event()

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        stuck.set()
        await asyncio.Event().wait()  # a turn that never ends
        return []

    obs = ServiceObservability("router", registry=CollectorRegistry())
    obs.start(MetricsAddress(host="127.0.0.1", port=0), BuildLabels())
    url = f"http://127.0.0.1:{obs.port}/healthz"
    await loop.start()
    task = asyncio.create_task(loop.run(asyncio.Event(), LoopHooks(handle=handle)))
    try:
        await asyncio.wait_for(stuck.wait(), 10)
        assert (await asyncio.to_thread(_get, url))[0] == 200
        now[0] += 31.0
        code, body = await asyncio.to_thread(_get, url)
        assert code == 503 and "router" in body, body
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await loop.stop()
    assert (await asyncio.to_thread(_get, url))[0] == 200  # the loop ended
    obs.close()
