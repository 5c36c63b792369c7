"""``graylane audit replay|verify`` and ``graylane traffic replay``: straight from Kafka.

These read topics by timestamp (``offsets_for_times``) and need no control plane:
an auditor can rebuild a rollout's timeline from ``<p>.audit`` and ``<p>.telemetry``,
re-run the pure controllers over the recorded inputs, or re-send a window of
recorded requests to another version and compare the outputs (an offline shadow).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from graylane.app.cli.views import parse_time

__all__ = ["read_range", "register_audit", "register_traffic"]


def register_audit(
    audit_sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_range: Callable[..., None],
) -> None:
    replay = audit_sub.add_parser(
        "replay", help="a rollout's timeline from <p>.audit and <p>.telemetry (reads Kafka)"
    )
    add_range(replay, required=True)
    replay.set_defaults(handler=_audit_replay)
    verify = audit_sub.add_parser(
        "verify", help="re-run the controllers over recorded inputs and list differences"
    )
    add_range(verify, required=True)
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

    from_ms, to_ms = parse_time(args.from_), parse_time(args.to)

    async def load() -> tuple[list[Any], list[Any]]:
        factory = _factory()
        audits = await load_recorded(factory, args.model, args.rollout, from_ms, to_ms)
        telemetry = await read_range(factory, factory.layout.telemetry(), from_ms, to_ms)
        return audits, telemetry

    audits, telemetry = asyncio.run(load())
    print_decisions(
        audits,
        title=f"timeline of {args.rollout or args.model}",
        extra=lambda r: f"epoch={r.epoch}" if r.epoch else "",
    )
    _print_telemetry(args.model, telemetry)
    return 0


def _print_telemetry(model: str, records: list[Any]) -> None:
    from graylane.app.cli.views import table as _table
    from graylane.serde import decode
    from graylane.v1 import telemetry_pb2

    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for r in records:
        t = decode(telemetry_pb2.BatchTelemetry, r.value)
        if t.model != model:
            continue
        row = totals[(t.version, t.variant)]
        row[0] += 1
        row[1] += t.request_count
        row[2] += t.error_count
        row[3] += t.compute_ms
    _table(
        f"telemetry of {model} in the range",
        ("version", "variant", "batches", "requests", "errors", "error rate", "compute ms/batch"),
        [
            (v, var, int(b), int(n), int(e), f"{e / n:.2%}" if n else "-", f"{c / b:.1f}")
            for (v, var), (b, n, e, c) in sorted(totals.items())
        ],
    )


def _audit_verify(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import table as _table
    from graylane.policy_engine.audit_replay import load_recorded, verify

    from_ms, to_ms = parse_time(args.from_), parse_time(args.to)
    records = asyncio.run(load_recorded(_factory(), args.model, args.rollout, from_ms, to_ms))
    mismatches = verify(records)
    if not mismatches:
        print(f"{len(records)} recorded decision(s): the controllers decide the same today")
        return 0
    _table(
        "decisions that replay differently",
        ("#", "decision", "field", "recorded", "replayed"),
        [
            (m.index, records[m.index].decision_id, m.field, m.recorded, m.replayed)
            for m in mismatches
        ],
    )
    return 1


def _outputs_key(result: Any) -> bytes:
    """What must agree between two results of the same request: tokens/text or tensors."""
    if result.text or result.generated_token_ids:
        return repr((result.text, list(result.generated_token_ids))).encode()
    return b"".join(t.SerializeToString(deterministic=True) for t in result.outputs)


def _traffic_replay(args: argparse.Namespace) -> int:
    from graylane.app.cli.views import table as _table

    agree, differ, missing, errors = asyncio.run(_replay_traffic(args))
    total = agree + differ
    _table(
        f"offline shadow of {args.model} {args.version}",
        ("replayed", "agree", "differ", "no recorded result", "errors / timeouts", "agreement"),
        [
            (
                total + missing + errors,
                agree,
                differ,
                missing,
                errors,
                f"{agree / total:.2%}" if total else "-",
            )
        ],
    )
    return 0 if differ == 0 and errors == 0 else 1


async def _replay_traffic(args: argparse.Namespace) -> tuple[int, int, int, int]:
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
    agree = differ = missing = errors = 0
    for original in ids.values():
        got = replayed.get(original)
        if got is None or got.status != inference_pb2.OK:
            errors += 1
        elif original not in recorded:
            missing += 1
        elif _outputs_key(got) == _outputs_key(recorded[original]):
            agree += 1
        else:
            differ += 1
    return agree, differ, missing, errors
