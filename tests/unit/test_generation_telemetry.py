"""Generation telemetry: per-request TTFT / TPOT / inter-token gaps from the real decode
loop (ONNX Runtime), their batch telemetry, the worker's Prometheus metrics and the
policy engine's window aggregate per version."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from graylane.clock import now_ms
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.backend import BatchReport, DecodeLoad, ResultContext
from graylane.engine_worker.compute import WorkerEngines
from graylane.engine_worker.faults import FaultInjection, FaultyEngine
from graylane.engine_worker.generation import ContinuousDecoder, DecoderLimits
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.logic.streaming import StreamPolicy, gap_p99
from graylane.engine_worker.requests import Job, TaskKind, WorkItem
from graylane.engine_worker.wire import GenerationTally, generation_report
from graylane.errors import Rejection
from graylane.histogram import LatencyHistogram
from graylane.histogram_pb import histogram_from_pb
from graylane.metrics.catalogue import catalogue
from graylane.metrics.dataplane import WorkerMetrics
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.logic.window import (
    GenerationSample,
    SlidingWindow,
    TelemetrySample,
    invalid_sample,
)
from graylane.policy_engine.wire import telemetry_from_pb, window_stats_from_pb, window_stats_to_pb
from graylane.v1 import inference_pb2, telemetry_pb2
from tests.support.outbox import CapturedOutbox

CTX = ResultContext(model="gpt", version="v1", variant="fp32", worker_id="w")
STEP_MS = 4.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    path = write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=4, kv_cache=True)
    return OnnxRuntimeEngine.load(path, "fp32", intra_op_threads=1)


def _job(rid: str, prompt: list[int], new: int) -> Job:
    request = inference_pb2.InferenceRequest(
        request_id=rid,
        model="gpt",
        task=inference_pb2.GENERATE,
        created_at_unix_ms=now_ms(),
        generation=inference_pb2.GenerationParams(max_new_tokens=new),
    )
    record = ConsumerRecord("t", 0, 0, 0, 0, None, b"", None, 0, 0, ())
    work = WorkItem(
        index=0,
        task=TaskKind.GENERATE,
        seq_len=len(prompt),
        prompt_tokens=tuple(prompt),
        max_new_tokens=new,
    )
    return Job(record, request, work)


async def _decode(engine: OnnxRuntimeEngine, jobs: list[Job]) -> list[BatchReport]:
    """Run ``jobs`` through a continuous decoder whose every engine call takes at least
    STEP_MS longer (so millisecond stamps resolve the gaps)."""
    slow = FaultyEngine(engine, FaultInjection(extra_latency_ms=STEP_MS), random.Random(0))
    engines = WorkerEngines(
        {"fp32": slow},
        FaultInjection(),
        policy=BucketPolicy(),
        max_seq_len=256,
        failure_limit=5,
        reload=None,
        give_up=lambda exc: None,
        active=lambda: "fp32",
    )
    outbox = CapturedOutbox()
    decoder = ContinuousDecoder(
        engines,
        CTX,
        slow,
        DecoderLimits(max_sequences=4, max_seq_len=256, max_kv_tokens=200),
        stream=StreamPolicy(),
        outbox=outbox,
    )
    await asyncio.wait_for(asyncio.gather(*(decoder.submit(j) for j in jobs)), 60)
    await decoder.close()
    return outbox.reports


def test_gap_p99_is_the_nearest_rank_of_a_requests_gaps() -> None:
    assert gap_p99([]) == 0.0
    assert gap_p99([7.0]) == 7.0
    assert gap_p99([10.0] * 99 + [100.0]) == 10.0  # rank 99 of 100
    assert gap_p99([10.0] * 98 + [100.0, 100.0]) == 100.0
    assert gap_p99([3.0, 1.0, 2.0]) == 3.0


async def test_decoded_generations_carry_ttft_tpot_prefill_gaps_and_load(
    engine: OnnxRuntimeEngine,
) -> None:
    jobs = [_job("a", [5, 6, 7], 12), _job("b", [8, 9], 6), _job("c", [4], 1)]
    reports = await _decode(engine, jobs)
    by_id = {j.request.request_id: j for report in reports for j in report.answers}
    assert sorted(by_id) == ["a", "b", "c"]
    for rid, new in (("a", 12), ("b", 6)):
        result = by_id[rid].result
        assert result is not None and len(result.generated_token_ids) == new
        when = result.timing
        # every engine call takes >= STEP_MS: each gap, and so TPOT, is at least that
        # (less the rounding of millisecond stamps)
        assert when.tpot_ms >= STEP_MS - 1.0 / (new - 1)
        assert when.inter_token_p99_ms >= when.tpot_ms * 0.5
        assert when.prefill_ms >= STEP_MS
        assert when.ttft_ms >= when.prefill_ms
        assert when.total_ms >= when.ttft_ms + when.tpot_ms * (new - 1) - 1.0
    single = by_id["c"].result
    assert single is not None and single.timing.ttft_ms > 0 and single.timing.tpot_ms == 0.0
    gens = [r.telemetry.generation for r in reports]
    for g in gens:  # the decode loop's load as they ended
        assert 0.0 <= g.kv_cache_occupancy <= 1.0
        assert g.waiting_sequences >= 0
    assert all(r.telemetry.HasField("generation") for r in reports)
    assert sum(g.generations for g in gens) == 3
    assert sum(g.generated_tokens for g in gens) == 12 + 6 + 1
    assert sum(g.prompt_tokens for g in gens) == 3 + 2 + 1
    ttft = LatencyHistogram.merge_all(histogram_from_pb(g.ttft) for g in gens)
    tpot = LatencyHistogram.merge_all(histogram_from_pb(g.tpot) for g in gens)
    lengths = LatencyHistogram.merge_all(histogram_from_pb(g.output_tokens) for g in gens)
    assert (ttft.count, tpot.count, lengths.count) == (3, 2, 3)  # one token: no TPOT
    assert lengths.sum_ms == 19.0 and lengths.max_ms == 12.0
    reasons: dict[int, int] = {}
    for g in gens:
        for c in g.finish_reasons:
            reasons[c.reason] = reasons.get(c.reason, 0) + c.count
    assert reasons == {inference_pb2.LENGTH: 3}


def test_generation_report_counts_sheds_and_errors_apart_from_generations() -> None:
    ok = _job("ok", [1, 2], 3)
    ok.result = inference_pb2.InferenceResult(
        request_id="ok",
        task=inference_pb2.GENERATE,
        finish_reason=inference_pb2.EOS,
        timing=inference_pb2.Timing(ttft_ms=40.0, tpot_ms=8.0, inter_token_p99_ms=11.0),
        usage=inference_pb2.Usage(prompt_tokens=2, completion_tokens=3),
    )
    shed = _job("shed", [1], 3)
    from graylane.errors import ErrorCode

    shed.rejection = Rejection(ErrorCode.SHED, "late")
    load = DecodeLoad(kv_cache_occupancy=0.75, waiting=5, running=3)
    report = generation_report([ok, shed], CTX, started_ms=now_ms(), device_load=0.0, load=load)
    t = report.telemetry
    assert (t.request_count, t.shed_count, t.error_count) == (1, 1, 0)
    g = t.generation
    assert g.generations == 1 and g.generated_tokens == 3 and g.prompt_tokens == 2
    assert (g.kv_cache_occupancy, g.waiting_sequences, g.running_sequences) == (0.75, 5, 3)
    assert [(c.reason, c.count) for c in g.finish_reasons] == [(inference_pb2.EOS, 1)]
    assert histogram_from_pb(g.ttft).max_ms == 40.0
    assert histogram_from_pb(g.inter_token_p99).max_ms == 11.0
    assert histogram_from_pb(g.prefill).count == 0  # unknown is not recorded as 0


def test_worker_metrics_export_ttft_tpot_tokens_and_finish_reasons() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics.create(registry)
    labels = ("gpt", "v1", "fp32")
    for reason, tpot in ((inference_pb2.EOS, 20.0), (inference_pb2.LENGTH, 0.0)):
        metrics.generation(
            labels,
            inference_pb2.InferenceResult(
                finish_reason=reason,
                timing=inference_pb2.Timing(ttft_ms=250.0, tpot_ms=tpot),
                usage=inference_pb2.Usage(prompt_tokens=10, completion_tokens=4),
            ),
        )
    where = {"model": "gpt", "version": "v1", "variant": "fp32"}

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**where, **extra})

    assert value("graylane_time_to_first_token_seconds_count") == 2
    assert value("graylane_time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert value("graylane_time_per_output_token_seconds_count") == 1  # 0: not known
    assert value("graylane_prompt_tokens_total") == 20
    assert value("graylane_generated_tokens_total") == 8
    assert value("graylane_generation_finish_total", reason="eos") == 1
    assert value("graylane_generation_finish_total", reason="length") == 1
    names = catalogue()
    for family, kind in (
        ("graylane_time_to_first_token_seconds", "histogram"),
        ("graylane_time_per_output_token_seconds", "histogram"),
        ("graylane_prompt_tokens", "counter"),
        ("graylane_generated_tokens", "counter"),
        ("graylane_generation_finish", "counter"),
        ("graylane_worker_kv_cache_occupancy_ratio", "gauge"),
        ("graylane_worker_waiting_sequences", "gauge"),
    ):
        assert names[family] == kind


def _gen_sample(
    at_ms: int,
    worker: str,
    ttft: list[float],
    tpot: list[float],
    lengths: list[int],
    *,
    eos: int,
    kv: float,
    waiting: int,
) -> TelemetrySample:
    return TelemetrySample(
        model="gpt",
        version="v1",
        variant="fp32",
        worker_id=worker,
        completed_at_ms=at_ms,
        request_count=len(ttft),
        error_count=0,
        latency=LatencyHistogram.of([t + 100.0 for t in ttft]),
        generation=GenerationSample(
            generations=len(ttft),
            ttft=LatencyHistogram.of(ttft),
            tpot=LatencyHistogram.of(tpot),
            output_tokens=LatencyHistogram.of(float(n) for n in lengths),
            generated_tokens=sum(lengths),
            prompt_tokens=7 * len(ttft),
            ended_by_model=eos,
            kv_cache_occupancy=kv,
            waiting_sequences=waiting,
        ),
    )


def test_the_window_aggregates_generations_per_version() -> None:
    w = SlidingWindow(10_000, 2_000)
    w.add(_gen_sample(1_000, "w1", [50.0] * 10, [10.0] * 10, [20] * 10, eos=8, kv=0.2, waiting=1))
    w.add(_gen_sample(3_000, "w1", [60.0] * 10, [12.0] * 10, [40] * 10, eos=2, kv=0.6, waiting=4))
    w.add(_gen_sample(3_500, "w2", [500.0], [30.0], [100], eos=1, kv=0.8, waiting=2))
    plain = TelemetrySample(
        model="gpt",
        version="v2",
        variant="fp32",
        worker_id="w3",
        completed_at_ms=3_000,
        request_count=3,
        error_count=0,
        latency=LatencyHistogram.of([5.0, 5.0, 5.0]),
    )
    w.add(plain)
    stats = w.stats_by_version("gpt", "v1", 10_000)
    assert stats is not None and stats.generation is not None
    g = stats.generation
    assert g.generations == 21 and g.generated_tokens == 200 + 400 + 100
    assert g.mean_output_tokens == pytest.approx(700 / 21)
    assert g.eos_rate == pytest.approx(11 / 21)
    assert g.ttft_p99_ms == pytest.approx(500.0, rel=0.03)
    assert g.ttft_p50_ms == pytest.approx(60.0, rel=0.03)  # rank 11 of 21
    assert g.tpot_p99_ms == pytest.approx(30.0, rel=0.03)
    assert g.output_tokens.quantile(0.5) == pytest.approx(40, rel=0.03)
    # the latest report of each worker: w1's 0.6 / 4 and w2's 0.8 / 2
    assert g.kv_cache_occupancy == pytest.approx(0.7)
    assert g.waiting_sequences == 6
    no_gen = w.stats_by_version("gpt", "v2", 10_000)
    assert no_gen is not None and no_gen.generation is None


def test_bad_generation_telemetry_is_refused_with_a_reason() -> None:
    w = SlidingWindow(10_000, 2_000)
    over = _gen_sample(1_000, "w1", [1.0], [1.0], [1], eos=0, kv=1.5, waiting=0)
    assert "outside 0..1" in (invalid_sample(over, w.scheme) or "")
    odd = TelemetrySample(
        model="gpt",
        version="v1",
        variant="fp32",
        worker_id="w1",
        completed_at_ms=1_000,
        request_count=1,
        error_count=0,
        latency=LatencyHistogram.of([1.0]),
        generation=GenerationSample(
            generations=1, ttft=LatencyHistogram.of([1.0], min_ms=0.1, growth=1.1)
        ),
    )
    assert "ttft histogram scheme" in (invalid_sample(odd, w.scheme) or "")
    good = _gen_sample(1_000, "w1", [1.0], [1.0], [1], eos=1, kv=0.5, waiting=0)
    assert invalid_sample(good, w.scheme) is None


def test_generation_telemetry_survives_the_wire_and_the_audit_copy() -> None:
    tally = GenerationTally()
    for reason, tokens in (
        (inference_pb2.EOS, 5),
        (inference_pb2.STOP, 9),
        (inference_pb2.LENGTH, 32),
        (inference_pb2.EOS, 7),
    ):
        tally.add(
            inference_pb2.InferenceResult(
                finish_reason=reason,
                timing=inference_pb2.Timing(ttft_ms=30.0 + tokens, tpot_ms=9.0, prefill_ms=20.0),
                usage=inference_pb2.Usage(prompt_tokens=3, completion_tokens=tokens),
            )
        )
    pb = telemetry_pb2.BatchTelemetry(
        model="gpt",
        version="v1",
        variant="fp32",
        worker_id="w1",
        request_count=4,
        completed_at_unix_ms=1_500,
        generation=tally.to_pb(DecodeLoad(kv_cache_occupancy=0.4, waiting=2)),
    )
    sample = telemetry_from_pb(telemetry_pb2.BatchTelemetry.FromString(pb.SerializeToString()))
    g = sample.generation
    assert g is not None
    assert (g.generations, g.ended_by_model, g.generated_tokens) == (4, 3, 53)
    assert g.prefill.count == 4 and g.kv_cache_occupancy == 0.4 and g.waiting_sequences == 2
    w = SlidingWindow(10_000, 2_000)
    assert w.add(sample)
    stats = w.stats_by_version("gpt", "v1", 10_000)
    assert stats is not None and stats.generation is not None
    back = window_stats_from_pb(window_stats_to_pb(stats))
    assert back.generation is not None
    assert back.generation.ttft == stats.generation.ttft
    assert back.generation.output_tokens == stats.generation.output_tokens
    assert back.generation.eos_rate == stats.generation.eos_rate == 0.75
    assert back == replace(stats, workers=0, lag=0)  # those two have no room on the wire
