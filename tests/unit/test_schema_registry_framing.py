"""The ingress decoder reads Schema Registry protobuf framing as well as raw messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane import schema_registry, serde
from graylane.errors import SerdeError
from graylane.schema_registry import FramingError, message_indexes, unframe
from graylane.v1 import inference_pb2
from tests.support.confluent_framing import frame, zigzag_varint

REQUEST = inference_pb2.InferenceRequest(
    request_id="r1", model="gpt", routing_key="u1", token_ids=[1, 2, 3], tags={"a": "b"}
)


def test_zigzag_varints_match_the_documented_examples() -> None:
    """The test's own encoder against Protocol Buffers' documented zigzag table."""
    assert [zigzag_varint(v) for v in (0, -1, 1, -2, 2, 63, -64, 64)] == [
        b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x7e", b"\x7f", b"\x80\x01"
    ]  # fmt: skip


def test_the_request_is_the_second_message_of_its_file() -> None:
    assert message_indexes(inference_pb2.InferenceRequest) == (1,)
    assert message_indexes(inference_pb2.GenerationParams) == (0,)


def test_a_framed_request_decodes_like_the_raw_one() -> None:
    raw = serde.encode(REQUEST)
    framed = frame(raw, 42, [1])
    assert framed[:7] == b"\x00\x00\x00\x00\x2a\x02\x02"
    assert schema_registry.decode(inference_pb2.InferenceRequest, framed) == REQUEST
    assert schema_registry.decode(inference_pb2.InferenceRequest, raw) == REQUEST
    parts = unframe(framed)
    assert parts.framing is not None
    assert (parts.framing.schema_id, parts.framing.message_indexes) == (42, (1,))
    assert unframe(raw).framing is None


def test_the_single_zero_shortcut_names_the_first_message() -> None:
    params = inference_pb2.GenerationParams(max_new_tokens=7)
    framed = frame(serde.encode(params), 3, [0])
    assert framed[5] == 0 and len(framed) == 6 + len(serde.encode(params))
    assert schema_registry.decode(inference_pb2.GenerationParams, framed) == params
    longhand = frame(serde.encode(params), 3, [0], shortcut=False)
    assert schema_registry.decode(inference_pb2.GenerationParams, longhand) == params


def test_a_request_framed_as_another_message_is_refused_with_the_reason() -> None:
    framed = frame(serde.encode(REQUEST), 9, [0])
    with pytest.raises(FramingError, match=r"names message indexes \[0\].*InferenceRequest"):
        schema_registry.decode(inference_pb2.InferenceRequest, framed)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x00\x00\x00", "cut short"),
        (b"\x00\x00\x00\x00\x01", "cut short"),
        (b"\x00\x00\x00\x00\x01\x04\x02", "cut short inside"),
        (b"\x00\x00\x00\x00\x01\x01", "-1 message indexes"),
        (b"\x00\x00\x00\x00\x01" + zigzag_varint(17), "17 message indexes"),
        (b"\x00\x00\x00\x00\x01\x02\x01", "negative message index"),
        (b"\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\x01", "longer than 5 bytes"),
    ],
)
def test_damaged_framing_is_a_serde_error_with_its_reason(data: bytes, why: str) -> None:
    with pytest.raises(SerdeError, match=why):
        schema_registry.decode(inference_pb2.InferenceRequest, data)


@given(
    schema_id=st.integers(min_value=0, max_value=2**31 - 1),
    indexes=st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=16),
    payload=st.binary(max_size=64),
    shortcut=st.booleans(),
)
def test_framing_round_trips(
    schema_id: int, indexes: list[int], payload: bytes, shortcut: bool
) -> None:
    parts = unframe(frame(payload, schema_id, indexes, shortcut=shortcut))
    assert parts.payload == payload
    assert parts.framing is not None
    assert parts.framing.schema_id == schema_id
    assert parts.framing.message_indexes == tuple(indexes)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_a_serde_error(data: bytes) -> None:
    """Never another exception; what decodes from a framed value was framed as a request."""
    try:
        request = schema_registry.decode(inference_pb2.InferenceRequest, data)
    except SerdeError:
        return
    assert isinstance(request, inference_pb2.InferenceRequest)
    framing = unframe(data).framing
    assert framing is None or framing.message_indexes == (1,)
