"""Webhook bodies of a transition, and their signature (pure).

Two bodies: a CloudEvents 1.0 JSON event (structured mode: ``specversion``, ``id`` =
the decision id, ``source``, ``type`` = ``io.graylane.rollout.<kind>``, ``time``,
``subject`` = the rollout id, ``data``), and a Slack-compatible message (``text`` plus
one section block) that a Slack incoming webhook, Mattermost or Rocket.Chat takes
as it is.

Every delivery is signed: ``X-Graylane-Signature: sha256=<hex>``, the HMAC-SHA256 of
the exact body bytes under the webhook's secret, as GitHub signs its webhooks; a
receiver recomputes it over the raw body and compares in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

from graylane.notifications.transitions import Transition, TransitionKind
from graylane.rollouts.spec import WebhookFormat

__all__ = [
    "EVENT_ID_HEADER",
    "SIGNATURE_HEADER",
    "body_of",
    "cloudevent",
    "sign",
    "slack_message",
    "verify",
]

SIGNATURE_HEADER = "X-Graylane-Signature"
EVENT_ID_HEADER = "X-Graylane-Event-Id"

_ICONS = {
    TransitionKind.STARTED: ":rocket:",
    TransitionKind.STEP_ADVANCED: ":arrow_up:",
    TransitionKind.PAUSED: ":double_vertical_bar:",
    TransitionKind.RESUMED: ":arrow_forward:",
    TransitionKind.HELD: ":hand:",
    TransitionKind.GATE_FAILED: ":warning:",
    TransitionKind.ROLLED_BACK: ":rewind:",
    TransitionKind.PROMOTED: ":white_check_mark:",
    TransitionKind.BAKED: ":bread:",
    TransitionKind.ROLLED_BACK_IN_BAKE: ":rewind:",
    TransitionKind.ABORTED: ":x:",
    TransitionKind.UPDATED: ":pencil2:",
}


def _data(t: Transition) -> dict[str, Any]:
    return {
        "transition": t.kind.value,
        "rolloutId": t.rollout_id,
        "model": t.model,
        "baseline": t.baseline,
        "candidate": t.candidate,
        "phase": t.phase.value,
        "step": t.step,
        "steps": t.steps,
        "candidateWeightPercent": t.candidate_weight_percent,
        "rule": t.rule,
        "reason": t.reason,
        "actor": t.actor,
        "decidedAtMs": t.at_ms,
        "documentDigest": t.document_digest,
    }


def cloudevent(t: Transition) -> dict[str, Any]:
    """The CloudEvents 1.0 structured JSON event of ``t``."""
    return {
        "specversion": "1.0",
        "id": t.decision_id,
        "source": f"/graylane/rollouts/{t.model}",
        "type": f"io.graylane.rollout.{t.kind.value}",
        "subject": t.rollout_id,
        "time": datetime.fromtimestamp(t.at_ms / 1000, tz=UTC).isoformat(timespec="milliseconds"),
        "datacontenttype": "application/json",
        "data": _data(t),
    }


def slack_message(t: Transition) -> dict[str, Any]:
    """A Slack incoming-webhook message of ``t`` (``text`` for clients without blocks)."""
    what = t.kind.value.replace("_", " ")
    head = (
        f"{_ICONS[t.kind]} {t.model} {t.candidate} {what}: step {t.step}/{t.steps}, "
        f"{t.candidate_weight_percent:g}% (rollout {t.rollout_id})"
    )
    by = f" by {t.actor}" if t.actor and t.actor != "policy-engine" else ""
    return {
        "text": f"{head}{by}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{head}*{by}\n{t.reason}"}},
        ],
        "graylane": _data(t),
    }


def body_of(t: Transition, form: WebhookFormat) -> bytes:
    """The exact bytes posted (and signed) for ``t`` in ``form``."""
    doc = slack_message(t) if form is WebhookFormat.SLACK else cloudevent(t)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str) -> bool:
    """Whether ``header`` signs ``body`` under ``secret`` (constant-time compare)."""
    return hmac.compare_digest(sign(secret, body), header)
