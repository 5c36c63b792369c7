"""The gateway's route table, and the front door that admits calls to it.

:data:`ROUTES` is the one list of the gateway's HTTP surface: each path and method, the
handler it reaches (:class:`Handler`) and, for a call that takes a key, the ``endpoint``
label its metrics carry (:class:`EndpointLabel`). The app mounts the table
(``service._build_app``); the front door (:class:`FrontDoor`) reads the same table to
identify and throttle every keyed call from its headers alone, before the app routes it
or reads its body. A route added to the table is behind the door by construction.

May import: starlette's ASGI types and responses, the gateway's failures and its tenants.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Protocol

from starlette.responses import JSONResponse, Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from graylane.services.gateway.failures import ApiError
from graylane.services.gateway.logic.admission import Tenant

__all__ = [
    "ADMITTED_AS",
    "ROUTES",
    "EndpointLabel",
    "FrontDoor",
    "Handler",
    "HttpRoute",
    "keyed_route",
    "unread_body",
]


class EndpointLabel(StrEnum):
    """The ``endpoint`` label of a keyed call's metrics (requests, latency)."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    FEEDBACK = "feedback"
    MODELS = "models"
    V2_METADATA = "v2_metadata"
    V2_READY = "v2_ready"
    V2_INFER = "v2_infer"


class Handler(Enum):
    """Which of the gateway's handlers a route reaches."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    MODELS = "models"
    MODEL = "model"
    FEEDBACK = "feedback"
    SERVER_METADATA = "server_metadata"
    LIVE = "live"
    READY_SERVER = "ready_server"
    METADATA = "metadata"
    READY = "ready"
    INFER = "infer"
    HEALTH = "health"
    VERSION = "version"
    HEALTHZ = "healthz"
    READYZ = "readyz"
    METRICS = "metrics"


@dataclass(frozen=True)
class HttpRoute:
    """One path and method of the gateway. ``label`` is set for the calls that take a key
    (every OpenAI and inference-protocol call but the probes) and is then their metrics'
    ``endpoint``; a route without one is open (probes, metrics)."""

    path: str
    method: str
    handler: Handler
    label: EndpointLabel | None = None
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex, _, _ = compile_path(self.path)  # the app's own matcher for the path
        object.__setattr__(self, "pattern", regex)

    @property
    def keyed(self) -> bool:
        return self.label is not None

    @property
    def openai(self) -> bool:
        """Whether its errors take OpenAI's body (else the inference protocol's)."""
        return self.path.startswith("/v1/")


ROUTES: tuple[HttpRoute, ...] = (
    HttpRoute("/v1/completions", "POST", Handler.COMPLETIONS, EndpointLabel.COMPLETIONS),
    HttpRoute("/v1/chat/completions", "POST", Handler.CHAT, EndpointLabel.CHAT),
    HttpRoute("/v1/models", "GET", Handler.MODELS, EndpointLabel.MODELS),
    HttpRoute("/v1/feedback", "POST", Handler.FEEDBACK, EndpointLabel.FEEDBACK),
    HttpRoute("/v1/models/{model}", "GET", Handler.MODEL, EndpointLabel.MODELS),
    HttpRoute("/v2", "GET", Handler.SERVER_METADATA),
    HttpRoute("/v2/health/live", "GET", Handler.LIVE),
    HttpRoute("/v2/health/ready", "GET", Handler.READY_SERVER),
    HttpRoute("/v2/models/{name}", "GET", Handler.METADATA, EndpointLabel.V2_METADATA),
    HttpRoute(
        "/v2/models/{name}/versions/{version}", "GET", Handler.METADATA, EndpointLabel.V2_METADATA
    ),
    HttpRoute("/v2/models/{name}/ready", "GET", Handler.READY, EndpointLabel.V2_READY),
    HttpRoute(
        "/v2/models/{name}/versions/{version}/ready", "GET", Handler.READY, EndpointLabel.V2_READY
    ),
    HttpRoute("/v2/models/{name}/infer", "POST", Handler.INFER, EndpointLabel.V2_INFER),
    HttpRoute(
        "/v2/models/{name}/versions/{version}/infer", "POST", Handler.INFER, EndpointLabel.V2_INFER
    ),
    HttpRoute("/health", "GET", Handler.HEALTH),
    HttpRoute("/version", "GET", Handler.VERSION),
    HttpRoute("/healthz", "GET", Handler.HEALTHZ),
    HttpRoute("/readyz", "GET", Handler.READYZ),
    HttpRoute("/metrics", "GET", Handler.METRICS),
)

_FIXED = {(r.method, r.path): r for r in ROUTES if r.keyed and "{" not in r.path}
_TEMPLATED = tuple(r for r in ROUTES if r.keyed and "{" in r.path)


def keyed_route(method: str, path: str) -> HttpRoute | None:
    """The keyed route a call of ``method path`` reaches, or None: the call is the app's
    to answer (a probe, or 404/405)."""
    fixed = _FIXED.get((method, path))
    if fixed is not None:
        return fixed
    for route in _TEMPLATED:
        if route.method == method and route.pattern.match(path):
            return route
    return None


ADMITTED_AS = "graylane_admitted_as"
"""Where the front door notes a call's tenant, in the ASGI scope's ``state``."""

_DOOR_HEADERS = frozenset((b"authorization", b"content-length", b"expect"))
"""What the front door reads of a call's headers (ASGI gives their names in lower case)."""


class Keeper(Protocol):
    """What the door asks of the gateway."""

    def admit_key(self, authorization: str | None) -> Tenant: ...

    async def drop_body(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None: ...

    def answered(self, endpoint: EndpointLabel, started: float, response: Response) -> Response: ...


class FrontDoor:
    """Each call to a keyed route is identified and throttled from its headers alone,
    before the app (routing, request objects, exception handlers, the body) sees it. A
    call refused here (401, 429 with ``Retry-After``) costs the replica a fraction of what
    the app would spend refusing it, so a storm of calls past a tenant's limit holds up
    the other tenants' calls as little as a single loop can. An admitted call goes on
    with its tenant noted in the scope's ``state`` (:data:`ADMITTED_AS`), for the
    handlers."""

    def __init__(self, app: ASGIApp, keeper: Keeper) -> None:
        self.app = app
        self.keeper = keeper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = keyed_route(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if route is None or route.label is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in _DOOR_HEADERS
        }
        try:
            tenant = self.keeper.admit_key(headers.get("authorization"))
        except ApiError as err:
            await self.keeper.drop_body(headers, unread_body(receive))
            body = err.openai_body() if route.openai else err.inference_protocol_body()
            response = JSONResponse(body, status_code=err.status, headers=err.headers())
            self.keeper.answered(route.label, started, response)
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[ADMITTED_AS] = tenant
        await self.app(scope, receive, send)


async def unread_body(receive: Receive) -> AsyncIterator[bytes]:
    """The body of a call nothing has read yet, from its ASGI ``receive`` (the door's: it
    answers before any request object exists)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
