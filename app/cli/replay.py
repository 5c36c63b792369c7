"""``graylane audit replay|verify`` and ``graylane traffic replay``: straight from Kafka.

These read topics by timestamp (``offsets_for_times``) and need no control plane:
an auditor can rebuild a rollout's timeline from ``<p>.audit`` and ``<p>.telemetry``,
re-run the pure controllers over the recorded inputs, or re-send a window of
recorded requests to another version and compare the outputs (an offline shadow).

Each prints a table, or with ``-o json|yaml`` one stable document (see
:mod:`graylane.app.cli.views`) holding its ``graylane.v1`` report message:
``AuditTimeline`` (``audit replay``), ``AuditVerification`` (``audit verify``) and
``TrafficReplayReport`` (``traffic replay``); ``-o name`` prints the decision ids of the
timeline, the decision ids that replay differently, or the request ids whose outputs
differ. The exit status does not depend on the format: ``audit verify`` and ``traffic
replay`` exit 1 when something differs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from graylane.app.cli.views import add_output, emit, parse_time

if TYPE_CHECKING:
    from graylane.policy_engine.logic.replay import Mismatch
    from graylane.v1 import audit_pb2, inference_pb2, telemetry_pb2

__all__ = [
    "audit_verification",
    "read_range",
    "register_audit",
    "register_traffic",
    "telemetry_totals",
    "traffic_report",
]


def register_audit(
    audit_sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_range: Callable[..., None],
) -> None:
    replay = audit_sub.add_parser(
        "replay", help="a rollout's timeline from <p>.audit and <p>.telemetry (reads Kafka)"
    )
    add_range(add_output(replay), required=True)
    replay.set_defaults(handler=_audit_replay)
    verify = audit_sub.add_parser(
        "verify", help="re-run the controllers over recorded inputs and list differences"
    )
    add_range(add_output(verify), required=True)
    verify.set_defaults(handler=_audit_verify)


def register_traffic(tsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = tsub.add_parser(
        "replay",
        help="re-send recorded requests to a version and compare with the recorded results",
    )
    replay.add_argument("--model", required=True, help="the model whose recorded traffic to replay")
    replay.add_argument("--version", required=True, help="the version to test")
    replay.add_argument(
        "--from", dest="from_", required=True, help="ISO time, unix ms, or ago like 15m / 2h / 1d"
    )
    replay.add_argument("--to", default="", help="ISO time, unix ms, or ago (default: now)")
    replay.add_argument("--limit", type=int, default=200, help="at most this many requests")
    replay.add_argument(
        "--timeout-s", type=float, default=60.0, help="give up waiting for results after this long"
    )
    add_output(replay)
    replay.set_defaults(handler=_traffic_replay)


def _factory() -> Any:
    from graylane.kafka.seam import KafkaFactory
    from graylane.settings import Settings

    return KafkaFactory(Settings.from_env())


async def read_range(
    factory: Any, topic: str, from_ms: int, to_ms: int, *, timeout_s: float = 30.0
) -> list[Any]:
    """Records of ``topic`` with timestamps in ``[from_ms, to_ms)`` (0: unbounded)."""
    from graylane.kafka.reading import read_to_end

    admin = factory.admin()
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            return []  # nothing was ever recorded there
    finally:
        await admin.close()
    out = await read_to_end(
        factory, topic, from_ms=from_ms, to_ms=to_ms, timeout_s=timeout_s, client_suffix="rr"
    )
    out.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return out


def _audit_replay(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import print_decisions
    from graylane.policy_engine.audit_replay import load_recorded
    from graylane.serde import decode
    from graylane.v1 import audit_pb2, telemetry_pb2

    from_ms, to_ms = parse_time(args.from_), parse_time(args.to)

    async def load() -> tuple[list[Any], list[Any]]:
        factory = _factory()
        audits = await load_recorded(factory, args.model, args.rollout, from_ms, to_ms)
        telemetry = await read_range(factory, factory.layout.telemetry(), from_ms, to_ms)
        return audits, telemetry

    audits, records = asyncio.run(load())
    telemetry = [decode(telemetry_pb2.BatchTelemetry, r.value) for r in records]
    timeline = audit_pb2.AuditTimeline(
        model=args.model,
        rollout_id=args.rollout,
        from_unix_ms=from_ms,
        to_unix_ms=to_ms,
        decisions=audits,
        telemetry=telemetry_totals(args.model, telemetry),
    )

    def as_table() -> None:
        print_decisions(
            timeline.decisions,
            title=f"timeline of {args.rollout or args.model}",
            extra=decision_extra,
        )
        _print_telemetry(args.model, timeline.telemetry)

    names = "\n".join(r.decision_id for r in timeline.decisions)
    emit(args, "AuditTimeline", timeline, names, as_table)
    return 0


def decision_extra(record: audit_pb2.AuditRecord) -> str:
    """A decision's epoch, and which instance decided it in which ownership generation
    (a sharded policy engine: the generation in which it took the model's partition)."""
    parts = [f"epoch={record.epoch}" if record.epoch else ""]
    by = record.decided_by
    if by.generation:
        parts.append(f"by={by.instance} gen={by.generation} partition={by.partition}")
    return " ".join(p for p in parts if p)


def telemetry_totals(
    model: str, telemetry: Sequence[telemetry_pb2.BatchTelemetry]
) -> list[audit_pb2.TelemetryTotals]:
    """``model``'s batch telemetry summed per version and variant (sorted by them)."""
    from graylane.v1 import audit_pb2

    totals: dict[tuple[str, str], audit_pb2.TelemetryTotals] = {}
    for t in telemetry:
        if t.model != model:
            continue
        row = totals.get((t.version, t.variant))
        if row is None:
            row = totals[(t.version, t.variant)] = audit_pb2.TelemetryTotals(
                version=t.version, variant=t.variant
            )
        row.batches += 1
        row.requests += t.request_count
        row.errors += t.error_count
        row.compute_ms += t.compute_ms
    return [totals[key] for key in sorted(totals)]


def _print_telemetry(model: str, totals: Sequence[audit_pb2.TelemetryTotals]) -> None:
    from graylane.app.cli.views import table as _table

    _table(
        f"telemetry of {model} in the range",
        ("version", "variant", "batches", "requests", "errors", "error rate", "compute ms/batch"),
        [
            (
                t.version,
                t.variant,
                t.batches,
                t.requests,
                t.errors,
                f"{t.errors / t.requests:.2%}" if t.requests else "-",
                f"{t.compute_ms / t.batches:.1f}",
            )
            for t in totals
        ],
    )


def audit_verification(
    records: Sequence[audit_pb2.AuditRecord],
    mismatches: Sequence[Mismatch],
    *,
    model: str,
    rollout_id: str = "",
) -> audit_pb2.AuditVerification:
    """The ``AuditVerification`` of ``records`` replayed with ``mismatches`` found."""
    from graylane.v1 import audit_pb2

    return audit_pb2.AuditVerification(
        model=model,
        rollout_id=rollout_id,
        decisions=len(records),
        mismatches=[
            audit_pb2.ReplayMismatch(
                index=m.index,
                decision_id=records[m.index].decision_id,
                field=m.field,
                recorded=str(m.recorded),
                replayed=str(m.replayed),
            )
            for m in mismatches
        ],
    )


def _audit_verify(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import table as _table
    from graylane.policy_engine.audit_replay import load_recorded, verify

    from_ms, to_ms = parse_time(args.from_), parse_time(args.to)
    records = asyncio.run(load_recorded(_factory(), args.model, args.rollout, from_ms, to_ms))
    report = audit_verification(records, verify(records), model=args.model, rollout_id=args.rollout)
    report.from_unix_ms, report.to_unix_ms = from_ms, to_ms

    def as_table() -> None:
        if not report.mismatches:
            print(f"{report.decisions} recorded decision(s): the controllers decide the same today")
            return
        _table(
            "decisions that replay differently",
            ("#", "decision", "field", "recorded", "replayed"),
            [(m.index, m.decision_id, m.field, m.recorded, m.replayed) for m in report.mismatches],
        )

    names = "\n".join(dict.fromkeys(m.decision_id for m in report.mismatches))
    emit(args, "AuditVerification", report, names, as_table)
    return 1 if report.mismatches else 0


def _outputs_key(result: Any) -> bytes:
    """What must agree between two results of the same request: tokens/text or tensors."""
    if result.text or result.generated_token_ids:
        return repr((result.text, list(result.generated_token_ids))).encode()
    return b"".join(t.SerializeToString(deterministic=True) for t in result.outputs)


def traffic_report(
    sent: Sequence[str],
    replayed: Mapping[str, inference_pb2.InferenceResult],
    recorded: Mapping[str, inference_pb2.InferenceResult],
) -> audit_pb2.TrafficReplayReport:
    """The ``TrafficReplayReport`` of the requests ``sent`` (their recorded ids): each
    replayed answer compared with the recorded OK result of the same request."""
    from graylane.v1 import audit_pb2, inference_pb2

    report = audit_pb2.TrafficReplayReport(replayed=len(sent))
    for original in sent:
        got = replayed.get(original)
        if got is None or got.status != inference_pb2.OK:
            report.errors += 1
        elif original not in recorded:
            report.no_recorded_result += 1
        elif _outputs_key(got) == _outputs_key(recorded[original]):
            report.agree += 1
        else:
            report.differ += 1
            report.differing_request_ids.append(original)
    compared = report.agree + report.differ
    report.agreement = report.agree / compared if compared else 0.0
    return report


def _traffic_replay(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import table as _table

    report = asyncio.run(_replay_traffic(args))
    report.model, report.version = args.model, args.version
    report.from_unix_ms, report.to_unix_ms = parse_time(args.from_), parse_time(args.to)
    compared = report.agree + report.differ

    def as_table() -> None:
        _table(
            f"offline shadow of {args.model} {args.version}",
            ("replayed", "agree", "differ", "no recorded result", "errors / timeouts", "agreement"),
            [
                (
                    report.replayed,
                    report.agree,
                    report.differ,
                    report.no_recorded_result,
                    report.errors,
                    f"{report.agreement:.2%}" if compared else "-",
                )
            ],
        )

    emit(args, "TrafficReplayReport", report, "\n".join(report.differing_request_ids), as_table)
    return 0 if report.differ == 0 and report.errors == 0 else 1


async def _replay_traffic(args: argparse.Namespace) -> audit_pb2.TrafficReplayReport:
    from graylane.clock import now_ms
    from graylane.kafka.admin import ensure_topics
    from graylane.kafka.reading import FollowFrom, TopicFollower
    from graylane.serde import decode, encode, encode_key
    from graylane.v1 import inference_pb2

    factory = _factory()
    layout = factory.layout
    from_ms, to_ms = parse_time(args.from_), parse_time(args.to)
    requests = [
        decode(inference_pb2.InferenceRequest, r.value)
        for r in await read_range(factory, layout.ingress(args.model), from_ms, to_ms)
    ][: args.limit]
    # Results went to each request's reply topic (per-client SDK topics included).
    reply_topics = {req.reply_topic or layout.results(args.model) for req in requests}
    wanted = {req.request_id for req in requests}
    recorded: dict[str, Any] = {}
    for topic in sorted(reply_topics):
        for r in await read_range(factory, topic, from_ms, 0):
            res = decode(inference_pb2.InferenceResult, r.value)
            if res.request_id in wanted and not res.shadow and res.status == inference_pb2.OK:
                recorded.setdefault(res.request_id, res)
    client = f"replay-{uuid.uuid4().hex[:8]}"
    await ensure_topics(factory, [layout.reply_spec(client)])
    ids: dict[str, str] = {}
    replayed: dict[str, Any] = {}
    arrived = asyncio.Event()

    def on_reply(r: Any) -> None:
        res = decode(inference_pb2.InferenceResult, r.value)
        if res.request_id in ids:
            replayed[ids[res.request_id]] = res
            arrived.set()

    # Replayed copies are shadow traffic: their answers go to the shadow topic, and
    # their telemetry never counts as the version's live latency.
    replies = TopicFollower(
        factory,
        layout.shadow(args.model),
        on_reply,
        start_at=FollowFrom.BEGINNING,
        client_suffix="replay",
    )
    await replies.start()
    producer = factory.producer()
    await producer.start()
    try:
        for req in requests:
            copy = inference_pb2.InferenceRequest()
            copy.CopyFrom(req)
            copy.request_id = f"{req.request_id}~{client}"
            copy.reply_topic = layout.reply(client)
            copy.deadline_unix_ms = 0
            copy.shadow = True
            copy.mirror_result = False
            copy.shadow_pair_id = ""  # pairs no live answer, whatever was captured
            copy.created_at_unix_ms = copy.routed_at_unix_ms = now_ms()
            copy.routed_version = args.version
            ids[copy.request_id] = req.request_id
            await producer.send(
                layout.version_requests(args.model, args.version),
                value=encode(copy),
                key=encode_key(req.routing_key or None),
            )
        await producer.flush()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.timeout_s):
                while len(replayed) < len(ids):
                    arrived.clear()
                    await arrived.wait()
    finally:
        await producer.stop()
        await replies.stop()
    return traffic_report(list(ids.values()), replayed, recorded)
