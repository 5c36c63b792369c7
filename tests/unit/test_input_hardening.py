"""Issue 10, data-path input: shape caps before numpy, field caps, per-item isolation,
input errors kept out of the error gate, truncated dead letters, pins, telemetry ids."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord

from graylane import serde
from graylane.engine.errors import BadShape
from graylane.engine_worker import compute
from graylane.engine_worker.backend import BatchClock, ResultContext
from graylane.engine_worker.compute import BatchRun, ForwardOutcome, run_isolated
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.engine_worker.wire import build_batch
from graylane.errors import ErrorCode
from graylane.histogram import LatencyHistogram
from graylane.kafka.replies import DEAD_LETTER_KEEP_BYTES, ReplySink, field_problem
from graylane.policy_engine.logic.window import SlidingWindow, TelemetrySample
from graylane.routing.table import (
    RouteTable,
    RoutingRequest,
    UnknownPinnedVersion,
    route,
    route_without_table,
    table_for_weights,
    table_problem,
)
from graylane.topics import TopicLayout
from graylane.v1 import dlq_pb2, inference_pb2, telemetry_pb2, tensor_pb2
from tests.unit.test_worker_pipeline import job_of


def _tensor(shape: Sequence[int], data: bytes = b"") -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(name="x", dtype=tensor_pb2.UINT8, shape=list(shape), data=data)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ([1] * 9, "dimensions"),
        ([0, 4], "empty batch"),
        ([1, 0, 2**62], "limit"),
        ([2**40, 0], "limit"),
        ([1] * 40, "dimensions"),
    ],
)
def test_tensor_shapes_are_refused_before_numpy(shape: list[int], match: str) -> None:
    with pytest.raises(serde.TensorShapeError, match=match) as info:
        serde.from_tensor(_tensor(shape), max_elements=1024)
    assert info.value.code is ErrorCode.BAD_SHAPE


def test_element_cap_applies_even_when_bytes_match() -> None:
    with pytest.raises(serde.TensorShapeError, match="limit"):
        serde.from_tensor(_tensor([2, 600], b"\0" * 1200), max_elements=1024)
    ok = serde.from_tensor(_tensor([2, 3], b"\0" * 6), max_elements=1024)
    assert ok.shape == (2, 3)


def test_field_caps_refuse_without_echoing_the_value() -> None:
    huge = "k" * 1_000_000
    for req in (
        inference_pb2.InferenceRequest(request_id="r", model="m", routing_key=huge),
        inference_pb2.InferenceRequest(request_id="r", model=huge),
        inference_pb2.InferenceRequest(request_id="r", model="m", pinned_version=huge),
        inference_pb2.InferenceRequest(request_id="r", model="m", tags={huge: "v"}),
    ):
        problem = field_problem(req)
        assert problem is not None and len(problem) < 200
    assert field_problem(inference_pb2.InferenceRequest(request_id="r", top_k=-1)) is not None
    assert field_problem(inference_pb2.InferenceRequest(request_id="r", top_k=10**6)) is not None
    bad_gen = inference_pb2.InferenceRequest(request_id="r")
    bad_gen.generation.max_new_tokens = -5
    assert field_problem(bad_gen) is not None
    assert field_problem(inference_pb2.InferenceRequest(request_id="r", model="m", top_k=5)) is None


def _item(index: int) -> WorkItem:
    return WorkItem(index=index, task=TaskKind.FORWARD, seq_len=1)


def test_one_bad_item_never_fails_its_batch_mates(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []

    def fake_run(engine: object, items: Sequence[WorkItem], *a: object, **k: object) -> BatchRun:
        calls.append([i.index for i in items])
        if any(i.index == 1 for i in items):
            raise BadShape("item 1 has a bad shape")
        return BatchRun({i.index: ForwardOutcome({}) for i in items}, 1.0, 1)

    monkeypatch.setattr(compute, "run_batch", fake_run)
    run = run_isolated(object(), [_item(0), _item(1), _item(2)], BucketPolicy(), 16)  # type: ignore[arg-type]
    assert calls[0] == [0, 1, 2]
    assert sorted(run.outcomes) == [0, 2]
    assert list(run.input_errors) == [1] and run.input_errors[1].code is ErrorCode.BAD_SHAPE


def test_input_errors_are_not_engine_errors_in_telemetry() -> None:
    items = [_item(0), _item(1)]
    requests = {
        i: inference_pb2.InferenceRequest(request_id=f"r{i}", model="m", routed_at_unix_ms=900)
        for i in (0, 1)
    }
    run = BatchRun({0: ForwardOutcome({})}, 1.0, 2, {1: BadShape("bad")})
    batch_id = telemetry_pb2.BatchId(worker_id="w", partition=3, first_offset=42)
    report = build_batch(
        [job_of(requests[item.index], item) for item in items],
        run,
        None,
        ResultContext(model="m", version="v1", variant="fp32", worker_id="w"),
        BatchClock(dequeued_ms=1000, started_ms=1000, done_ms=1100),
        bucket_len=0,
        device_load=0.0,
        batch_id=batch_id,
    )
    t = report.telemetry
    assert (t.error_count, t.input_error_count, t.request_count) == (0, 1, 2)
    assert t.batch_id == batch_id
    bad = [a for a in report.answers if a.rejection is not None]
    assert [a.index for a in bad] == [1] and bad[0].rejection.code == inference_pb2.BAD_SHAPE  # type: ignore[union-attr]
    # latency is measured from the router's stamp (routed_at 900 -> done 1100)
    assert t.latency.max_ms == pytest.approx(200.0)


class _Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> object:
        self.sent.append((topic, value))
        return None


async def test_dead_letter_keeps_64k_prefix_sha256_and_length() -> None:
    producer = _Capture()
    sink = ReplySink(producer, TopicLayout(prefix="t"), "test")  # type: ignore[arg-type]
    value = bytes(range(256)) * 1024  # 256 KiB
    record = ConsumerRecord("t.ingress.m", 0, 7, 0, 0, b"k", value, None, 1, len(value), ())
    await sink.dead_letter(record, inference_pb2.DECODE_ERROR, "x" * 100_000)
    letter = serde.decode(dlq_pb2.DeadLetter, producer.sent[0][1])
    assert letter.original_value == value[:DEAD_LETTER_KEEP_BYTES]
    assert letter.original_length == len(value) and letter.original_truncated
    assert letter.original_sha256 == hashlib.sha256(value).digest()
    assert len(letter.reason) < 2000


def test_a_pin_of_a_version_that_does_not_exist_is_unknown_version() -> None:
    closed = table_for_weights(model="m", stable_version="v1", weights=[("v2", 10.0)])
    with pytest.raises(UnknownPinnedVersion):
        route(closed, RoutingRequest("r", "k", pinned_version="v9"))
    with pytest.raises(UnknownPinnedVersion):
        route_without_table("m", "v1", RoutingRequest("r", "k", pinned_version="v9"))
    assert (
        route_without_table("m", "v1", RoutingRequest("r", "k", pinned_version="v1")).version
        == "v1"
    )


def test_tables_with_invalid_names_are_refused() -> None:
    assert table_problem(RouteTable(model="m", stable_version="../etc")) is not None
    assert table_problem(table_for_weights(model="m", stable_version="v1")) is None


def _sample(batch_id: tuple[str, int, int] | None, at: int = 10_500) -> TelemetrySample:
    hist = LatencyHistogram()
    hist.record(5.0)
    return TelemetrySample(
        model="m",
        version="v2",
        variant="fp32",
        worker_id="w",
        completed_at_ms=at,
        request_count=4,
        error_count=1,
        latency=hist,
        batch_id=batch_id,
    )


def test_window_counts_a_rewound_batch_once() -> None:
    window = SlidingWindow(window_ms=10_000, step_ms=1_000)
    assert window.add(_sample(("w", 0, 100)))
    assert not window.add(_sample(("w", 0, 100), at=12_500))  # re-sent after a rewind
    assert window.add(_sample(("w", 0, 104)))
    assert window.add(_sample(None)) and window.add(_sample(None))  # old workers: no id
    stats = window.stats(_sample(None).key, 13_000)
    assert stats is not None and stats.requests == 16 and stats.errors == 4
    assert window.duplicates == 1


def test_numpy_is_untouched_for_a_valid_tensor() -> None:
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert (serde.from_tensor(serde.to_tensor("x", arr)) == arr).all()
