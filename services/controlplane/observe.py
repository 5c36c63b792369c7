"""The control plane's observability: gRPC call metrics, the gRPC health service, audit metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from graylane.metrics import ControlPlaneMetrics

__all__ = ["HEALTH_SERVICES", "HealthServicer", "MetricsInterceptor", "add_health", "set_serving"]


class HealthServicer(Protocol):
    """The part of ``grpc_health``'s aio servicer we use."""

    async def set(self, service: str, status: int) -> None: ...


HEALTH_SERVICES = (
    "",  # the whole server
    "graylane.v1.ModelRegistry",
    "graylane.v1.Rollouts",
    "graylane.v1.Qos",
    "graylane.v1.Audit",
)


def add_health(server: aio.Server) -> HealthServicer:
    """The standard ``grpc.health.v1.Health`` service, NOT_SERVING until :func:`set_serving`."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    typed: HealthServicer = servicer
    return typed


async def set_serving(servicer: HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in HEALTH_SERVICES:
        await servicer.set(name, status)


def _code(context: aio.ServicerContext[Any, Any], failed: bool) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if failed else "OK"


class MetricsInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Counts every call by method and status code and times it (outermost interceptor)."""

    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._metrics = metrics

    def _done(self, method: str, code: str, started: float) -> None:
        self._metrics.rpcs.labels(method, code).inc()
        self._metrics.rpc_seconds.labels(method).observe(time.perf_counter() - started)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        deserializer, serializer = handler.request_deserializer, handler.response_serializer
        if handler.response_streaming:
            inner_stream = handler.unary_stream

            async def streaming(
                request: Any, context: aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                started, failed = time.perf_counter(), True
                try:
                    async for item in inner_stream(request, context):
                        yield item
                    failed = False
                finally:
                    self._done(method, _code(context, failed), started)

            return grpc.unary_stream_rpc_method_handler(streaming, deserializer, serializer)
        inner = handler.unary_unary

        async def unary(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            started, failed = time.perf_counter(), True
            try:
                response = await inner(request, context)
                failed = False
                return response
            finally:
                self._done(method, _code(context, failed), started)

        return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
