"""The quality cost of precision rungs, end to end: ``graylane eval --record`` scores real
llama.cpp rungs and stores them through the control plane, ``model show`` and ``qos
status`` print them, and the policy engine, told the costs by the control plane, refuses
to step onto a rung that costs more than the QoS policy's cap."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc import aio

from graylane import serde
from graylane.app.cli.main import main
from graylane.artifacts.naming import ArtifactName, Backend, Precision, parse_semver
from graylane.clock import now_ms
from graylane.evaluation.sets import load_set
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_to_pb
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.registry.records import ArtifactRecord, EndpointSummary
from graylane.registry.repository import open_registry
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.settings import Settings
from graylane.v1 import (
    audit_pb2,
    controlplane_pb2,
    controlplane_pb2_grpc,
    rollout_pb2,
    telemetry_pb2,
)
from tests.support.llamacpp import StartLlamaServer
from tests.support.policy import policy_engine, wait_ready
from tests.support.records import read_audits
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

OPS = (("authorization", "Bearer ops-token-0123456"),)
SET = (
    Path(__file__).resolve().parents[2] / "graylane" / "evaluation" / "sets" / "smollm2-basic.jsonl"
)


@contextlib.asynccontextmanager
async def control_plane(factory: KafkaFactory) -> AsyncIterator[ControlPlaneServer]:
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        tokens=TokenTable(parse_tokens("ops-token-0123456:operator:alice")),
        outbox_interval_s=0.5,
        check_candidates=False,
        http_port=0,
    )
    server = ControlPlaneServer(config, factory)
    await server.start()
    try:
        await asyncio.wait_for(server.sink.ready.wait(), 30)
        yield server
    finally:
        await server.stop(0)


def _endpoint_artifact(model: str, precision: Precision, url: str, rank: int) -> ArtifactRecord:
    name = ArtifactName(model, Backend.LLAMACPP, "0.3.36", precision, "gguf", parse_semver("1.0.0"))
    return ArtifactRecord(
        name=name,
        path=f"{model}/{precision.value}",
        manifest_sha256="e" * 64,
        servable=True,
        endpoint=EndpointSummary(url, None, rank),
    )


@pytest.mark.slow
async def test_eval_record_stores_each_rungs_score_and_model_show_prints_it(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    smollm2_q4_0_gguf: Path,
    start_llama_server: StartLlamaServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = "rq-smollm2"
    monkeypatch.setenv("COLUMNS", "400")  # one table row per variant
    upper = start_llama_server(smollm2_gguf, threads=1, slots=4)
    lower = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    registry = open_registry(settings.db_url)
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "a" * 64)
    registry.add_artifact(_endpoint_artifact(model, Precision.Q4_1, upper.url, 0))
    registry.add_artifact(_endpoint_artifact(model, Precision.Q4_0, lower.url, 1))
    async with control_plane(factory) as server:
        base = ["--addr", f"127.0.0.1:{server.port}", "--token", "ops-token-0123456"]
        qos = [
            *("qos", "set", *base, "--model", model, "--version", "1.0.0"),
            *("--slo-ttft-ms", "500", "--ladder", "q4_1,q4_0", "--max-quality-drop", "0.05"),
        ]
        assert await asyncio.to_thread(main, qos) == 0
        capsys.readouterr()
        limit = 8
        record = [
            *("eval", str(SET), *base, "--record", f"{model}=1.0.0"),
            *("--endpoint", f"q4_1={upper.url}", "--endpoint", f"q4_0={lower.url}"),
            *("--limit", str(limit), "--plot", str(settings.artifact_dir / "eval.png")),
        ]
        assert await asyncio.to_thread(main, record) == 0
        out = capsys.readouterr().out
        line = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
        assert await asyncio.to_thread(main, ["model", "show", *base, model]) == 0
        shown = capsys.readouterr().out
        status = ["qos", "status", *base, "--model", model, "--version", "1.0.0"]
        assert await asyncio.to_thread(main, status) == 0
        qos_out = capsys.readouterr().out
        channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            view = await controlplane_pb2_grpc.QosStub(channel).GetPolicy(
                controlplane_pb2.GetQosPolicyRequest(model=model, version="1.0.0"), metadata=OPS
            )
        finally:
            await channel.close()
    stored = registry.rung_quality(model, "1.0.0")
    registry.engine.dispose()
    scores = {name: line["targets"][name]["score"] for name in ("q4_1", "q4_0")}
    print(f"rung scores on {limit} items: {scores}")  # the figures, for the record
    assert set(stored) == {Precision.Q4_1, Precision.Q4_0}
    q41, q40 = stored[Precision.Q4_1], stored[Precision.Q4_0]
    assert q41.score == pytest.approx(scores["q4_1"], abs=1e-4) and q41.quality_drop == 0.0
    assert q40.score == pytest.approx(scores["q4_0"], abs=1e-4)
    assert q40.reference_precision is Precision.Q4_1
    assert q40.quality_drop == pytest.approx(scores["q4_1"] - scores["q4_0"], abs=1e-4)
    assert q40.items == limit and q40.set_name == f"{load_set(SET).name}[:{limit}]"
    assert q40.ci_low <= q40.score <= q40.ci_high
    assert f"recorded {model} 1.0.0 q4_0: {q40.score:.3f}" in out
    assert "sent again with the costs" in out
    q40_row = next(x for x in shown.splitlines() if "q4_0" in x and "llamacpp" in x)
    assert f"{q40.score:.3f}" in q40_row and f"cost {q40.quality_drop:+.3f} vs q4_1" in q40_row
    # the policy re-sent with the measured costs, shown beside each rung
    assert dict(view.policy.rung_quality_drop) == pytest.approx(
        {"q4_1": 0.0, "q4_0": q40.quality_drop}
    )
    assert f"{q40.quality_drop:+.3f}" in qos_out and "quality cost" in qos_out


def _rung(precision: str, score: float, reference: float) -> controlplane_pb2.RungQualityInfo:
    return controlplane_pb2.RungQualityInfo(
        precision=precision,
        set_name="smollm2-basic",
        set_sha256="ab" * 32,
        items=40,
        score=score,
        ci_low=score - 0.1,
        ci_high=score + 0.1,
        reference_precision="f16",
        reference_score=reference,
    )


def slow_telemetry(model: str, version: str, variant: str) -> bytes:
    h = LatencyHistogram()
    for _ in range(12):
        h.record(400.0)
    at = now_ms()
    pb = telemetry_pb2.BatchTelemetry(
        model=model, version=version, variant=variant, worker_id="w-1", batch_size=12,
        request_count=12, latency=histogram_to_pb(h), started_at_unix_ms=at - 400,
        completed_at_unix_ms=at,
    )  # fmt: skip
    return serde.encode(pb)


@pytest.mark.slow
async def test_a_capped_policy_steps_onto_an_allowed_rung_and_not_onto_a_costly_one(
    settings: Settings, factory: KafkaFactory, tmp_path: Path
) -> None:
    """Costs recorded in the registry reach the policy engine with the policy; under a
    sustained breach it steps f16 -> q4_1 (drop 0.029) and holds there: q4_0's 0.144 is
    over the 0.05 cap. (The figures are SmolLM2-135M's on the project's set.)"""
    model, version = "rq-cap", "1.0.0"
    await prepare_topics(settings, PolicyConfig(models=(model,)))
    registry = open_registry(settings.db_url)
    registry.register_model(model)
    registry.register_version(model, version, "a" * 64)
    registry.engine.dispose()
    figures = {"f16": 0.619, "q4_1": 0.590, "q4_0": 0.475}
    log = tmp_path / "policy.log"
    with policy_engine(settings, log, model):
        await wait_ready(log)
        async with control_plane(factory) as server:
            channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
            try:
                await controlplane_pb2_grpc.ModelRegistryStub(channel).RecordRungQuality(
                    controlplane_pb2.RecordRungQualityRequest(
                        model=model,
                        version=version,
                        rungs=[_rung(r, score, figures["f16"]) for r, score in figures.items()],
                    ),
                    metadata=OPS,
                )
                policy = rollout_pb2.QosPolicy(
                    model=model, version=version, slo_p99_ms=100.0,
                    ladder=["f16", "q4_1", "q4_0"], sustain_s=1.0, min_dwell_s=1.0,
                    enabled=True, max_quality_drop=0.05,
                )  # fmt: skip
                view = await controlplane_pb2_grpc.QosStub(channel).SetPolicy(policy, metadata=OPS)
            finally:
                await channel.close()
        assert dict(view.policy.rung_quality_drop) == pytest.approx(
            {"f16": 0.0, "q4_1": 0.029, "q4_0": 0.144}
        )
        serving = ["f16"]
        producer = factory.producer(client_suffix="test-telemetry")
        await producer.start()
        try:

            async def feed(rule: str) -> bool:
                for _ in range(4):
                    value = slow_telemetry(model, version, serving[0])
                    await producer.send_and_wait(
                        factory.layout.telemetry(), value, key=model.encode()
                    )
                    await asyncio.sleep(0.25)
                audits = await read_audits(factory, model=model)
                changes = [a for a in audits if a.kind == audit_pb2.DECISION_PRECISION_CHANGE]
                if changes:
                    serving[0] = changes[-1].qos_after.active_variant  # the worker obeys
                return any(a.rule == rule for a in audits)

            await wait_until(lambda: feed("p99_breach"), timeout=90, poll_s=0.0, what="a step")
            await wait_until(lambda: feed("quality_cap"), timeout=90, poll_s=0.0, what="a cap")
        finally:
            await producer.stop()
    audits = await read_audits(factory, model=model)
    changes = [a for a in audits if a.kind == audit_pb2.DECISION_PRECISION_CHANGE]
    assert [c.qos_after.active_variant for c in changes] == ["q4_1"]
    (held, *_) = [a for a in audits if a.rule == "quality_cap"]
    assert held.qos_after.active_variant == "q4_1"
    assert "q4_0 costs 0.144 > cap 0.050" in held.reason
    assert held.qos_policy.max_quality_drop == pytest.approx(0.05)
