"""Rollout transitions to webhooks: fed by the audit sink, sent by the library's sender.

The policy engine decides and records; the control plane's audit sink copies each
record into SQL and hands the batch here; :class:`RolloutNotifier` turns the
transitions among them into deliveries for the webhooks of their rollout's spec and
offers them to the :class:`~graylane.notifications.sender.WebhookSender`, which never
blocks. So no receiver, however slow or down, delays a decision (the engine never
waits on this process) or the copy of the audit (offers do not wait).

A decision is notified once per process (decision ids are remembered), and a
decision older than ``max_age_ms`` when read (a control plane catching up on an old
audit) is not notified at all: a notification is news, not history. Undelivered
bodies go to ``<p>.dlq`` with the reason (service ``controlplane-notifier``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from graylane.clock import Clock, now_ms
from graylane.notifications.sender import WebhookDelivery, WebhookSender
from graylane.services.controlplane.wire import transition_of
from graylane.v1 import audit_pb2

__all__ = ["RolloutNotifier"]

log = logging.getLogger(__name__)


class RolloutNotifier:
    def __init__(
        self,
        sender: WebhookSender,
        *,
        clock: Clock = now_ms,
        max_age_ms: int = 600_000,
        remember: int = 4096,
    ) -> None:
        self.sender = sender
        self._clock = clock
        self._max_age_ms = max_age_ms
        self._remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.offered = 0
        self.stale = 0

    def on_audits(self, records: Sequence[audit_pb2.AuditRecord]) -> None:
        """Offer the transitions among ``records`` to their webhooks; never waits."""
        now = self._clock()
        for record in records:
            transition = transition_of(record)
            if transition is None or not transition.webhooks:
                continue
            if transition.decision_id in self._seen:
                continue
            self._seen[transition.decision_id] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
            if now - transition.at_ms > self._max_age_ms:
                self.stale += 1
                continue
            for target in transition.webhooks:
                self.offered += 1
                self.sender.offer(WebhookDelivery(transition, target))
