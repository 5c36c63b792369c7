"""The state a worker owns: the variant it serves, and the cancels it remembers.

Room: ``state.py`` of the worker. :class:`ActiveVariant` is the variant the QoS ladder
chose for this model version and the epoch of the command that chose it (a command
with an older or equal epoch changes nothing); :class:`CancelBook` remembers, for a while and
bounded, cancels of requests not running here yet, each under its :class:`CancelKey` (the
request id *and* the reply topic that asked: a cancel naming another topic is another
cancel, never one that replaces it). Changed only through their methods; times are given by
the caller. No I/O: the service applies the control records to them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["ActiveVariant", "CancelBook", "CancelKey"]


@dataclass(frozen=True)
class CancelKey:
    """Which generation a cancel stops: the request id, the reply topic that asked for it
    and the request's cancel token. Only the requester's own topic and token match, so a
    cancel naming another topic or token (forged or mistaken) neither stops nor displaces
    the requester's generation or cancel."""

    request_id: str
    reply_topic: str
    token: str = ""
    """The request's ``cancel_token`` (empty: it set none, and only a cancel without one
    matches)."""


@dataclass
class ActiveVariant:
    """The variant this worker serves, and the epoch of the precision command behind it."""

    variant: str
    epoch: int = 0

    def newer(self, epoch: int) -> bool:
        """Whether a command of ``epoch`` outranks the one applied."""
        return epoch > self.epoch

    def take(self, epoch: int, variant: str) -> bool:
        """Apply a command of ``epoch`` naming ``variant``; whether it was newer."""
        if not self.newer(epoch):
            return False
        self.epoch, self.variant = epoch, variant
        return True


class CancelBook:
    """Cancels for requests not (yet) running here, remembered for a while (bounded)."""

    def __init__(self, *, keep_s: float = 300.0, capacity: int = 4096) -> None:
        self._keep_s = keep_s
        self._capacity = capacity
        self._seen: OrderedDict[CancelKey, float] = OrderedDict()

    def note(self, key: CancelKey, at_s: float) -> None:
        self._seen.pop(key, None)
        self._seen[key] = at_s
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)

    def cancelled(self, key: CancelKey, at_s: float) -> bool:
        """Whether a cancel from the owner of ``key.reply_topic`` named this request lately."""
        while self._seen:
            oldest = next(iter(self._seen.values()))
            if at_s - oldest <= self._keep_s:
                break
            self._seen.popitem(last=False)
        return key in self._seen
