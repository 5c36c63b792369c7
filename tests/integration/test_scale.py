"""Scale-out on the real broker (issue 12, item 3).

- A ScaleRequest on ``<p>.control.scale`` makes the local supervisor start a
  second ``graylane worker`` process for the version (it becomes ready), and
  a scale-in request stops it again; with a warm standby the request activates
  the warmed process instead (it joins the group and becomes ready only then).
- The policy engine, fed telemetry of a version at its quality floor that
  still breaches its SLO, publishes a ScaleRequest (and audits it), and a
  supervisor following the topic brings that version to two workers.

Slow-ish (worker processes load ONNX Runtime; the policy engine is a process).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane import serde
from graylane.app.cli.demo import Service
from graylane.app.cli.scaler import ScaleSupervisor, WorkerTemplate
from graylane.clock import now_ms
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.settings import Settings
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2, telemetry_pb2
from tests.support.policy import policy_engine, wait_ready
from tests.support.records import produce, qos_command, read_audits, send_command
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL, VERSION = "gpt", "v1"


async def ask(factory: KafkaFactory, desired: int, epoch: int) -> None:
    request = control_pb2.ScaleRequest(
        model=MODEL,
        version=VERSION,
        desired_replicas=desired,
        epoch=epoch,
        decided_at_unix_ms=now_ms(),
        reason=control_pb2.SCALE_REASON_FLOOR_BREACH,
        detail="test",
    )
    key = factory.layout.scale_key(MODEL, VERSION)
    await produce(factory, factory.layout.scale(), serde.encode(request), key=key)


def ready(service: Service) -> bool:
    if service.process.poll() is not None:
        raise RuntimeError(f"{service.name} exited: {service.log.read_text()[-2000:]}")
    try:
        url = f"http://127.0.0.1:{service.metrics_port}/readyz"
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.asynccontextmanager
async def supervising(sup: ScaleSupervisor) -> AsyncIterator[None]:
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(sup.run(stop, started))
    try:
        await asyncio.wait_for(started.wait(), 60)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def test_the_supervisor_starts_a_second_worker_process_and_stops_it_again(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    onnx = write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1)
    template = WorkerTemplate(
        model=MODEL, version=VERSION, args=("--variant", f"fp32={onnx}", "--threads", "1")
    )
    sup = ScaleSupervisor(factory, [template], max_workers=3, log_dir=tmp_path / "logs")
    async with supervising(sup):
        assert sup.partitions[(MODEL, VERSION)] == settings.partitions == 2
        (first,) = sup.running(MODEL, VERSION)
        await ask(factory, 2, epoch=1)
        await wait_until(lambda: len(sup.running(MODEL, VERSION)) == 2, timeout=30)
        second = sup.running(MODEL, VERSION)[1]
        await wait_until(lambda: ready(second), timeout=120, poll_s=0.5, what="worker 2 ready")
        assert "--version" in second.process.args and VERSION in second.process.args  # type: ignore[operator]

        await ask(factory, 3, epoch=2)  # 3 > the topic's 2 partitions: stays at 2
        await wait_until(lambda: sup.desired.get((MODEL, VERSION)) == 3, timeout=30)
        sup.reconcile()
        assert len(sup.running(MODEL, VERSION)) == 2

        await ask(factory, 1, epoch=3)
        await wait_until(lambda: second.process.poll() is not None, timeout=60, what="scale-in")
        assert sup.running(MODEL, VERSION) == [first] and first.process.poll() is None
    assert first.process.poll() is not None  # the supervisor stops its workers on exit


async def test_a_warm_standby_joins_its_group_only_when_a_scale_out_signals_it(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.shared_specs() + layout.model_specs(MODEL, [VERSION]))
    onnx = write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1)
    template = WorkerTemplate(
        model=MODEL, version=VERSION, args=("--variant", f"fp32={onnx}", "--threads", "1")
    )
    sup = ScaleSupervisor(
        factory,
        [template],
        max_workers=2,
        warm_standby=1,
        refill_delay_s=1.0,
        log_dir=tmp_path / "logs",
    )
    async with supervising(sup):
        (first,) = sup.running(MODEL, VERSION)
        await wait_until(lambda: len(sup.standing_by(MODEL, VERSION)) == 1, timeout=30)
        (spare,) = sup.standing_by(MODEL, VERSION)
        assert "--standby" in spare.process.args  # type: ignore[operator]
        await wait_until(lambda: ready(first), timeout=120, poll_s=0.5, what="worker 1 ready")
        await wait_until(
            lambda: "warm standby" in spare.log.read_text(), timeout=120, what="standby warmed"
        )
        assert not ready(spare)  # warmed, alive, but out of the group
        await ask(factory, 2, epoch=1)
        await wait_until(lambda: ready(spare), timeout=60, poll_s=0.2, what="standby serving")
        assert sup.running(MODEL, VERSION) == [first, spare]
        assert "activated: joining its group" in spare.log.read_text()
        # no cold start for the scale-out: the only processes are the first two
        assert sup.standing_by(MODEL, VERSION) == []


class _FakeProcess:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.returncode = -sig

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


class _FakeLaunch:
    def __call__(self, template: WorkerTemplate, index: int) -> Service:
        return Service(f"fake-{index}", _FakeProcess(), Path("/dev/null"))  # type: ignore[arg-type]


def at_floor_breaching(at: int) -> bytes:
    h = LatencyHistogram()
    for _ in range(12):
        h.record(80.0)
    pb = telemetry_pb2.BatchTelemetry(
        model=MODEL, version=VERSION, variant="int8", worker_id="w-only", batch_size=12,
        request_count=12, latency=histogram_to_pb(h), started_at_unix_ms=at - 80,
        completed_at_unix_ms=at, lag=5,
    )  # fmt: skip
    return serde.encode(pb)


async def test_the_policy_engine_asks_for_a_replica_at_the_floor_while_breaching(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    layout = factory.layout
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    await ensure_topics(factory, layout.model_specs(MODEL, [VERSION]))
    policy = rollout_pb2.QosPolicy(
        model=MODEL, version=VERSION, slo_p99_ms=20.0, ladder=["int8"], sustain_s=1.0,
        min_dwell_s=1.0, enabled=True,
    )  # fmt: skip
    command = qos_command(policy)
    log = tmp_path / "policy.log"
    # The whole chain: a supervisor follows what the engine writes (processes faked here;
    # the test above starts real ones).
    template = WorkerTemplate(model=MODEL, version=VERSION)
    sup = ScaleSupervisor(factory, [template], max_workers=3, launcher=_FakeLaunch())
    with policy_engine(settings, log, MODEL, "--max-replicas", "3"):
        await wait_ready(log)
        await send_command(factory, command)
        producer = factory.producer(client_suffix="test-telemetry")
        await producer.start()
        try:

            async def asked() -> bool:
                for _ in range(4):
                    value = at_floor_breaching(now_ms())
                    await producer.send_and_wait(layout.telemetry(), value, key=MODEL.encode())
                    await asyncio.sleep(0.25)
                latest = await read_latest_per_key(factory, layout.scale(), timeout_s=10)
                return layout.scale_key(MODEL, VERSION).encode() in latest

            async with supervising(sup):
                await wait_until(asked, timeout=90, poll_s=0.0, what="a scale request")
                await wait_until(lambda: len(sup.running(MODEL, VERSION)) == 2, timeout=30)
        finally:
            await producer.stop()
    latest = await read_latest_per_key(factory, layout.scale())
    req = serde.decode(control_pb2.ScaleRequest, latest[b"gpt/v1"])  # type: ignore[arg-type]
    assert (req.model, req.version, req.desired_replicas, req.epoch) == (MODEL, VERSION, 2, 1)
    assert req.reason == control_pb2.SCALE_REASON_FLOOR_BREACH and req.current_replicas == 1
    scaled = [a for a in await read_audits(factory) if a.kind == audit_pb2.DECISION_SCALE_CHANGE]
    assert len(scaled) == 1 and scaled[0].scale == req and scaled[0].rule == "scale_floor_breach"
