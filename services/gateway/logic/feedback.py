"""Feedback on answers, pure: what a rating says, whose answer it is, whether it counts.

Room: ``logic/`` of the gateway (the memory it decides on is
:class:`~graylane.services.gateway.feedback.AnswerBook`).

- **The body.** ``POST /v1/feedback`` with ``{"id": RESPONSE_ID, "rating": "up" |
  "down"}`` or ``{"id": RESPONSE_ID, "score": 0..1}``. ``RESPONSE_ID`` is the ``id`` of
  an OpenAI answer (``chatcmpl-...``, ``cmpl-...``) or its ``x-request-id`` header.
  Thumbs up is the outcome 1, down 0; a score is its own outcome.
- **Whose answer.** A tenant rates only the answers its own keys were given; any other
  id is "not found", so a tenant learns nothing of another tenant's answers.
- **Once.** An answer is rated at most once: a second rating is refused (409) and the
  first one stands. The policy engine applies the same rule to what reaches it (the
  first outcome per answer counts), so the rule holds whichever replica took a rating.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "ID_PREFIXES",
    "AnswerOwner",
    "Feedback",
    "FeedbackInvalid",
    "FeedbackVerdict",
    "RatingKind",
    "judge_feedback",
    "parse_feedback",
    "request_id_of",
]

ID_PREFIXES = ("chatcmpl-", "cmpl-")
"""The prefixes of OpenAI answer ids; the rest is the request id."""

_MAX_ID = 128


class FeedbackInvalid(ValueError):
    """A feedback body that says nothing usable (answered 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RatingKind(Enum):
    THUMBS = "thumbs"
    SCORE = "score"


@dataclass(frozen=True, kw_only=True)
class Feedback:
    """One rating of one answer: the request id it names and its outcome in [0, 1]."""

    request_id: str
    value: float
    kind: RatingKind


def request_id_of(response_id: str) -> str:
    """The request id behind an answer id (the id itself when it has no known prefix)."""
    for prefix in ID_PREFIXES:
        if response_id.startswith(prefix):
            return response_id[len(prefix) :]
    return response_id


def parse_feedback(body: object) -> Feedback:
    """The rating a JSON body gives; raises :class:`FeedbackInvalid`."""
    if not isinstance(body, Mapping):
        raise FeedbackInvalid("the body is a JSON object with 'id' and 'rating' or 'score'")
    response_id = body.get("id")
    if not isinstance(response_id, str) or not response_id or len(response_id) > _MAX_ID:
        raise FeedbackInvalid(f"'id' is the answer's id, a string of 1..{_MAX_ID}", "id")
    request_id = request_id_of(response_id)
    if not request_id:
        raise FeedbackInvalid("'id' names no answer", "id")
    rating, score = body.get("rating"), body.get("score")
    if (rating is None) == (score is None):
        raise FeedbackInvalid("give either 'rating' (up or down) or 'score' (0 to 1)")
    if rating is not None:
        if rating not in ("up", "down"):
            raise FeedbackInvalid("'rating' is 'up' or 'down'", "rating")
        return Feedback(
            request_id=request_id, value=1.0 if rating == "up" else 0.0, kind=RatingKind.THUMBS
        )
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise FeedbackInvalid("'score' is a number from 0 to 1", "score")
    value = float(score)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise FeedbackInvalid("'score' is a number from 0 to 1", "score")
    return Feedback(request_id=request_id, value=value, kind=RatingKind.SCORE)


@dataclass(frozen=True, kw_only=True, slots=True)
class AnswerOwner:
    """What the gateway remembers of one answer it gave."""

    tenant: str
    model: str
    version: str
    rated: bool = False


class FeedbackVerdict(Enum):
    """Whether a rating is taken."""

    TAKEN = "taken"
    UNKNOWN = "unknown"
    """Not an answer of the caller's tenant that this gateway remembers (404)."""
    ALREADY_RATED = "already_rated"
    """Rated before: the first rating stands (409)."""


def judge_feedback(owner: AnswerOwner | None, tenant: str) -> FeedbackVerdict:
    """Whether ``tenant`` may rate the answer remembered as ``owner``."""
    if owner is None or owner.tenant != tenant:
        return FeedbackVerdict.UNKNOWN
    if owner.rated:
        return FeedbackVerdict.ALREADY_RATED
    return FeedbackVerdict.TAKEN
