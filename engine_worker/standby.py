"""Warm standby: a worker that loaded and warmed its engines but waits out of its group.

A supervisor keeps one such process per scaled version (``--warm-standby``), so
a scale-out is a signal (``SIGUSR1``: join the consumer group and serve), not a
process start, an ONNX Runtime load and a warm-up competing for the CPU with the
overloaded workers at the worst moment. Until then it holds no partitions, reads
nothing and is not ready (``/readyz``).
"""

from __future__ import annotations

import asyncio
import logging
import signal

__all__ = ["ACTIVATE", "wait_for_activation"]

log = logging.getLogger(__name__)

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
