"""Control-plane rules with plain data: no gRPC, SQL or Kafka."""

from __future__ import annotations

import re

import pytest

from graylane.rollouts.vocabulary import ManualCommand, Phase
from graylane.services.controlplane.auth import (
    ApiRole,
    AuthError,
    Principal,
    TokenTable,
    parse_tokens,
)
from graylane.services.controlplane.logic.rules import (
    ArtifactFacts,
    FailedPrecondition,
    InvalidArgument,
    ModelFacts,
    NotFound,
    StartRequest,
    VersionFacts,
    check_command,
    check_qos_policy,
    check_start,
    check_steps,
    new_rollout_id,
)

GOOD = ArtifactFacts("m-onnxruntime1.32.0-int8-ptq:1.1.0", "int8", True)
BAD = ArtifactFacts("m-onnxruntime1.32.0-fp16-ptq:1.2.0", "fp16", False, ("cosine 0.8 < 0.99",))


def _model(**kw: object) -> ModelFacts:
    versions = {
        "1.0.0": VersionFacts("1.0.0", "registered"),
        "1.1.0": VersionFacts("1.1.0", "built", (GOOD,)),
        "1.2.0": VersionFacts("1.2.0", "built", (BAD,)),
        "1.3.0": VersionFacts("1.3.0", "retired"),
    }
    fields: dict[str, object] = {"name": "m", "versions": versions, "stable_version": "1.0.0"}
    fields.update(kw)
    return ModelFacts(**fields)  # type: ignore[arg-type]


def test_start_resolves_the_stable_baseline() -> None:
    assert check_start(StartRequest("m", "", "1.1.0"), _model()) == ("1.0.0", "1.1.0")
    assert check_start(StartRequest("m", "1.0.0", "1.1.0", (1, 50, 100)), _model()) == (
        "1.0.0",
        "1.1.0",
    )


@pytest.mark.parametrize(
    ("request_", "error", "says"),
    [
        (StartRequest("", "", "1.1.0"), InvalidArgument, "model is empty"),
        (StartRequest("m", "", "1.1"), InvalidArgument, "MAJOR.MINOR.PATCH"),
        (StartRequest("m", "v1", "1.1.0"), InvalidArgument, "baseline version"),
        (StartRequest("m", "", "1.0.0"), InvalidArgument, "must be another version"),
        (StartRequest("m", "", "9.0.0"), NotFound, "graylane model register m --version 9.0.0"),
        (StartRequest("m", "", "1.2.0"), FailedPrecondition, "cosine 0.8 < 0.99"),
        (StartRequest("m", "", "1.3.0"), FailedPrecondition, "retired"),
        (StartRequest("m", "", "1.1.0", (5, 5, 100)), InvalidArgument, "increase strictly"),
        (StartRequest("m", "", "1.1.0", (0, 100)), InvalidArgument, "above 0"),
    ],
)
def test_start_refusals_say_what_to_fix(
    request_: StartRequest, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=re.escape(says)):
        check_start(request_, _model())


def test_start_refuses_unknown_model_missing_baseline_and_a_second_rollout() -> None:
    with pytest.raises(NotFound, match="graylane model register x"):
        check_start(StartRequest("x", "", "1.1.0"), None)
    with pytest.raises(InvalidArgument, match="no stable version"):
        check_start(StartRequest("m", "", "1.1.0"), _model(stable_version=None))
    busy = _model(active_rollout_id="ro-m-1", active_rollout_phase=Phase.PAUSED)
    with pytest.raises(FailedPrecondition, match="ro-m-1 \\(paused\\)"):
        check_start(StartRequest("m", "", "1.1.0"), busy)


def test_candidate_without_artifacts_may_start() -> None:
    model = _model(versions={**_model().versions, "2.0.0": VersionFacts("2.0.0", "registered")})
    assert check_start(StartRequest("m", "", "2.0.0"), model)[1] == "2.0.0"


def test_steps() -> None:
    check_steps(())
    check_steps((1, 5, 25, 50, 100))
    for bad in ((10, 5), (1, 101), (-1,)):
        with pytest.raises(InvalidArgument):
            check_steps(bad)


def test_commands_by_phase() -> None:
    check_command(ManualCommand.PAUSE, "r", Phase.PROGRESSING)
    check_command(ManualCommand.RESUME, "r", Phase.PAUSED)
    check_command(ManualCommand.ABORT, "r", Phase.PENDING)
    with pytest.raises(FailedPrecondition, match="already promoted"):
        check_command(ManualCommand.ROLLBACK, "r", Phase.PROMOTED)
    with pytest.raises(FailedPrecondition, match="already paused"):
        check_command(ManualCommand.PAUSE, "r", Phase.PAUSED)
    with pytest.raises(FailedPrecondition, match="only a paused rollout resumes"):
        check_command(ManualCommand.RESUME, "r", Phase.PROGRESSING)


def test_a_baking_rollout_takes_only_rollback_and_promote() -> None:
    check_command(ManualCommand.ROLLBACK, "r", Phase.BAKING)
    check_command(ManualCommand.PROMOTE, "r", Phase.BAKING)
    for refused in (ManualCommand.PAUSE, ManualCommand.RESUME, ManualCommand.ABORT):
        with pytest.raises(FailedPrecondition, match="is baking"):
            check_command(refused, "r", Phase.BAKING)


def test_qos_policy_checks() -> None:
    check_qos_policy(_model(), "m", "1.1.0", ["int8"])
    check_qos_policy(_model(), "m", "1.0.0", ["fp32", "int8"])  # no artifacts: not checked
    with pytest.raises(NotFound):
        check_qos_policy(None, "x", "1.0.0", ["fp32"])
    with pytest.raises(FailedPrecondition, match=r"fp32 .* not servable"):
        check_qos_policy(_model(), "m", "1.1.0", ["fp32", "int8"])
    with pytest.raises(InvalidArgument, match="ladder is empty"):
        check_qos_policy(_model(), "m", "1.1.0", [])


def test_rollout_ids_are_readable_and_sortable() -> None:
    first = new_rollout_id("m", 1_700_000_000_123)
    assert first == "ro-m-20231114T221320123"
    assert new_rollout_id("m", 1_700_000_001_000) > first


def test_tokens() -> None:
    table = parse_tokens("ops:operator:alice, view:read-only\n# comment\nro2:READ_ONLY")
    assert table["ops"] == Principal("alice", ApiRole.OPERATOR)
    assert table["view"].role is ApiRole.READ_ONLY and table["view"].name.startswith("read_only-")
    tokens = TokenTable(table)
    assert tokens.principal_of([("authorization", "Bearer ops")]) == table["ops"]
    assert tokens.principal_of([("authorization", "Basic ops")]) is None
    assert tokens.principal_of([]) is None
    assert not table["view"].may_call("/graylane.v1.Rollouts/Start")
    assert table["view"].may_call("/graylane.v1.Rollouts/Watch")
    with pytest.raises(AuthError, match="unknown role"):
        parse_tokens("x:admin")
    with pytest.raises(AuthError, match="no tokens configured"):
        TokenTable({})
