"""Rollout notifications: which decisions notify, the signed CloudEvents and Slack
bodies, and the sender's order, retries, dead letters and bounded queues (over
httpx's mock transport: the HTTP seam)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from graylane.kafka.backoff import BackoffPolicy
from graylane.notifications.sender import SenderPolicy, WebhookDelivery, WebhookSender
from graylane.notifications.transitions import Transition, TransitionKind, transition_kind
from graylane.notifications.webhook import SIGNATURE_HEADER, body_of, cloudevent, sign, verify
from graylane.rollouts.spec import WebhookFormat, WebhookTarget
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule, Phase

FAST = SenderPolicy(attempts=3, backoff=BackoffPolicy(base_s=0.01, cap_s=0.02, jitter=0.0))


def transition(kind: TransitionKind = TransitionKind.STARTED, n: int = 0) -> Transition:
    return Transition(
        kind=kind,
        decision_id=f"d{n}",
        rollout_id="chat-1-1-0",
        model="chat",
        baseline="1.0.0",
        candidate="1.1.0",
        phase=Phase.PROGRESSING,
        step=1,
        steps=3,
        candidate_weight_percent=10.0,
        rule="started",
        reason="started canary",
        actor="alice",
        at_ms=1_700_000_000_000 + n,
    )


@pytest.mark.parametrize(
    ("kind", "rule", "phase", "expected"),
    [
        (DecisionKind.STARTED, DecisionRule.STARTED, Phase.PROGRESSING, TransitionKind.STARTED),
        (
            DecisionKind.ADVANCE,
            DecisionRule.ALL_GATES_PASSED,
            Phase.PROGRESSING,
            TransitionKind.STEP_ADVANCED,
        ),
        (DecisionKind.HOLD, DecisionRule.APPROVAL_PAUSE, Phase.PAUSED, TransitionKind.PAUSED),
        (
            DecisionKind.MANUAL,
            DecisionRule.MANUAL_RESUME,
            Phase.PROGRESSING,
            TransitionKind.RESUMED,
        ),
        (
            DecisionKind.HOLD,
            DecisionRule.APPROVAL_ELAPSED,
            Phase.PROGRESSING,
            TransitionKind.RESUMED,
        ),
        (
            DecisionKind.HOLD,
            DecisionRule.ERROR_RATE_SEQUENTIAL,
            Phase.PROGRESSING,
            TransitionKind.HELD,
        ),
        (
            DecisionKind.GATE_FAILED,
            DecisionRule.P99_RATIO,
            Phase.PROGRESSING,
            TransitionKind.GATE_FAILED,
        ),
        (
            DecisionKind.ROLLBACK,
            DecisionRule.ERROR_RATE,
            Phase.ROLLED_BACK,
            TransitionKind.ROLLED_BACK,
        ),
        (
            DecisionKind.PROMOTE,
            DecisionRule.ALL_GATES_PASSED,
            Phase.PROMOTED,
            TransitionKind.PROMOTED,
        ),
        (DecisionKind.MANUAL, DecisionRule.MANUAL_ABORT, Phase.ABORTED, TransitionKind.ABORTED),
        (DecisionKind.HOLD, DecisionRule.SPEC_UPDATED, Phase.PROGRESSING, TransitionKind.UPDATED),
        (DecisionKind.HOLD, DecisionRule.MIN_SAMPLES, Phase.PROGRESSING, None),
        (DecisionKind.HOLD, DecisionRule.MIN_DWELL, Phase.PROGRESSING, None),
        (DecisionKind.HOLD, DecisionRule.NO_DATA, Phase.PROGRESSING, None),
        (DecisionKind.HOLD, DecisionRule.PAUSED, Phase.PAUSED, None),
        (
            DecisionKind.HOLD,
            DecisionRule.METRIC_INCONCLUSIVE,
            Phase.PAUSED,
            TransitionKind.PAUSED,
        ),
        (
            DecisionKind.HOLD,
            DecisionRule.METRIC_INCONCLUSIVE,
            Phase.PROGRESSING,
            TransitionKind.HELD,
        ),
    ],
)
def test_which_decisions_are_transitions(
    kind: DecisionKind, rule: DecisionRule, phase: Phase, expected: TransitionKind | None
) -> None:
    assert transition_kind(kind, rule, phase) is expected


def test_bodies_are_cloudevents_and_slack_and_signed() -> None:
    t = transition()
    event = cloudevent(t)
    assert event["specversion"] == "1.0" and event["id"] == "d0"
    assert event["type"] == "io.graylane.rollout.started" and event["subject"] == "chat-1-1-0"
    assert event["time"].startswith("2023-11-14T22:13:20")
    slack = json.loads(body_of(t, WebhookFormat.SLACK))
    assert "chat 1.1.0 started" in slack["text"] and "by alice" in slack["text"]
    assert slack["blocks"][0]["type"] == "section"
    body = body_of(t, WebhookFormat.CLOUDEVENTS)
    assert verify(b"k", body, sign(b"k", body))
    assert not verify(b"other", body, sign(b"k", body))


class Receiver:
    """An httpx mock transport answering with scripted statuses, recording requests."""

    def __init__(self, statuses: list[int] | None = None, *, down: bool = False) -> None:
        self.statuses = list(statuses or [])
        self.down = down
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200)


async def test_deliveries_arrive_in_order_signed_and_retried(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    receiver = Receiver([503, 200, 200, 200])
    letters: list[str] = []

    async def dead(d: WebhookDelivery, body: bytes, reason: str) -> None:
        letters.append(reason)

    sender = WebhookSender(dead, FAST, transport=httpx.MockTransport(receiver))
    target = WebhookTarget("http://hooks.test/a", WebhookFormat.CLOUDEVENTS, str(secret))
    kinds = [TransitionKind.STARTED, TransitionKind.PAUSED, TransitionKind.RESUMED]
    for n, kind in enumerate(kinds):
        assert sender.offer(WebhookDelivery(transition(kind, n), target))
    while sender.delivered < 3:
        await asyncio.sleep(0.01)
    await sender.close()
    got = [json.loads(r.content)["type"].rsplit(".", 1)[1] for r in receiver.seen]
    assert got == ["started", "started", "paused", "resumed"]  # one retry after the 503
    assert all(verify(b"s3cret", r.content, r.headers[SIGNATURE_HEADER]) for r in receiver.seen)
    assert sender.retried == 1 and letters == []


async def test_a_receiver_that_is_down_is_dead_lettered_and_offers_never_wait() -> None:
    receiver = Receiver(down=True)
    letters: list[tuple[str, str]] = []

    async def dead(d: WebhookDelivery, body: bytes, reason: str) -> None:
        letters.append((d.transition.decision_id, reason))

    policy = SenderPolicy(
        attempts=3, queue_size=2, backoff=BackoffPolicy(base_s=0.05, cap_s=0.05, jitter=0.0)
    )
    sender = WebhookSender(dead, policy, transport=httpx.MockTransport(receiver))
    target = WebhookTarget("http://hooks.test/down")
    # Five offers, all at once: the first goes to the worker, two wait, two overflow.
    accepted = [sender.offer(WebhookDelivery(transition(n=n), target)) for n in range(5)]
    await asyncio.sleep(0)
    assert accepted.count(False) >= 1
    while sender.dead_lettered < 5:
        await asyncio.sleep(0.01)
    await sender.close()
    reasons = dict(letters)
    assert any("queue" in r and "full" in r for r in reasons.values())
    assert any("after 3 of 3 tries" in r for r in reasons.values())


async def test_a_client_error_is_final_and_an_unreadable_secret_never_sends(
    tmp_path: Path,
) -> None:
    receiver = Receiver([404])
    letters: list[str] = []

    async def dead(d: WebhookDelivery, body: bytes, reason: str) -> None:
        letters.append(reason)

    sender = WebhookSender(dead, FAST, transport=httpx.MockTransport(receiver))
    sender.offer(WebhookDelivery(transition(), WebhookTarget("http://hooks.test/gone")))
    missing = WebhookTarget("http://hooks.test/b", secret_file=str(tmp_path / "none"))
    sender.offer(WebhookDelivery(transition(n=1), missing))
    while sender.dead_lettered < 2:
        await asyncio.sleep(0.01)
    await sender.close()
    assert len(receiver.seen) == 1  # the 404 once; nothing sent to /b
    assert any("HTTP 404 after 1 of 3" in r for r in letters)
    assert any("secret file unreadable" in r for r in letters)


async def test_idle_webhooks_do_not_count_against_the_bound() -> None:
    receiver = Receiver()

    async def dead(d: WebhookDelivery, body: bytes, reason: str) -> None:
        raise AssertionError(reason)

    sender = WebhookSender(
        dead, SenderPolicy(max_targets=2), transport=httpx.MockTransport(receiver)
    )
    for n in range(6):  # six URLs over time, never more than one busy at once
        assert sender.offer(WebhookDelivery(transition(n=n), WebhookTarget(f"http://h.test/{n}")))
        while sender.delivered < n + 1:
            await asyncio.sleep(0.01)
    await sender.close()
    assert [r.url.path for r in receiver.seen] == [f"/{n}" for n in range(6)]
