"""gRPC servicers: protobuf in, domain checks, store + command bus, protobuf out.

Thin on purpose: rules live in :mod:`graylane.services.controlplane.domain`,
persistence in :mod:`graylane.services.controlplane.store`, typed errors become
status codes in :mod:`graylane.services.controlplane.plane`. One module per
gRPC service; SQL calls run in a worker thread so the event loop keeps serving
Watch streams.
"""

from __future__ import annotations

from grpc import aio

from graylane.services.controlplane.candidates import CandidateCheck
from graylane.services.controlplane.plane import ControlPlane
from graylane.services.controlplane.qos_servicer import AuditServicer, QosServicer
from graylane.services.controlplane.registry_servicer import ModelRegistryServicer
from graylane.services.controlplane.rollouts_servicer import RolloutsServicer
from graylane.services.controlplane.routing_servicer import RoutingServicer
from graylane.v1 import controlplane_pb2_grpc

__all__ = ["ControlPlane", "add_servicers"]


def add_servicers(
    server: aio.Server, cp: ControlPlane, candidate_check: CandidateCheck | None = None
) -> None:
    controlplane_pb2_grpc.add_ModelRegistryServicer_to_server(ModelRegistryServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_RolloutsServicer_to_server(
        RolloutsServicer(cp, candidate_check), server
    )  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_QosServicer_to_server(QosServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_AuditServicer_to_server(AuditServicer(cp), server)  # type: ignore[no-untyped-call]
    controlplane_pb2_grpc.add_RoutingServicer_to_server(RoutingServicer(cp), server)  # type: ignore[no-untyped-call]
