"""The control plane's HTTP face for other delivery tools: a version's gate verdict as JSON.

``GET /v1/verdict/{model}/{version}`` answers ``{"verdict": "pass"|"fail"|"inconclusive",
...}`` (always HTTP 200): Argo Rollouts' ``web`` metric provider reads it with
``successCondition: result.verdict == 'pass'`` and ``failureCondition: result.verdict ==
'fail'`` (inconclusive is neither). ``POST /v1/flagger/gate`` takes a Flagger webhook
(``metadata.model`` and ``metadata.version``) and answers 200 only on ``pass``, 412
otherwise, with the same JSON: Flagger treats any other status as a failed check.
Both read the audit copy in the control plane's SQL; neither changes anything.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from graylane.rollouts.pb import decision_kind_from_pb, decision_rule_from_pb, phase_from_pb
from graylane.services.controlplane.logic.verdict import GateVerdict, VersionVerdict, verdict_of
from graylane.services.controlplane.state import ControlStore

__all__ = ["verdict_app", "version_verdict"]


def version_verdict(store: ControlStore, model: str, version: str) -> VersionVerdict:
    """The verdict of the newest rollout decision whose candidate is ``version``."""
    for record in store.query_audit(model=model, version=version, newest_first=True, limit=50):
        if not record.rollout_id or not record.HasField("rollout_after"):
            continue
        kind = decision_kind_from_pb(record.kind)
        if kind is None:
            continue
        return verdict_of(
            kind,
            decision_rule_from_pb(record.rule),
            phase_from_pb(record.rollout_after.phase),
            rollout_id=record.rollout_id,
            reason=record.reason,
            decided_at_ms=record.decided_at_unix_ms,
        )
    return verdict_of(None, None, None)


def _body(model: str, version: str, v: VersionVerdict) -> dict[str, Any]:
    return {
        "verdict": v.verdict.value,
        "model": model,
        "version": version,
        "rolloutId": v.rollout_id,
        "rule": v.rule,
        "reason": v.reason,
        "decidedAtMs": v.decided_at_ms,
    }


def verdict_app(store: ControlStore) -> FastAPI:
    app = FastAPI(title="graylane verdicts", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v1/verdict/{model}/{version}")
    async def verdict(model: str, version: str) -> dict[str, Any]:
        found = await asyncio.to_thread(version_verdict, store, model, version)
        return _body(model, version, found)

    @app.post("/v1/flagger/gate")
    async def flagger_gate(hook: dict[str, Any]) -> JSONResponse:
        given = hook.get("metadata")
        meta: dict[str, Any] = given if isinstance(given, dict) else {}
        model, version = str(meta.get("model", "")), str(meta.get("version", ""))
        if not model or not version:
            body = {"verdict": "inconclusive", "reason": "metadata.model and .version needed"}
            return JSONResponse(body, status_code=400)
        found = await asyncio.to_thread(version_verdict, store, model, version)
        status = 200 if found.verdict is GateVerdict.PASS else 412
        return JSONResponse(_body(model, version, found), status_code=status)

    return app
