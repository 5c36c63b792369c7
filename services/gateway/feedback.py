"""``POST /v1/feedback``: users rate the answers they were given; outcomes go to Kafka.

The feedback route of the gateway, beside the inference routes and on their keys: the
caller's key names its tenant (``Authorization: Bearer``, rate-limited like any call);
the body is parsed and judged by the pure rules of
:mod:`~graylane.services.gateway.logic.feedback`; a rating taken becomes an ``Outcome``
on ``<p>.outcomes`` (key = model), where the policy engine joins it to the A/B rollout
of that model by the version that served the answer.

:class:`AnswerBook` is what a replica remembers of the answers it gave (tenant, model,
version, rated yet?): the newest ``capacity`` answers, the oldest forgotten first, so
memory stays bounded however many calls pass (a few hundred bytes an answer). An answer
is rated at the replica that gave it; an id another replica gave, or one forgotten,
is "not found" (404) like another tenant's, so put the gateway behind session
affinity when it runs as several replicas and takes feedback.

Answers: 200 with the outcome recorded, 400 a body that says nothing usable, 401 no
valid key, 404 not an answer of this tenant remembered here, 409 rated before (the
first rating stands), 503 the outcome could not be written (nothing was recorded;
the rating may be sent again).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from graylane import serde
from graylane.errors import ErrorCode
from graylane.kafka.seam import ClientFactory, Producer
from graylane.metrics.dataplane import GatewayMetrics
from graylane.services.gateway.failures import ApiError
from graylane.services.gateway.front_door import EndpointLabel
from graylane.services.gateway.logic.admission import Tenant
from graylane.services.gateway.logic.feedback import (
    AnswerOwner,
    Feedback,
    FeedbackInvalid,
    FeedbackVerdict,
    RatingKind,
    judge_feedback,
    parse_feedback,
)
from graylane.v1 import outcome_pb2

__all__ = ["DEFAULT_REMEMBERED_ANSWERS", "AnswerBook", "FeedbackDesk", "outcome_pb"]

log = logging.getLogger(__name__)

DEFAULT_REMEMBERED_ANSWERS = 100_000
"""Answers a replica remembers for feedback (some tens of MB)."""

_KIND = {RatingKind.THUMBS: outcome_pb2.OUTCOME_THUMBS, RatingKind.SCORE: outcome_pb2.OUTCOME_SCORE}


class AnswerBook:
    """The newest ``capacity`` answers of this replica, by request id (oldest forgotten)."""

    def __init__(self, capacity: int = DEFAULT_REMEMBERED_ANSWERS) -> None:
        if capacity < 1:
            raise ValueError("an answer book remembers at least one answer")
        self.capacity = capacity
        self._answers: OrderedDict[str, AnswerOwner] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def answered(self, request_id: str, tenant: str, model: str, version: str) -> None:
        # Interned: the names repeat across answers and each is then held once.
        self._answers[request_id] = AnswerOwner(
            tenant=sys.intern(tenant), model=sys.intern(model), version=sys.intern(version)
        )
        self._answers.move_to_end(request_id)
        while len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def owner(self, request_id: str) -> AnswerOwner | None:
        return self._answers.get(request_id)

    def mark(self, request_id: str, *, rated: bool) -> None:
        owner = self._answers.get(request_id)
        if owner is not None:
            self._answers[request_id] = replace(owner, rated=rated)


def outcome_pb(feedback: Feedback, owner: AnswerOwner, *, rated_at_ms: int) -> outcome_pb2.Outcome:
    """The ``Outcome`` record of a rating taken."""
    return outcome_pb2.Outcome(
        request_id=feedback.request_id,
        model=owner.model,
        version=owner.version,
        tenant=owner.tenant,
        value=feedback.value,
        kind=_KIND[feedback.kind],
        rated_at_unix_ms=rated_at_ms,
    )


class FeedbackDesk:
    """Takes ratings for one replica: its answer book and the producer of its outcomes."""

    def __init__(
        self,
        factory: ClientFactory,
        metrics: GatewayMetrics,
        *,
        authorize: Callable[[Request], Tenant],
        read_json: Callable[[Request, Tenant], Awaitable[object]],
        unread: Callable[[Request], Awaitable[None]],
        client_id: str,
        capacity: int = DEFAULT_REMEMBERED_ANSWERS,
    ) -> None:
        self.factory = factory
        self.metrics = metrics
        self.book = AnswerBook(capacity)
        self._authorize = authorize
        self._read_json = read_json
        self._unread = unread
        self._client_id = client_id
        self._producer: Producer | None = None
        self._starting = asyncio.Lock()

    def answered(self, request_id: str, tenant: Tenant, model: str, version: str) -> None:
        """Remember an answer given (call it once the version that served is known)."""
        self.book.answered(request_id, tenant.name, model, version)

    async def _outcomes_producer(self) -> Producer:
        async with self._starting:
            if self._producer is None:
                producer = self.factory.producer(client_suffix=f"{self._client_id}-feedback")
                await producer.start()
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def take(self, request: Request) -> Response:
        """Answer one ``POST /v1/feedback``."""
        try:
            body = await self._rate(request)
        except ApiError as err:
            # Refused before its body was read (a key past its rate): drop the rest of the
            # body first, so a caller still sending reads the answer, not a reset.
            await self._unread(request)
            self.metrics.requests.labels(EndpointLabel.FEEDBACK, str(err.status)).inc()
            return JSONResponse(err.openai_body(), status_code=err.status, headers=err.headers())
        self.metrics.requests.labels(EndpointLabel.FEEDBACK, "200").inc()
        return JSONResponse(body)

    async def _rate(self, request: Request) -> dict[str, object]:
        tenant = self._authorize(request)
        try:
            feedback = parse_feedback(await self._read_json(request, tenant))
        except FeedbackInvalid as exc:
            raise ApiError.invalid(str(exc), exc.param) from None
        owner = self.book.owner(feedback.request_id)
        verdict = judge_feedback(owner, tenant.name)
        if verdict is FeedbackVerdict.UNKNOWN or owner is None:
            raise ApiError(
                ErrorCode.NOT_FOUND,
                f"no answer {feedback.request_id!r} of yours is known to this gateway",
                openai_code="answer_not_found",
                param="id",
            )
        if verdict is FeedbackVerdict.ALREADY_RATED:
            raise ApiError(
                ErrorCode.ALREADY_EXISTS,
                f"the answer {feedback.request_id!r} was rated before; the first rating stands",
                openai_code="already_rated",
                param="id",
            )
        # Reserved before the write, so a rating sent twice at once is taken once.
        self.book.mark(feedback.request_id, rated=True)
        record = outcome_pb(feedback, owner, rated_at_ms=int(time.time() * 1000))
        try:
            producer = await self._outcomes_producer()
            await producer.send_and_wait(
                self.factory.layout.outcomes(),
                serde.encode(record),
                key=owner.model.encode("utf-8"),
            )
        except Exception as exc:
            self.book.mark(feedback.request_id, rated=False)
            log.warning("an outcome of %s was not written: %s", owner.model, exc)
            raise ApiError.overloaded(f"the rating could not be recorded: {exc}", 1) from None
        return {
            "id": feedback.request_id,
            "object": "feedback",
            "model": owner.model,
            "version": owner.version,
            "value": feedback.value,
        }
