"""Crash-only background tasks: a follower that dies ends its service.

A service's background task (a table follower, a precision follower, an audit
sink) that dies with an exception must not leave the service running on stale
state. :class:`BackgroundTasks` starts such tasks, notes the first death in
:attr:`~BackgroundTasks.failed`, and :meth:`~BackgroundTasks.raise_if_failed`
turns it into :class:`BackgroundTaskDied`, so ``run()`` raises and the process
exits non-zero with the reason; its supervisor then restarts it.

A task that returns normally, or is cancelled, is not a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from graylane.errors import GraylaneError

__all__ = ["BackgroundTaskDied", "BackgroundTasks"]

log = logging.getLogger(__name__)

_CANCEL_ROUND_S = 1.0


class BackgroundTaskDied(GraylaneError):
    """A background task ended with an exception; the service must end too."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"background task {name!r} died: {type(cause).__name__}: {cause}")
        self.name = name
        self.cause = cause


class BackgroundTasks:
    """The background tasks of one service; the first one that dies is remembered.

    :meth:`abort` records any other fatal reason the same way (a worker whose
    engine cannot recover), so the service loop has one condition to watch.
    """

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []
        self._failure: BaseException | None = None
        self.failed = asyncio.Event()
        """Set when a task died with an exception."""

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_done)
        self._tasks.append(task)
        return task

    @property
    def healthy(self) -> bool:
        """No task has died (a loop condition: ``while not stop.is_set() and tasks.healthy``)."""
        return self._failure is None

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def abort(self, reason: BaseException) -> None:
        """End the service with ``reason`` (raised by :meth:`raise_if_failed`), if none yet."""
        if self._failure is None:
            self._failure = reason
            self.failed.set()

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or self._failure is not None:
            return
        died = BackgroundTaskDied(task.get_name(), exc)
        died.__cause__ = exc
        log.critical("%s; the service stops (crash-only)", died)
        self.abort(died)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def wait(self, stop: asyncio.Event) -> None:
        """Return when ``stop`` is set; raise :class:`BackgroundTaskDied` if a task dies first."""
        stopping = asyncio.create_task(stop.wait())
        failing = asyncio.create_task(self.failed.wait())
        try:
            await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stopping, failing):
                task.cancel()
        self.raise_if_failed()

    async def close(self) -> None:
        """Cancel the tasks still running and wait for all of them (never raises)."""
        pending = {task for task in self._tasks if not task.done()}
        while pending:
            # Cancel again until they end: a client may swallow one cancellation
            # (``asyncio.wait_for`` racing its own timeout on Python 3.11).
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_CANCEL_ROUND_S)
        self._tasks.clear()
