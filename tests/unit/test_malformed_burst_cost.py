"""A burst of hostile records must stay cheap to refuse (issue 10, chaos bench): a
60 000-token request is refused on its length before any per-token work, and a
100 KB request id never becomes a partition key (pure-Python murmur2 per byte)."""

from __future__ import annotations

from graylane import serde
from graylane.engine.signature import IOSignature
from graylane.engine_worker.requests import Limits, RequestFacts, TaskKind, prepare
from graylane.errors import ErrorCode, Rejection
from graylane.kafka.replies import MAX_PARTITION_KEY_BYTES, ReplySink, partition_key
from graylane.models.demo_gpt import build_demo_gpt
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2


def test_an_overlong_token_list_is_refused_on_its_length_first() -> None:
    io = IOSignature.from_onnx(build_demo_gpt("tiny", 0))
    limits = Limits(max_seq_len=64)
    # out of range too: the length decides, before any token is looked at
    facts = RequestFacts(task=TaskKind.FORWARD, token_ids=tuple([2**62] * 60_000))
    got = prepare(0, facts, io, limits, 0)
    assert getattr(got, "code", None) is ErrorCode.SEQUENCE_TOO_LONG
    ok = prepare(0, RequestFacts(task=TaskKind.FORWARD, token_ids=(1, 2)), io, limits, 0)
    assert getattr(ok, "seq_len", None) == 2


def test_long_keys_are_hashed_short_ones_kept() -> None:
    assert partition_key(b"req-1") == b"req-1"
    long = b"r" * 100_000
    assert len(partition_key(long)) == 32 and partition_key(long) == partition_key(long)
    assert partition_key(b"x" * MAX_PARTITION_KEY_BYTES) == b"x" * MAX_PARTITION_KEY_BYTES


class _Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> object:
        self.sent.append((topic, value, key))
        return None


async def test_an_error_result_for_a_huge_request_id_keeps_the_id_but_not_as_key() -> None:
    layout = TopicLayout(prefix="t")
    producer = _Capture()
    sink = ReplySink(producer, layout, "test")  # type: ignore[arg-type]
    sink._known, sink._known_at = {layout.results("m")}, 1e18  # the topic exists
    rid = "bad-" + "r" * 100_000
    request = inference_pb2.InferenceRequest(request_id=rid, model="m")
    await sink.error_result(request, Rejection(inference_pb2.BAD_REQUEST, "too long"), None)  # type: ignore[arg-type]
    [(topic, value, key)] = producer.sent
    assert topic == layout.results("m") and key is not None
    assert len(key) <= MAX_PARTITION_KEY_BYTES
    assert serde.decode(inference_pb2.InferenceResult, value).request_id == rid
