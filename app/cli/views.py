"""How the operator commands read times and print: tables, rollout states, policies, decisions.

Times on the command line are ISO 8601, unix milliseconds, or an age such as ``15m``
(:func:`parse_time`).

Every read command takes ``-o table|json|yaml|name`` (:class:`OutputFormat`). The
machine-readable forms are stable: one document per command,

    {"apiVersion": "graylane.v1", "kind": "RolloutList", "items": [ ... ]}

(a single object: ``"kind": "RolloutState", "object": { ... }``), each item the
protobuf JSON mapping of its ``graylane.v1`` message in ``protos/`` with the
``.proto`` field names, every field present (defaults included), enums by name and
64-bit integers as strings. Fields are only ever added, as the ``.proto`` files
promise; ``name`` prints one id per line. The commands that read Kafka directly
(:mod:`graylane.app.cli.replay`) print one report object each: ``AuditTimeline``,
``AuditVerification`` and ``TrafficReplayReport``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from graylane.clock import now_ms as clock_now_ms

__all__ = [
    "API_VERSION",
    "OutputFormat",
    "add_output",
    "emit",
    "emit_list",
    "parse_time",
    "phase_name",
    "print_decisions",
    "print_policy",
    "print_state",
    "table",
    "when",
]


API_VERSION = "graylane.v1"
"""The ``apiVersion`` of every machine-readable document: the protobuf package."""


class OutputFormat(Enum):
    """How a read command prints (``-o``)."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"
    NAME = "name"


def add_output(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The read command ``parser`` takes ``-o table|json|yaml|name``."""
    parser.add_argument(
        "-o",
        "--output",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TABLE.value,
        help="table (default), or json / yaml (stable, the graylane.v1 messages), or name",
    )
    return parser


def output_format(args: Any) -> OutputFormat:
    return OutputFormat(getattr(args, "output", None) or OutputFormat.TABLE.value)


def as_dict(message: Any) -> dict[str, Any]:
    """The protobuf JSON mapping of ``message``: ``.proto`` names, every field, enum names."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def document(
    kind: str, messages: Sequence[Any] | None = None, single: Any = None
) -> dict[str, Any]:
    """The stable machine-readable document of a list (``messages``) or one object."""
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind}
    if single is not None:
        doc["object"] = as_dict(single)
    else:
        doc["items"] = [as_dict(m) for m in messages or ()]
    return doc


def _write(doc: dict[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.YAML:
        import yaml

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    else:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def emit_list(
    args: Any,
    kind: str,
    messages: Sequence[Any],
    name: Callable[[Any], str],
    as_table: Callable[[], None],
) -> None:
    """Print a list in the command's ``-o`` format (``kind``: e.g. ``RolloutList``)."""
    fmt = output_format(args)
    if fmt is OutputFormat.TABLE:
        as_table()
    elif fmt is OutputFormat.NAME:
        for m in messages:
            print(name(m))
    else:
        _write(document(kind, messages), fmt)


def emit(args: Any, kind: str, message: Any, name: str, as_table: Callable[[], None]) -> None:
    """Print one object in the command's ``-o`` format."""
    fmt = output_format(args)
    if fmt is OutputFormat.TABLE:
        as_table()
    elif fmt is OutputFormat.NAME:
        if name:  # a report names what it lists, one a line; none: nothing
            print(name)
    else:
        _write(document(kind, single=message), fmt)


def phase_name(value: int) -> str:
    """The phase's name as ``graylane.rollouts`` spells it; the number when unknown."""
    from graylane.rollouts.pb import phase_from_pb

    if value == 0:
        return "unspecified"
    phase = phase_from_pb(value)
    return phase.value if phase is not None else str(value)


def console() -> Any:
    from rich.console import Console

    return Console()


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for i, c in enumerate(columns):
        # The first column holds ids and times people copy: never wrap it.
        table.add_column(c, no_wrap=i == 0)
    for row in rows:
        table.add_row(*(str(x) for x in row))
    console().print(table)


def when(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def bake_text(state: Any, now: int | None = None) -> str:
    """The bake period of a rollout state: how long is left while baking, else its length
    ("" without one)."""
    from graylane.clock import now_ms

    spec = state.spec
    if phase_name(state.phase) == "baking":
        left_s = max(0, state.bake_until_unix_ms - (now_ms() if now is None else now)) / 1000
        return (
            f"baking, {left_s:.0f}s left of {spec.bake_s:g}s "
            f"(until {when(state.bake_until_unix_ms)})"
        )
    return f"{spec.bake_s:g}s after the promotion" if spec.bake_s else ""


def state_rows(state: Any) -> list[tuple[str, object]]:
    spec = state.spec
    bake = bake_text(state)
    return [
        ("rollout", state.rollout_id),
        ("model", state.model),
        ("baseline -> candidate", f"{spec.baseline_version} -> {spec.candidate_version}"),
        ("phase", phase_name(state.phase)),
        ("step", f"{state.step_index + 1} of {len(spec.steps)}"),
        ("candidate weight", f"{state.candidate_weight_percent:g}%"),
        ("consecutive failures", state.consecutive_failures),
        *([("bake", bake)] if bake else []),
        ("last reason", state.last_reason or "-"),
        ("updated", when(state.updated_at_unix_ms)),
        ("created", f"{when(spec.created_at_unix_ms)} by {spec.created_by or '-'}"),
    ]


def print_state(state: Any) -> None:
    table("rollout", ("field", "value"), state_rows(state))


def print_policy(view: Any) -> None:
    from graylane.v1 import rollout_pb2

    p = view.policy
    rows: list[tuple[str, object]] = [
        ("model / version", f"{p.model} {p.version}"),
        ("enabled", p.enabled),
        ("SLO p99", f"{p.slo_p99_ms:g} ms" if p.slo_p99_ms > 0 else "- (not judged)"),
        ("ladder", " > ".join(p.ladder)),
        ("quality floor", _floor_text(p)),
        ("step down above", f"SLO x {1 + p.step_down_margin:g} for {p.sustain_s:g}s"),
        ("step up below", f"SLO x {p.step_up_ratio:g} for {p.sustain_s:g}s"),
        (
            "step up by load",
            ", ".join(
                f"{v} < {p.up_capacity_fraction or 0.7:g} x {rps:.1f} rps"
                for v, rps in sorted(p.rung_capacity_rps.items())
            )
            or "- (no calibration: by p99)",
        ),
        *(
            [
                ("SLO TTFT p99", f"{p.slo_ttft_p99_ms:g} ms" if p.slo_ttft_p99_ms else "-"),
                ("SLO TPOT p99", f"{p.slo_tpot_p99_ms:g} ms" if p.slo_tpot_p99_ms else "-"),
                (
                    "waiting / worker",
                    f"> {p.max_waiting_sequences:g}"
                    if p.max_waiting_sequences
                    else "> capacity x TTFT objective (Inference Extension: 5)",
                ),
                ("KV cache", f"> {p.max_kv_cache_occupancy or 0.8:g} (Inference Extension: 0.8)"),
            ]
            if p.slo_ttft_p99_ms or p.slo_tpot_p99_ms
            else []
        ),
        ("min dwell", f"{p.min_dwell_s:g}s"),
        (
            "quality cap",
            f"drop <= {p.max_quality_drop:.3f} vs the reference rung; unmeasured rungs "
            + ("refused" if p.unmeasured_rung == rollout_pb2.UNMEASURED_RUNG_REFUSED else "allowed")
            if p.HasField("max_quality_drop")
            else "- (none)",
        ),
        ("active variant", view.active_variant or "unknown (no precision change on record)"),
        ("active since", when(view.active_since_unix_ms)),
        ("last reason", view.last_reason or "-"),
        ("updated", f"{when(view.updated_at_unix_ms)} by {view.updated_by or '-'}"),
    ]
    table("QoS policy", ("field", "value"), rows)
    print_ladder_quality(p, view.active_variant)


def _floor_text(policy: Any) -> str:
    """The policy's floor, or the rung above the first its quality cap refuses."""
    from graylane.policy_engine.logic.quality_cap import capped_floor
    from graylane.rollouts.errors import InvalidPolicy
    from graylane.rollouts.pb import qos_policy_from_pb

    if not policy.ladder:
        return "-"
    stated: str = policy.quality_floor or policy.ladder[-1]
    try:
        capped = capped_floor(qos_policy_from_pb(policy))
    except InvalidPolicy:
        return stated
    if capped.refused is None:
        return stated
    return f"{policy.ladder[capped.index]} (quality cap: {capped.refused.describe()})"


def print_ladder_quality(policy: Any, active: str = "") -> None:
    """Each rung of the ladder with its measured quality cost and whether QoS may step
    onto it under the policy's cap."""
    from graylane.policy_engine.logic.quality_cap import RungAdmission, ladder_verdicts
    from graylane.rollouts.errors import InvalidPolicy
    from graylane.rollouts.pb import qos_policy_from_pb

    try:
        verdicts = ladder_verdicts(qos_policy_from_pb(policy))
    except InvalidPolicy:
        return
    words = {
        RungAdmission.WITHIN_CAP: "allowed",
        RungAdmission.UNMEASURED: "allowed (unmeasured)",
        RungAdmission.OVER_CAP: "refused: over the cap",
        RungAdmission.UNMEASURED_REFUSED: "refused: unmeasured",
    }
    rows = [
        (
            v.variant + (" *" if v.variant == active else ""),
            "unmeasured" if v.drop is None else f"{v.drop:+.3f}",
            words[v.admission] if v.cap is not None or v.drop is None else "allowed (no cap)",
        )
        for v in verdicts
    ]
    table(
        "ladder (quality cost = reference score - rung score)",
        ("rung", "quality cost", "step onto"),
        rows,
    )


def print_decisions(
    records: Iterable[Any], *, title: str, extra: Callable[[Any], str] | None = None
) -> None:
    from graylane.v1 import audit_pb2

    rows = []
    for r in records:
        after = r.rollout_after if r.HasField("rollout_after") else None
        weight = f"{after.candidate_weight_percent:g}%" if after is not None else "-"
        variant = r.qos_after.active_variant if r.HasField("qos_after") else ""
        numbers = " ".join(
            f"{s.version}/{s.variant}: n={s.requests} err={s.errors} p99={s.p99_ms:.1f}ms"
            for s in r.inputs
        )
        if extra is not None:
            numbers = " ".join(x for x in (numbers, extra(r)) if x)
        rows.append(
            (
                when(r.decided_at_unix_ms),
                r.rollout_id or r.version,
                audit_pb2.DecisionKind.Name(r.kind).removeprefix("DECISION_").lower(),
                r.rule,
                r.reason,
                variant or weight,
                numbers or "-",
            )
        )
    table(
        title,
        ("when", "rollout/version", "decision", "rule", "reason", "weight/variant", "key numbers"),
        rows,
    )
    if not rows:
        print("no decisions in that range", file=sys.stderr)


# -- times on the command line ----------------------------------------------------------------

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Unix ms of ``text``; empty gives 0 (unbounded). Naive ISO times are UTC."""
    text = text.strip()
    if not text:
        return 0
    now = clock_now_ms() if now_ms is None else now_ms
    ago = _AGO.match(text)
    if ago:
        return now - int(float(ago.group(1)) * _UNIT_S[ago.group(2)] * 1000)
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(
            f"time {text!r}: use ISO 8601 (2026-01-31T10:42), unix ms, or an age like 15m / 2h"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
