"""The router's protobuf in and out: ingress requests, routing table records, forwards.

Room: ``wire.py`` of the router, the only module of it that reads or writes protobuf.
A routing table record becomes a :class:`~graylane.routing.RouteTable`
(:func:`table_of`); an ingress request gives the facts the intake rules judge
(:func:`ingress_facts`) and the routing facts (:func:`routing_request`); a routed request
becomes its forwards, the shadow copy first (:func:`forwards`). May import the library
(serde, routing, topics) and the router's own logic; never its service.
"""

from __future__ import annotations

from graylane import schema_registry, serde
from graylane.clock import now_ms
from graylane.kafka.replies import FieldCaps, field_problem, reply_topic_rejection
from graylane.kafka.seam import Record
from graylane.routing.convert import table_from_pb
from graylane.routing.table import RouteDecision, RouteTable, RoutingRequest
from graylane.services.router.logic.intake import IngressFacts
from graylane.topics import TopicLayout
from graylane.v1 import control_pb2, inference_pb2

__all__ = [
    "decode_request",
    "forwards",
    "ingress_facts",
    "reset_router_fields",
    "routing_request",
    "table_of",
]


def decode_request(value: bytes | None) -> inference_pb2.InferenceRequest:
    """An ingress record's request (Confluent-framed or plain); SerdeError if unreadable."""
    return schema_registry.decode(inference_pb2.InferenceRequest, value)


def table_of(value: bytes) -> RouteTable:
    """A routing table record's table; raises on any record this build cannot read."""
    return table_from_pb(serde.decode(control_pb2.RoutingTable, value))


def ingress_facts(
    request: inference_pb2.InferenceRequest, record: Record, layout: TopicLayout, topic_model: str
) -> IngressFacts:
    """What the intake rules judge of a request (its model set to ``topic_model`` first
    when the one it names is too long to answer on)."""
    problem = field_problem(request)
    if problem is not None and len(request.model) > FieldCaps().model:
        request.model = topic_model  # reply on the topic's model results topic
    try:
        reply = reply_topic_rejection(layout, request)
    except ValueError:  # a model name no topic can carry: refused as not served first
        reply = None
    return IngressFacts(
        size_bytes=len(record.value or b""),
        model=request.model,
        topic_model=topic_model,
        field_problem=problem,
        reply_problem=reply,
        deadline_unix_ms=request.deadline_unix_ms,
    )


def routing_request(request: inference_pb2.InferenceRequest) -> RoutingRequest:
    return RoutingRequest(
        request.request_id, request.routing_key, dict(request.tags), request.pinned_version
    )


def forwards(
    request: inference_pb2.InferenceRequest,
    decision: RouteDecision,
    record: Record,
    layout: TopicLayout,
) -> list[tuple[str, bytes]]:
    """Stamp the routing fields on ``request``; (topic, bytes) of each forward: a shadow
    copy to the shadow version first (its answer goes to the shadow topic, paired by
    the record's place in the log), then the request to its version."""
    request.routed_version = decision.version
    request.routed_at_unix_ms = now_ms()
    request.routing_epoch = decision.epoch
    out: list[tuple[str, bytes]] = []
    if decision.shadow_version:
        copy = inference_pb2.InferenceRequest()
        copy.CopyFrom(request)
        copy.shadow = True
        copy.routed_version = decision.shadow_version
        copy.reply_topic = layout.shadow(request.model)
        copy.shadow_pair_id = request.shadow_pair_id = _pair_id(record)
        request.mirror_result = True
        out.append(
            (layout.version_requests(request.model, decision.shadow_version), serde.encode(copy))
        )
    out.append((layout.version_requests(request.model, decision.version), serde.encode(request)))
    return out


def _pair_id(record: Record) -> str:
    """The shadow pair id of an ingress record: its place in the log, the same on a re-route."""
    return f"{record.partition}-{record.offset}-{record.timestamp}"


def reset_router_fields(request: inference_pb2.InferenceRequest, record: Record) -> None:
    """Only the router sets these: a client cannot steer shadows, gates or latency."""
    request.shadow = False
    request.mirror_result = False
    request.routed_version = ""
    request.routed_at_unix_ms = 0
    request.routing_epoch = 0
    request.shadow_pair_id = ""
    request.created_at_unix_ms = record.timestamp if record.timestamp > 0 else now_ms()
