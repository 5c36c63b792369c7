"""One error vocabulary: ``ErrorCode`` is the wire's enum, and a rejection carries it."""

from __future__ import annotations

import pytest

from graylane.errors import ErrorCode, GraylaneError, Rejection, is_retriable
from graylane.v1 import inference_pb2


def test_error_code_names_and_values_match_the_generated_enum_exactly() -> None:
    generated = dict(inference_pb2.ErrorCode.items())
    ours = {code.name: code.value for code in ErrorCode}
    assert ours == generated


def test_unknown_wire_numbers_map_to_none() -> None:
    assert ErrorCode.of(inference_pb2.SHED) is ErrorCode.SHED
    assert ErrorCode.of(999) is None


def test_a_rejection_holds_the_enum_whether_given_the_enum_or_the_wire_number() -> None:
    from_wire = Rejection(inference_pb2.BAD_SHAPE, "shape")
    assert from_wire.code is ErrorCode.BAD_SHAPE
    assert from_wire == Rejection(ErrorCode.BAD_SHAPE, "shape")
    with pytest.raises(ValueError):
        Rejection(999, "no such code")


def test_the_root_error_is_not_retriable_and_subclasses_say_so() -> None:
    class Transient(GraylaneError):
        retriable = True

    assert not is_retriable(GraylaneError("x"))
    assert is_retriable(Transient("x"))
    assert not is_retriable(ValueError("x"))
