"""The reply-topic allowlist of the topic layout (issue 10, item 1)."""

from __future__ import annotations

import pytest

from graylane.kafka.replies import reply_topic_rejection
from graylane.topics import ReplyTopicRefused, ReplyTopicVerdict, TopicLayout
from graylane.v1 import inference_pb2

L = TopicLayout(prefix="acme.gl")
V = ReplyTopicVerdict


@pytest.mark.parametrize(
    ("topic", "verdict"),
    [
        ("acme.gl.reply.client-1", V.REPLY),
        ("acme.gl.results.gpt", V.RESULTS),
        ("acme.gl.results.bert", V.OTHER_MODEL),
        ("acme.gl.control.rollouts", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.control.routing", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.control.precision", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.control.commands", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.audit", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.dlq", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.telemetry", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.requests.gpt", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.requests.gpt.v1", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.shadow.gpt", V.NOT_A_REPLY_TOPIC),
        ("acme.gl.reply", V.MALFORMED),
        ("acme.gl.reply.", V.MALFORMED),
        ("acme.gl.reply.a.b", V.MALFORMED),
        ("acme.gl.results.gpt.v1", V.MALFORMED),
        ("acme.gl.reply." + "x" * 101, V.MALFORMED),
        ("acme.gl.reply.a b", V.MALFORMED),
        ("graylane.reply.client-1", V.OTHER_PREFIX),
        ("acme.glx.reply.c", V.OTHER_PREFIX),
        ("__consumer_offsets", V.OTHER_PREFIX),
        ("", V.OTHER_PREFIX),
    ],
)
def test_verdicts(topic: str, verdict: ReplyTopicVerdict) -> None:
    assert L.check_reply_topic(topic, "gpt") is verdict
    assert L.reply_topic_allowed(topic, "gpt") is (verdict in (V.REPLY, V.RESULTS))


def test_every_topic_a_service_writes_is_refused_except_reply_and_own_results() -> None:
    shared = [s.name for s in L.shared_specs()]
    model = [s.name for s in L.model_specs("gpt", ["v1"])]
    allowed = {t for t in shared + model if L.reply_topic_allowed(t, "gpt")}
    assert allowed == {L.results("gpt")}
    assert L.reply_topic_allowed(L.reply("c1"), "gpt")


def test_reply_topic_for_defaults_and_refuses() -> None:
    assert L.reply_topic_for("", "gpt") == "acme.gl.results.gpt"
    assert L.reply_topic_for("acme.gl.reply.me", "gpt") == "acme.gl.reply.me"
    with pytest.raises(ReplyTopicRefused) as caught:
        L.reply_topic_for("acme.gl.control.rollouts", "gpt")
    assert caught.value.verdict is V.NOT_A_REPLY_TOPIC
    assert "acme.gl.control.rollouts" in str(caught.value)


def test_a_huge_refused_name_is_not_echoed_whole() -> None:
    with pytest.raises(ReplyTopicRefused) as caught:
        L.reply_topic_for("x" * 100_000, "gpt")
    assert len(str(caught.value)) < 200


def test_shadow_copies_answer_on_the_shadow_topic_only() -> None:
    assert L.reply_topic_for("acme.gl.shadow.gpt", "gpt", shadow=True) == "acme.gl.shadow.gpt"
    assert L.reply_topic_for("", "gpt", shadow=True) == "acme.gl.shadow.gpt"
    assert L.reply_topic_for("acme.gl.reply.me", "gpt", shadow=True) == "acme.gl.shadow.gpt"
    # Another model's shadow topic, or a control topic, is still refused.
    for bad in ("acme.gl.shadow.bert", "acme.gl.control.routing"):
        with pytest.raises(ReplyTopicRefused):
            L.reply_topic_for(bad, "gpt", shadow=True)


def test_rejection_carries_bad_reply_topic() -> None:
    bad = inference_pb2.InferenceRequest(request_id="r", model="gpt", reply_topic="acme.gl.audit")
    rejection = reply_topic_rejection(L, bad)
    assert rejection is not None and rejection.code == inference_pb2.BAD_REPLY_TOPIC
    good = inference_pb2.InferenceRequest(request_id="r", model="gpt")
    assert reply_topic_rejection(L, good) is None
