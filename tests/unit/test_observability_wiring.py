"""Observability wired into the services: settings, the per-process server and readiness,
the router's weights over the in-memory Kafka double, the policy engine's output metrics,
consumer lag, and JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from graylane.kafka.reading import consumer_lag
from graylane.logs import LogFormat, bind, configure_logging
from graylane.metrics.controlside import PolicyMetrics
from graylane.metrics.process import (
    CONTROL_CAUGHT_UP,
    GROUP_JOINED,
    BuildLabels,
    MetricsAddress,
    ServiceObservability,
)
from graylane.policy_engine.logic.qos import QosState
from graylane.policy_engine.messages import Command, CommandKind, CommandRejected, QosPolicySet
from graylane.policy_engine.service import PolicyObserver
from graylane.rollouts.qos_policy import QosPolicy
from graylane.routing.table import table_for_weights
from graylane.settings import Settings, SettingsError
from tests.support.memory_kafka import MemoryBroker, MemoryFactory
from tests.unit.test_router_memory import (
    MODEL,
    broker,
    eventually,
    factory,
    publish_table,
    request,
    running_router,
    submit,
)

__all__ = ["broker", "factory"]  # fixtures used here


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as res:
            return int(res.status), res.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_settings_read_metrics_address_log_format_and_build() -> None:
    s = Settings.from_env(
        {
            "GRAYLANE_METRICS_HOST": "0.0.0.0",
            "GRAYLANE_METRICS_PORT": "9100",
            "GRAYLANE_LOG_FORMAT": "TEXT",
            "GRAYLANE_GIT_SHA": "abc123",
            "GRAYLANE_BUILD_TIME": "2026-12-01T10:00:00Z",
            "GRAYLANE_IMAGE_VERSION": "1.2.3",
        }
    )
    assert s.metrics_address() == MetricsAddress(host="0.0.0.0", port=9100)
    assert s.metrics_address(0) == MetricsAddress(host="0.0.0.0", port=0)  # a CLI override
    assert s.logs() is LogFormat.TEXT
    assert s.build_labels() == BuildLabels(
        version="1.2.3", git_sha="abc123", build_time="2026-12-01T10:00:00Z"
    )
    local = Settings.from_env({})
    assert local.metrics_address() == MetricsAddress(host="127.0.0.1", port=0)  # on by default
    assert Settings(metrics_port=-1).metrics_address() is None
    with pytest.raises(SettingsError):
        Settings(metrics_port=70000)
    with pytest.raises(SettingsError):
        Settings(log_format="xml")


def test_service_server_is_ready_only_when_every_condition_holds() -> None:
    obs = ServiceObservability("router")
    port = obs.start(
        MetricsAddress(port=0),
        BuildLabels(version="9.9.9", git_sha="deadbeef", build_time="2026-12-01T10:00:00Z"),
    )
    try:
        assert port > 0 and obs.port == port
        assert _get(port, "/healthz")[0] == 200
        code, body = _get(port, "/readyz")
        assert code == 503 and GROUP_JOINED in body and CONTROL_CAUGHT_UP in body
        obs.mark(CONTROL_CAUGHT_UP)
        obs.note_assignment({TopicPartition("t", 0)})
        assert _get(port, "/readyz")[0] == 200
        obs.note_assignment(set())  # lost its partitions in a rebalance
        assert _get(port, "/readyz")[0] == 503
        text = _get(port, "/metrics")[1]
        assert (
            'graylane_build_info{build_time="2026-12-01T10:00:00Z",git_sha="deadbeef",'
            'service="router",version="9.9.9"} 1.0' in text
        )
    finally:
        obs.close()
    assert obs.port == 0


def test_metrics_off_still_registers_build_info() -> None:
    obs = ServiceObservability("worker")
    assert obs.start(None, BuildLabels()) == 0
    assert (
        obs.registry.get_sample_value(
            "graylane_build_info",
            {
                "service": "worker",
                "version": "unknown",
                "git_sha": "unknown",
                "build_time": "unknown",
            },
        )
        == 1.0
    )


async def test_router_serves_its_weights_and_becomes_ready(
    broker: MemoryBroker, factory: MemoryFactory
) -> None:
    async with running_router(factory) as router:
        port = router.observability.port
        assert port > 0  # on by default, on a free port
        reg = router.registry
        weight = lambda v: reg.get_sample_value(  # noqa: E731
            "graylane_router_weight_ratio", {"model": MODEL, "version": v}
        )
        assert weight("v1") == 1.0  # no table yet: all to the stable version
        await submit(factory, request("r1", "user-1"))
        await eventually(lambda: _get(port, "/readyz")[0] == 200)
        publish_table(
            factory,
            table_for_weights(model=MODEL, stable_version="v1", weights=[("v2", 30.0)], epoch=1),
        )
        await eventually(lambda: weight("v2") == pytest.approx(0.3))
        assert weight("v1") == pytest.approx(0.7)
        assert reg.get_sample_value("graylane_router_table_epoch", {"model": MODEL}) == 1
        publish_table(factory, table_for_weights(model=MODEL, stable_version="v1", epoch=2))
        await eventually(lambda: weight("v2") == 0.0)  # left out of the new table
        assert weight("v1") == 1.0
        assert (
            'graylane_router_weight_ratio{model="gpt",version="v2"} 0.0'
            in _get(port, "/metrics")[1]
        )
    assert _get_refused(port)


def _get_refused(port: int) -> bool:
    try:
        _get(port, "/healthz")
    except (urllib.error.URLError, OSError):
        return True
    return False


def test_policy_observer_exports_qos_state_and_rejections() -> None:
    reg = CollectorRegistry()
    observer = PolicyObserver(PolicyMetrics.create(reg))
    policy = QosPolicy(
        model="m", version="1.0.0", slo_p99_ms=250.0, ladder=("fp32", "fp16", "int8")
    )
    at_floor = QosState(model="m", version="1.0.0", active_variant="int8", breach_since_ms=5)
    observer.observe(
        [
            QosPolicySet(policy=policy, before=None, after=at_floor, at_ms=1),
            CommandRejected(
                command=Command(kind=CommandKind.MANUAL, model="m"), reason="no", at_ms=2
            ),
        ]
    )
    mv = {"model": "m", "version": "1.0.0"}
    assert reg.get_sample_value("graylane_qos_slo_p99_seconds", mv) == 0.25
    assert reg.get_sample_value("graylane_qos_variant_index", mv) == 2
    assert reg.get_sample_value("graylane_qos_at_floor", mv) == 1
    assert reg.get_sample_value("graylane_qos_breaching", mv) == 1
    assert (
        reg.get_sample_value(
            "graylane_policy_decisions_total",
            {"model": "m", "kind": "rejected", "rule": "command_rejected"},
        )
        == 1
    )


class _Consumer:
    def __init__(self, high: dict[TopicPartition, int | None], pos: dict[TopicPartition, int]):
        self.high, self.pos = high, pos

    def assignment(self) -> set[TopicPartition]:
        return set(self.high)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self.high[partition]

    async def position(self, partition: TopicPartition) -> int:
        return self.pos[partition]


async def test_consumer_lag_sums_partitions_per_topic() -> None:
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    lag = await consumer_lag(_Consumer({a0: 10, a1: 7, b0: None}, {a0: 4, a1: 7, b0: 0}))
    assert lag == {"a": 6, "b": 0}


def test_json_log_lines_carry_service_build_and_context() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(
        "worker",
        LogFormat.JSON,
        git_sha="abc",
        build_time="2026-12-01T10:00:00Z",
        image_version="1.0.0",
        stream=out,
        context={"model": "gpt"},
    )
    try:
        bind(version="1.1.0")
        logging.getLogger("graylane.test").info(
            "served", extra={"variant": "fp16", "request_id": "r-1", "rollout_id": "ro-1"}
        )
        logging.getLogger("graylane.test").warning("plain")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["message"] == "served" and first["level"] == "INFO"
    assert first["service"] == "worker" and first["logger"] == "graylane.test"
    assert (first["git_sha"], first["image_version"]) == ("abc", "1.0.0")
    assert first["build_time"] == "2026-12-01T10:00:00Z"
    assert (first["model"], first["version"], first["variant"]) == ("gpt", "1.1.0", "fp16")
    assert (first["request_id"], first["rollout_id"]) == ("r-1", "ro-1")
    assert first["time"][:2] == "20"  # ISO 8601
    assert lines[1]["level"] == "WARNING" and "variant" not in lines[1]
    with pytest.raises(ValueError):
        bind(colour="red")


def test_text_log_lines_are_for_humans() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("router", LogFormat.TEXT, stream=out)
    try:
        logging.getLogger("graylane.test").info("hello")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    line = out.getvalue().strip()
    assert line.endswith("INFO router graylane.test: hello")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_policy_observer_exports_generative_qos_objectives() -> None:
    reg = CollectorRegistry()
    observer = PolicyObserver(PolicyMetrics.create(reg))
    policy = QosPolicy(
        model="chat",
        version="v1",
        slo_p99_ms=0.0,
        slo_ttft_p99_ms=500.0,
        slo_tpot_p99_ms=50.0,
        ladder=("fp32", "int8-dynamic"),
    )
    state = QosState(model="chat", version="v1", active_variant="fp32")
    observer.observe([QosPolicySet(policy=policy, before=None, after=state, at_ms=1)])
    mv = {"model": "chat", "version": "v1"}
    assert reg.get_sample_value("graylane_qos_slo_ttft_p99_seconds", mv) == 0.5
    assert reg.get_sample_value("graylane_qos_slo_tpot_p99_seconds", mv) == 0.05
    assert reg.get_sample_value("graylane_qos_slo_p99_seconds", mv) == 0.0
