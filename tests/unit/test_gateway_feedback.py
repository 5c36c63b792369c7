"""``POST /v1/feedback`` at the edge, in process (no broker): the rules on the body, the
tenant and the one rating per answer, and the bounded answer book. That a rating taken
reaches the outcomes topic is a broker test (tests/integration/test_feedback_ab.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from graylane.kafka.seam import KafkaFactory
from graylane.services.gateway.feedback import AnswerBook, outcome_pb
from graylane.services.gateway.logic.admission import CallerRole, KeyRing, Tenant, parse_api_keys
from graylane.services.gateway.logic.feedback import (
    AnswerOwner,
    FeedbackInvalid,
    FeedbackVerdict,
    RatingKind,
    judge_feedback,
    parse_feedback,
)
from graylane.services.gateway.service import Gateway, GatewayConfig
from graylane.v1 import outcome_pb2

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef0"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def gateway(factory: KafkaFactory) -> Gateway:
    keys = KeyRing(parse_api_keys(f"{ALICE}:infer:alice,{BOB}:infer:bob"))
    return Gateway(factory, GatewayConfig(metrics_port=-1, remembered_answers=3), keys)


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


def _alice() -> Tenant:
    return Tenant("alice", CallerRole.INFER)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"rating": "up"}, "id"),
        ({"id": "", "rating": "up"}, "id"),
        ({"id": "chatcmpl-", "rating": "up"}, "id"),
        ({"id": "x" * 200, "rating": "up"}, "id"),
        ({"id": "a"}, None),
        ({"id": "a", "rating": "up", "score": 1}, None),
        ({"id": "a", "rating": "meh"}, "rating"),
        ({"id": "a", "score": 1.5}, "score"),
        ({"id": "a", "score": True}, "score"),
        ({"id": "a", "score": "0.5"}, "score"),
        (["a", "up"], None),
    ],
)
def test_a_body_that_says_nothing_usable_is_refused(body: object, param: str | None) -> None:
    with pytest.raises(FeedbackInvalid) as refused:
        parse_feedback(body)
    assert refused.value.param == param


def test_thumbs_and_scores_become_outcomes_of_the_request_id() -> None:
    up = parse_feedback({"id": "chatcmpl-abc", "rating": "up"})
    down = parse_feedback({"id": "cmpl-abc", "rating": "down"})
    score = parse_feedback({"id": "abc", "score": 0.25})
    assert (up.request_id, up.value, up.kind) == ("abc", 1.0, RatingKind.THUMBS)
    assert (down.request_id, down.value) == ("abc", 0.0)
    assert (score.request_id, score.value, score.kind) == ("abc", 0.25, RatingKind.SCORE)
    record = outcome_pb(up, AnswerOwner(tenant="t", model="m", version="v2"), rated_at_ms=5)
    assert (record.model, record.version, record.tenant, record.value) == ("m", "v2", "t", 1.0)
    assert record.kind == outcome_pb2.OUTCOME_THUMBS


def test_only_the_tenant_that_was_answered_rates_and_only_once() -> None:
    owner = AnswerOwner(tenant="alice", model="m", version="v1")
    assert judge_feedback(owner, "alice") is FeedbackVerdict.TAKEN
    assert judge_feedback(owner, "bob") is FeedbackVerdict.UNKNOWN
    assert judge_feedback(None, "alice") is FeedbackVerdict.UNKNOWN
    rated = AnswerOwner(tenant="alice", model="m", version="v1", rated=True)
    assert judge_feedback(rated, "alice") is FeedbackVerdict.ALREADY_RATED


def test_the_answer_book_is_bounded_and_forgets_the_oldest() -> None:
    book = AnswerBook(capacity=2)
    for rid in ("a", "b", "c"):
        book.answered(rid, "alice", "m", "v1")
    assert len(book) == 2 and book.owner("a") is None and book.owner("c") is not None
    book.mark("b", rated=True)
    owner = book.owner("b")
    assert owner is not None and owner.rated
    with pytest.raises(ValueError):
        AnswerBook(capacity=0)


async def test_the_route_answers_401_400_404_and_409(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    gateway.feedback.answered("r-alice", _alice(), "m", "v1")
    vote = {"id": "chatcmpl-r-alice", "rating": "up"}
    assert (await http.post("/v1/feedback", json=vote)).status_code == 401
    bad = await http.post("/v1/feedback", json={"id": "r-alice"}, headers=_auth(ALICE))
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    # Bob cannot rate Alice's answer: to him it does not exist.
    other = await http.post("/v1/feedback", json=vote, headers=_auth(BOB))
    assert other.status_code == 404 and other.json()["error"]["code"] == "answer_not_found"
    unknown = await http.post(
        "/v1/feedback", json={"id": "nope", "rating": "up"}, headers=_auth(ALICE)
    )
    assert unknown.status_code == 404
    gateway.feedback.book.mark("r-alice", rated=True)
    again = await http.post("/v1/feedback", json=vote, headers=_auth(ALICE))
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_rated"
    owner = gateway.feedback.book.owner("r-alice")
    assert owner is not None and owner.tenant == "alice"
