"""Records in, one at a time and each on its own: what the engine restores and reads.

The streaming adapter (``graylane.policy_engine.app``) hands raw record values
here. A value that cannot be decoded, or whose content is invalid, becomes a
:class:`~graylane.policy_engine.messages.RecordSkipped` (counted, audited) and
never stops the records of other rollouts, models or QoS keys. No Kafka or
faust imports: plain bytes in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from graylane import serde
from graylane.errors import SerdeError
from graylane.policy_engine import convert
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.isolation import Isolation, invalid_sample
from graylane.policy_engine.logic.agreement import ShadowOutput
from graylane.policy_engine.logic.rollout_state import RolloutState
from graylane.policy_engine.logic.routing_plan import plan_of_table
from graylane.policy_engine.messages import (
    Command,
    CommandRejected,
    RecordSkipped,
    RecordSource,
    SkipReason,
)
from graylane.policy_engine.publish import command_from_pb, shadow_output_of
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec
from graylane.routing import RouteTable
from graylane.routing.cohorts import config_of_table
from graylane.routing.convert import table_from_pb
from graylane.v1 import control_pb2, inference_pb2, rollout_pb2, telemetry_pb2

__all__ = ["Restored", "command_of", "restore_values", "shadow_of", "telemetry_into"]

Values = Mapping[bytes, bytes | None]


@dataclass
class Restored:
    """What the compacted control topics hold, decoded; and what had to be skipped."""

    states: list[tuple[RolloutState, RolloutSpec]] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    tables: dict[str, RouteTable] = field(default_factory=dict)
    precision: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    qos_policies: list[QosPolicy] = field(default_factory=list)
    skipped: list[RecordSkipped] = field(default_factory=list)

    def apply(self, core: PolicyCore) -> None:
        core.restore(
            self.states, self.epochs, self.precision, self.qos_policies, tables=self.tables
        )


def restore_values(
    routing: Values, precision: Values, rollouts: Values, isolation: Isolation, at_ms: int
) -> Restored:
    """Decode the latest value per key of each control topic; skip (per key) what is bad."""
    out = Restored()

    def skip(source: RecordSource, key: bytes, exc: Exception) -> None:
        reason = SkipReason.UNDECODABLE if isinstance(exc, SerdeError) else SkipReason.INVALID
        name = key.decode("utf-8", "replace")
        detail = f"{type(exc).__name__}: {exc}"
        out.skipped.append(isolation.skip(source, reason, detail, at_ms, key=name))

    for key, value in routing.items():
        if not value:
            continue
        try:
            table = serde.decode(control_pb2.RoutingTable, value)
            route_table = table_from_pb(table)
            plan_of_table(route_table)  # what restore derives from it must work too
            config_of_table(route_table)
        except Exception as exc:
            skip(RecordSource.ROUTING, key, exc)
            continue
        out.epochs[table.model] = max(out.epochs.get(table.model, 0), table.epoch)
        if table.epoch >= out.epochs[table.model]:
            out.tables[table.model] = route_table
    for key, value in precision.items():
        if not value:
            continue
        try:
            cmd = serde.decode(control_pb2.PrecisionCommand, value)
            if not (cmd.model and cmd.version and cmd.variant):
                raise ValueError("precision command without model, version or variant")
        except Exception as exc:
            skip(RecordSource.PRECISION, key, exc)
            continue
        out.precision[(cmd.model, cmd.version)] = (cmd.variant, cmd.epoch)
    for key, value in rollouts.items():
        if not value:
            continue
        try:
            pb = serde.decode(rollout_pb2.RolloutState, value)
            state, spec = convert.rollout_state_from_pb(pb, epoch=out.epochs.get(pb.model, 0))
            if state.model != spec.model or not state.model:
                raise ValueError(f"state of model {state.model!r} with a spec of {spec.model!r}")
            if not state.terminal and not 0 <= state.step_index < len(spec.steps):
                raise ValueError(f"step {state.step_index} of a spec with {len(spec.steps)} steps")
        except Exception as exc:
            skip(RecordSource.ROLLOUTS, key, exc)
            continue
        out.states.append((state, spec))
    return out


def telemetry_into(
    core: PolicyCore, value: bytes | None, isolation: Isolation, at_ms: int
) -> RecordSkipped | None:
    """Feed one telemetry record to the core; what was skipped, if it was."""
    try:
        sample = convert.telemetry_from_pb(serde.decode(telemetry_pb2.BatchTelemetry, value))
    except SerdeError as exc:
        return isolation.skip(RecordSource.TELEMETRY, SkipReason.UNDECODABLE, str(exc), at_ms)
    except Exception as exc:  # a histogram without a valid scheme, ...
        detail = f"{type(exc).__name__}: {exc}"
        return isolation.skip(RecordSource.TELEMETRY, SkipReason.INVALID, detail, at_ms)
    problem = invalid_sample(sample, core.window.scheme)
    if problem is None:
        try:
            core.on_telemetry(sample, received_ms=at_ms)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        return isolation.skip(
            RecordSource.TELEMETRY,
            SkipReason.INVALID,
            problem,
            at_ms,
            model=sample.model,
            version=sample.version,
        )
    return None


def command_of(
    value: bytes | None, isolation: Isolation, at_ms: int
) -> Command | CommandRejected | RecordSkipped:
    """The command of one record on the commands topic, or why it was skipped."""
    try:
        pb = serde.decode(rollout_pb2.RolloutCommand, value)
    except SerdeError as exc:
        return isolation.skip(RecordSource.COMMANDS, SkipReason.UNDECODABLE, str(exc), at_ms)
    try:
        return command_from_pb(pb)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        return isolation.skip(
            RecordSource.COMMANDS,
            SkipReason.INVALID,
            detail,
            at_ms,
            key=pb.command_id,
            model=pb.model,
        )


def shadow_of(
    value: bytes | None, isolation: Isolation, at_ms: int
) -> ShadowOutput | RecordSkipped:
    """The shadow output of one result on a shadow topic, or why it was skipped."""
    try:
        return shadow_output_of(serde.decode(inference_pb2.InferenceResult, value), at_ms)
    except Exception as exc:
        reason = SkipReason.UNDECODABLE if isinstance(exc, SerdeError) else SkipReason.INVALID
        return isolation.skip(RecordSource.SHADOW, reason, f"{type(exc).__name__}: {exc}", at_ms)
