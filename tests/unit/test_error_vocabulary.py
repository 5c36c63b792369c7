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


def test_each_code_has_one_http_and_one_grpc_status_and_they_agree() -> None:
    """A caller's mistake is a 4xx and never a gRPC INTERNAL; a failure inside is a 5xx."""
    import grpc

    from graylane.errors import GrpcStatus

    for status in GrpcStatus:  # our mirror of gRPC's canonical codes, value for value
        assert grpc.StatusCode[status.name].value[0] == status.value
    agree = {
        400: {GrpcStatus.INVALID_ARGUMENT},
        401: {GrpcStatus.UNAUTHENTICATED},
        403: {GrpcStatus.PERMISSION_DENIED},
        404: {GrpcStatus.NOT_FOUND},
        409: {GrpcStatus.ALREADY_EXISTS, GrpcStatus.FAILED_PRECONDITION},
        413: {GrpcStatus.RESOURCE_EXHAUSTED},
        429: {GrpcStatus.RESOURCE_EXHAUSTED},
        500: {GrpcStatus.INTERNAL, GrpcStatus.UNKNOWN},
        503: {GrpcStatus.UNAVAILABLE},
        504: {GrpcStatus.DEADLINE_EXCEEDED},
    }
    for code in ErrorCode:
        assert code.grpc_status in agree[code.http_status], code


def test_errors_carry_their_code_from_the_sdk_the_registry_and_the_control_plane() -> None:
    from graylane.client import InferenceTimeout, UnknownModel
    from graylane.engine.errors import BadShape
    from graylane.registry.records import DuplicateVersion, ModelNotRegistered, RegistryError
    from graylane.rollouts.errors import InvalidSpec
    from graylane.services.controlplane.logic import rules

    assert GraylaneError("x").code is ErrorCode.INTERNAL
    assert BadShape("x").code.http_status == 400
    assert InferenceTimeout("x").code.http_status == 504
    assert UnknownModel("x").code.http_status == 404
    assert ModelNotRegistered("x").code.grpc_status.name == "NOT_FOUND"
    assert DuplicateVersion("x").code.grpc_status.name == "ALREADY_EXISTS"
    assert RegistryError("x").code.grpc_status.name == "INVALID_ARGUMENT"
    assert InvalidSpec("x").code.grpc_status.name == "INVALID_ARGUMENT"
    assert rules.NotFound("x").code.grpc_status.name == "NOT_FOUND"
    assert rules.FailedPrecondition("x").code.grpc_status.name == "FAILED_PRECONDITION"
    assert rules.InvalidArgument("x").code.grpc_status.name == "INVALID_ARGUMENT"


def test_the_control_plane_answers_an_error_with_its_codes_grpc_status() -> None:
    import grpc

    from graylane.registry.records import UnknownVersion
    from graylane.services.controlplane.logic import rules
    from graylane.services.controlplane.servicers import grpc_status_of

    assert grpc_status_of(UnknownVersion("x")) is grpc.StatusCode.NOT_FOUND
    assert grpc_status_of(rules.ControlError("x")) is grpc.StatusCode.INTERNAL
    assert grpc_status_of(rules.FailedPrecondition("x")) is grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_gateway_answers_an_error_result_with_its_codes_http_status(code: ErrorCode) -> None:
    """Whatever the system answers, the HTTP status is the code's; a failure inside is
    answered with a generic message, its own kept for the logs; a shed call says when to
    retry."""
    from graylane.services.gateway.failures import from_error_code

    err = from_error_code(code, "why, inside", retry_after_s=3)
    assert err.status == code.http_status and err.code is code
    if code.http_status >= 500 and code is not ErrorCode.DEADLINE_EXCEEDED:
        assert err.message != "why, inside" and err.detail == "why, inside"
    else:
        assert err.message == "why, inside"
    assert (err.headers() == {"Retry-After": "3"}) == (code.http_status == 503)


def test_the_gateways_own_refusals_keep_openais_statuses_types_and_codes() -> None:
    from graylane.services.gateway.failures import ApiError

    cases = [
        (ApiError.invalid("x"), 400, "invalid_request_error", None),
        (ApiError.unauthenticated(), 401, "invalid_request_error", "invalid_api_key"),
        (ApiError.forbidden("x"), 403, "permission_error", "forbidden"),
        (ApiError.model_not_found("x"), 404, "invalid_request_error", "model_not_found"),
        (ApiError.too_large("x"), 413, "invalid_request_error", "request_too_large"),
        (ApiError.rate_limited("t", 1.5), 429, "rate_limit_error", "rate_limit_exceeded"),
        (ApiError.too_many_in_flight("t", 4, 1), 429, "rate_limit_error", "too_many_in_flight"),
        (ApiError.overloaded("x", 2), 503, "overloaded_error", "overloaded"),
        (ApiError.timed_out("x"), 504, "timeout_error", "timeout"),
    ]
    for err, status, kind, code in cases:
        body = err.openai_body()["error"]
        assert (err.status, body["type"], body["code"]) == (status, kind, code)


def test_a_requests_inputs_are_checked_once_by_the_engines_signature() -> None:
    """The worker's intake and the engine refuse a feed alike: same code, same words."""
    import numpy as np

    from graylane.engine.errors import InvalidInputError
    from graylane.engine.signature import IOSignature, TensorSpec
    from graylane.engine_worker.requests import check_inputs

    io = IOSignature(
        inputs=(TensorSpec("x", "float32", ("batch", 4)),),
        outputs=(TensorSpec("y", "float32", ("batch", 2)),),
    )
    bad_feeds = [
        {},
        {"x": np.zeros((1, 4), np.float32), "z": np.zeros(1, np.float32)},
        {"x": np.zeros((1, 4), np.float64)},
        {"x": np.zeros((1, 5), np.float32)},
    ]
    for feeds in bad_feeds:
        with pytest.raises(InvalidInputError) as refused:
            io.check_feeds(feeds)
        rejection = check_inputs(feeds, io)
        assert rejection == Rejection(refused.value.code, str(refused.value))
    assert check_inputs({"x": np.zeros((3, 4), np.float32)}, io) is None


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("invalid rule", "INVALID_ARGUMENT"),
        ("unknown rule", "NOT_FOUND"),
        ("registry", "NOT_FOUND"),
        ("internal", "INTERNAL"),
    ],
)
async def test_a_servicer_answers_every_typed_error_with_its_codes_status(
    error: str, status: str
) -> None:
    """``mapped`` turns any ``GraylaneError`` a servicer raises into an abort with the
    error's code's status: a routing rule's errors reach the caller as themselves."""
    import grpc

    from graylane.registry.records import UnknownVersion
    from graylane.routing.table import InvalidRouteRule, UnknownRouteRule
    from graylane.services.controlplane.servicers import mapped
    from tests.unit.test_controlplane_safety import Aborted, FakeContext

    raised = {
        "invalid rule": InvalidRouteRule("a routing rule needs a name"),
        "unknown rule": UnknownRouteRule("no rule 'beta' on gpt"),
        "registry": UnknownVersion("gpt has no version 9.9.9"),
        "internal": GraylaneError("inside"),
    }[error]

    class Servicer:
        @mapped
        async def Call(self, request: object, context: object) -> None:
            raise raised

    with pytest.raises(Aborted) as aborted:
        await Servicer().Call(None, FakeContext())
    assert aborted.value.code is grpc.StatusCode[status]
    assert str(aborted.value) == str(raised)
