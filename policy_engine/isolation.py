"""One bad record or one failing decision never stops the others (pure).

The streaming adapter and :class:`~graylane.policy_engine.core.PolicyCore` run
each input record, and each rollout's and QoS key's decision, through
:meth:`RecordGuard.run` / :meth:`RecordGuard.skip`: what raises becomes a
:class:`~graylane.policy_engine.messages.RecordSkipped` output (counted, and
audited at most once per source, key and reason per ``audit_interval_ms``)
and everything else goes on. A failing rollout keeps its state and is tried
again at the next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from graylane.policy_engine.messages import Output, RecordSkipped, RecordSource, SkipReason

__all__ = ["DEFAULT_AUDIT_INTERVAL_MS", "RecordGuard"]

log = logging.getLogger(__name__)

DEFAULT_AUDIT_INTERVAL_MS = 60_000
_MAX_DETAIL = 500
_MAX_KEY = 120

T = TypeVar("T")


@dataclass
class RecordGuard:
    """Turns failures into :class:`RecordSkipped` outputs; remembers what it audited."""

    audit_interval_ms: int = DEFAULT_AUDIT_INTERVAL_MS
    _audited: dict[tuple[RecordSource, str, SkipReason], int] = field(default_factory=dict)

    def skip(
        self,
        source: RecordSource,
        reason: SkipReason,
        detail: str,
        at_ms: int,
        *,
        key: str = "",
        model: str = "",
        version: str = "",
        rollout_id: str = "",
    ) -> RecordSkipped:
        """The output for a skipped input or decision (audited if not audited lately)."""
        key = key if len(key) <= _MAX_KEY else f"{key[:_MAX_KEY]}...({len(key)} chars)"
        slot = (source, key or model, reason)
        last = self._audited.get(slot)
        audited = last is None or at_ms - last >= self.audit_interval_ms
        if audited:
            self._audited[slot] = at_ms
        if len(detail) > _MAX_DETAIL:
            detail = f"{detail[:_MAX_DETAIL]}... ({len(detail)} chars)"
        log.warning(
            "skipped %s (%s) %s: %s", source.value, reason.value, key or model or "-", detail
        )
        return RecordSkipped(
            source=source,
            reason=reason,
            detail=detail,
            at_ms=at_ms,
            key=key,
            model=model,
            version=version,
            rollout_id=rollout_id,
            audited=audited,
        )

    def run(
        self,
        call: Callable[[], list[Output]],
        source: RecordSource,
        at_ms: int,
        *,
        model: str = "",
        version: str = "",
        rollout_id: str = "",
    ) -> list[Output]:
        """``call()``'s outputs; if it raises, one :class:`RecordSkipped` instead."""
        try:
            return call()
        except Exception as exc:
            log.exception("%s failed for %s %s", source.value, model or "-", version)
            return [
                self.skip(
                    source,
                    SkipReason.FAILED,
                    f"{type(exc).__name__}: {exc}",
                    at_ms,
                    model=model,
                    version=version,
                    rollout_id=rollout_id,
                )
            ]
