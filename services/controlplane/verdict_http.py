"""The control plane's HTTP verdict endpoint (thin): what Argo Rollouts and Flagger call.

- ``GET /v1/verdict?model=M[&version=V][&max_age_s=S]``: the version's gate verdict in
  JSON, always 200 when the rollout is known (Argo's ``web`` metric provider reads
  ``result.verdict``: ``successCondition: result.verdict == 'pass'``,
  ``failureCondition: result.verdict == 'fail'``, anything else inconclusive).
- ``POST /v1/verdict``: a Flagger webhook. The body is Flagger's payload; its
  ``metadata`` names ``model`` (and ``version``). 200 only for ``pass``; 412 with the
  same JSON for ``fail`` or ``inconclusive``, which Flagger counts as a failed check.

Both need a control-plane bearer token of any role: ``Authorization: Bearer <token>``
(Argo: a header from a Secret), or, for Flagger, whose webhooks send no headers, the
``token`` metadata entry. 401 without a known token; 404 when the model has no rollout
for that version. The version defaults to the candidate of the model's newest rollout.
The verdict itself is :func:`~graylane.services.controlplane.logic.verdict.verdict_of`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from graylane.asgi_server import TlsFiles, listening_socket, serve_asgi
from graylane.clock import Clock, now_ms
from graylane.services.controlplane.auth import Principal, TokenTable
from graylane.services.controlplane.logic.verdict import RolloutVerdict, verdict_of
from graylane.services.controlplane.state import ControlStore, StoredRollout
from graylane.services.controlplane.wire import (
    ROLLOUT_DECISION_KINDS,
    verdict_facts,
    verdict_json,
)

__all__ = ["DEFAULT_MAX_AGE_S", "VerdictServer", "verdict_app"]

log = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S = 60.0
"""A newest decision older than this is inconclusive: the policy engine may be down."""
_NAME_LIMIT = 256


def _principal(tokens: TokenTable, request: Request, extra: str | None) -> Principal | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return tokens.lookup(token.strip())
    return tokens.lookup(extra) if extra else None


def _rollout_of(store: ControlStore, model: str, version: str) -> StoredRollout | None:
    """The newest rollout of ``model`` whose candidate is ``version`` ("" = any)."""
    for stored in store.list_rollouts(model, limit=50):
        if not version or stored.state.spec.candidate_version == version:
            return stored
    return None


def _answer(
    store: ControlStore, model: str, version: str, now: int, max_age_ms: int
) -> tuple[int, dict[str, object]]:
    stored = _rollout_of(store, model, version)
    if stored is None:
        return 404, {"error": f"no rollout of {model!r}" + (f" to {version!r}" if version else "")}
    newest = store.query_audit(
        rollout_id=stored.state.rollout_id,
        kinds=ROLLOUT_DECISION_KINDS,
        newest_first=True,
        limit=1,
    )
    facts = verdict_facts(
        stored, version or stored.state.spec.candidate_version, newest[0] if newest else None
    )
    if facts is None:
        return 500, {"error": "the rollout's phase is unknown to this build"}
    return 200, verdict_json(verdict_of(facts, now, max_age_ms))


def verdict_app(
    store: ControlStore,
    tokens: TokenTable,
    *,
    clock: Clock = now_ms,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> FastAPI:
    app = FastAPI(title="Graylane verdicts", docs_url=None, redoc_url=None, openapi_url=None)

    def bad(code: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=code)

    async def verdict(model: str, version: str, age_s: float) -> tuple[int, dict[str, object]]:
        return await asyncio.to_thread(_answer, store, model, version, clock(), int(age_s * 1000))

    @app.get("/v1/verdict")
    async def get_verdict(
        request: Request, model: str = "", version: str = "", max_age_s: float = max_age_s
    ) -> JSONResponse:
        if _principal(tokens, request, None) is None:
            return bad(401, "a control-plane bearer token is required")
        if not model or len(model) > _NAME_LIMIT or len(version) > _NAME_LIMIT:
            return bad(400, "model (and optionally version) are required, each at most 256 chars")
        if not 0 < max_age_s <= 86_400:
            return bad(400, "max_age_s must be in (0, 86400]")
        code, body = await verdict(model, version, max_age_s)
        return JSONResponse(body, status_code=code)

    @app.post("/v1/verdict")
    async def flagger_webhook(request: Request) -> JSONResponse:
        try:
            payload = await request.json()
        except ValueError:
            return bad(400, "the body is not JSON")
        meta = payload.get("metadata") if isinstance(payload, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        token = meta.get("token")
        if _principal(tokens, request, token if isinstance(token, str) else None) is None:
            return bad(401, "a control-plane bearer token is required (or metadata.token)")
        model, version = meta.get("model"), meta.get("version", "")
        if not isinstance(model, str) or not model or not isinstance(version, str):
            return bad(400, "metadata.model (and optionally metadata.version) are required")
        if len(model) > _NAME_LIMIT or len(version) > _NAME_LIMIT:
            return bad(400, "model and version are at most 256 chars")
        code, body = await verdict(model, version, max_age_s)
        if code == 200 and body.get("verdict") != RolloutVerdict.PASS.value:
            code = 412  # Flagger counts any answer but 2xx as a failed check
        return JSONResponse(body, status_code=code)

    return app


class VerdictServer:
    """Serves :func:`verdict_app` on ``host:port`` (0 = a free port) until stopped;
    TLS from the control plane's own PEM files when it has them."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        *,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._tls = TlsFiles(tls_cert, tls_key) if tls_cert and tls_key else None
        self.port = 0
        self.started = asyncio.Event()

    async def serve(self, stop: asyncio.Event) -> None:
        sock = listening_socket(self._host, self._port)
        self.port = int(sock.getsockname()[1])

        def started() -> None:
            self.started.set()
            scheme = "https" if self._tls else "http"
            log.info("verdicts on %s://%s:%d/v1/verdict", scheme, self._host, self.port)

        await serve_asgi(
            self._app, sock, stop, name="cp-verdict-http", on_started=started, tls=self._tls
        )
