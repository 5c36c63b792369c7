"""Control-plane rules, pure: what may start, which command fits which rollout, QoS checks.

No gRPC, SQL or Kafka here. The servicers gather the facts (registry lookups, the
rollout on record) into the dataclasses below and map the typed errors to status
codes at the edge. Every message says what to change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from graylane.artifacts.naming import NamingError, parse_semver
from graylane.errors import ErrorCode, GraylaneError
from graylane.rollouts.spec import step_weight_problem
from graylane.rollouts.vocabulary import ManualCommand, Phase

__all__ = [
    "ArtifactFacts",
    "ControlError",
    "FailedPrecondition",
    "InvalidArgument",
    "ModelFacts",
    "NotFound",
    "StartRequest",
    "VersionFacts",
    "check_command",
    "check_qos_policy",
    "check_start",
    "check_steps",
    "new_rollout_id",
]


class ControlError(GraylaneError):
    """A control-plane request cannot be carried out as asked."""


class InvalidArgument(ControlError):
    """The request itself is malformed (bad name, bad semver, steps out of order)."""

    code = ErrorCode.BAD_REQUEST


class NotFound(ControlError):
    """The request names a model, version or rollout that does not exist."""

    code = ErrorCode.NOT_FOUND


class FailedPrecondition(ControlError):
    """The request is well-formed but the system is not in a state that allows it."""

    code = ErrorCode.FAILED_PRECONDITION


@dataclass(frozen=True)
class ArtifactFacts:
    name: str
    precision: str
    servable: bool
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class VersionFacts:
    version: str
    status: str
    artifacts: tuple[ArtifactFacts, ...] = ()


@dataclass(frozen=True)
class ModelFacts:
    """What the registry and the store know about one model."""

    name: str
    versions: Mapping[str, VersionFacts] = field(default_factory=dict)
    stable_version: str | None = None
    active_rollout_id: str | None = None
    active_rollout_phase: Phase | None = None


@dataclass(frozen=True)
class StartRequest:
    model: str
    baseline: str
    candidate: str
    step_weights: tuple[float, ...] = ()


_UNUSABLE_STATUSES = frozenset({"failed", "retired"})
_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def check_steps(weights: Sequence[float]) -> None:
    """Step weights must rise strictly within (0, 100]; an empty list means the defaults."""
    problem = step_weight_problem(weights)
    if problem is not None:
        raise InvalidArgument(problem)


def _check_semver(role: str, version: str) -> str:
    if not version:
        raise InvalidArgument(f"the {role} version is empty; pass --{role} MAJOR.MINOR.PATCH")
    try:
        parse_semver(version)
    except NamingError as exc:
        raise InvalidArgument(f"{role} version: {exc}") from None
    return version


def _version(model: ModelFacts, role: str, version: str) -> VersionFacts:
    found = model.versions.get(version)
    if found is None:
        known = ", ".join(sorted(model.versions)) or "none"
        raise NotFound(
            f"{role} version {version} of model {model.name!r} is not registered (known: "
            f"{known}); register it with `graylane model register {model.name} --version "
            f"{version}`"
        )
    if found.status in _UNUSABLE_STATUSES:
        raise FailedPrecondition(
            f"{role} version {version} of {model.name!r} is {found.status}; pick another "
            "version or rebuild this one"
        )
    return found


def check_start(request: StartRequest, model: ModelFacts | None) -> tuple[str, str]:
    """Validate a rollout start; returns (baseline, candidate) with the baseline resolved.

    An empty baseline means the model's stable version. A candidate whose
    artifacts all failed validation cannot start; one without any registered
    artifact can (its worker may load plain ONNX files).
    """
    if not request.model:
        raise InvalidArgument("model is empty; name the model to roll out")
    if model is None:
        raise NotFound(
            f"model {request.model!r} is not registered; register it first with "
            f"`graylane model register {request.model}`"
        )
    check_steps(request.step_weights)
    baseline = request.baseline or model.stable_version or ""
    if not baseline:
        raise InvalidArgument(
            f"no baseline given and {model.name!r} has no stable version; pass --baseline or "
            f"set one with `graylane model register {model.name} --version V --stable`"
        )
    _check_semver("baseline", baseline)
    candidate = _check_semver("candidate", request.candidate)
    if baseline == candidate:
        raise InvalidArgument(
            f"baseline and candidate are both {baseline}; the candidate must be another version"
        )
    _version(model, "baseline", baseline)
    cand = _version(model, "candidate", candidate)
    if cand.artifacts and not any(a.servable for a in cand.artifacts):
        failures = "; ".join(
            f"{a.name}: {', '.join(a.failures) or 'not servable'}" for a in cand.artifacts
        )
        raise FailedPrecondition(
            f"every artifact of {model.name} {candidate} failed validation ({failures}); "
            "rebuild the candidate or register a variant that passes validation"
        )
    if model.active_rollout_id is not None:
        phase = model.active_rollout_phase.value if model.active_rollout_phase else "unknown"
        raise FailedPrecondition(
            f"model {model.name!r} already has rollout {model.active_rollout_id} ({phase}); "
            "promote, roll back or abort it before starting another"
        )
    return baseline, candidate


def check_command(command: ManualCommand, rollout_id: str, phase: Phase) -> None:
    """A manual command fits the rollout's last known phase."""
    if phase.finished:
        raise FailedPrecondition(
            f"rollout {rollout_id} is already {phase.value}; a finished rollout takes no "
            f"{command.value}; start a new rollout instead"
        )
    if phase is Phase.BAKING and command not in (ManualCommand.ROLLBACK, ManualCommand.PROMOTE):
        raise FailedPrecondition(
            f"rollout {rollout_id} is baking (promoted, watched by its gates); a baking "
            f"rollout takes no {command.value}: roll it back, or promote it to end the bake"
        )
    if command is ManualCommand.PAUSE and phase is Phase.PAUSED:
        raise FailedPrecondition(f"rollout {rollout_id} is already paused; resume it instead")
    # PENDING: the policy engine may not have reported the pause yet; let it judge.
    resumable = (Phase.PAUSED, Phase.PENDING)
    if command is ManualCommand.RESUME and phase not in resumable:
        raise FailedPrecondition(
            f"rollout {rollout_id} is {phase.value}, not paused; only a paused rollout resumes"
        )


def check_qos_policy(
    model: ModelFacts | None, model_name: str, version: str, ladder: Sequence[str]
) -> None:
    """The policy names a registered version, and its ladder only servable variants."""
    if model is None:
        raise NotFound(
            f"model {model_name!r} is not registered; register it with "
            f"`graylane model register {model_name}`"
        )
    facts = _version(model, "policy", _check_semver("version", version))
    if not ladder:
        raise InvalidArgument(
            "the ladder is empty; list variants from quality to speed, e.g. --ladder fp32,fp16,int8"
        )
    if facts.artifacts:
        servable = {a.precision for a in facts.artifacts if a.servable}
        missing = [v for v in ladder if v not in servable]
        if missing:
            raise FailedPrecondition(
                f"ladder variants {', '.join(missing)} of {model.name} {version} are not "
                f"servable (servable: {', '.join(sorted(servable)) or 'none'}); build them "
                "or drop them from the ladder"
            )


def new_rollout_id(model: str, now_ms: int) -> str:
    """``ro-<model>-<UTC yyyymmddThhmmss><ms>``: sortable and readable."""
    moment = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    safe = _ID_SAFE.sub("-", model)
    return f"ro-{safe}-{moment:%Y%m%dT%H%M%S}{now_ms % 1000:03d}"


def revision_target(
    model: str,
    revision: int,
    window: Sequence[tuple[int, str]],
    active_rollout: str | None,
) -> str:
    """The version of stable revision ``revision`` among ``window`` ((revision, version),
    newest first, the current stable first); refused during a rollout, outside the window,
    or when it is the current stable version."""
    if active_rollout is not None:
        raise FailedPrecondition(
            f"{model} has the active rollout {active_rollout}; end it before going back "
            "to an older stable version"
        )
    if revision < 1:
        raise InvalidArgument(f"revision {revision}: revisions count from 1")
    found = dict(window)
    if revision not in found:
        known = ", ".join(f"{r} ({v})" for r, v in window) or "none"
        raise NotFound(
            f"{model} has no stable revision {revision} among its last {len(window)} "
            f"(`graylane rollout history {model}`: {known})"
        )
    current = window[0][1]
    if found[revision] == current and revision == window[0][0]:
        raise FailedPrecondition(f"revision {revision} ({current}) is the current stable version")
    return found[revision]
