"""Warm standby: a worker that loaded and warmed its engines but waits out of its group.

A supervisor keeps one such process per scaled version (``--warm-standby``), so a
scale-out is a signal (:data:`ACTIVATE`: join the consumer group and serve), not a
process start, an engine load and a warm-up competing for the CPU with the overloaded
workers at the worst moment. Until then it holds no partitions, reads nothing and is
not ready (``/readyz``). Its warm-up runs at the lowest CPU priority
(:func:`run_at_low_priority`: a thread of its own, niced, that ends with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ACTIVATE", "run_at_low_priority", "wait_for_activation"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ACTIVATE = signal.SIGUSR1
"""The signal that makes a standby worker join its group."""


async def wait_for_activation(stop: asyncio.Event, what: str) -> bool:
    """Wait for :data:`ACTIVATE` (True) or ``stop`` (False); ``what`` names the worker."""
    loop = asyncio.get_running_loop()
    activated = asyncio.Event()
    loop.add_signal_handler(ACTIVATE, activated.set)
    log.info("%s on warm standby: engines warmed, joins its group on SIGUSR1", what)
    waits = [asyncio.ensure_future(activated.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        loop.remove_signal_handler(ACTIVATE)
    if stop.is_set():
        return False
    log.info("%s activated: joining its group", what)
    return True


async def run_at_low_priority(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own at nice 19 (where the OS allows), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting task
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    threading.Thread(target=target, name="standby-warm-up", daemon=True).start()
    return await done
