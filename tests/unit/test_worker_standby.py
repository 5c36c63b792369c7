"""A standby worker's warm-up runs in a niced thread of its own; activation by signal."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from graylane.engine_worker.standby import ACTIVATE, run_at_low_priority, wait_for_activation


async def test_warm_up_runs_in_its_own_lowered_thread_and_returns_or_raises() -> None:
    seen: list[tuple[str, int]] = []

    def work() -> int:
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)))
        return 12

    assert await run_at_low_priority(work) == 12
    ((name, nice),) = seen
    assert name == "standby-warm-up" and name != threading.current_thread().name
    assert nice == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19  # ours untouched

    def broken() -> int:
        raise RuntimeError("engine failed to warm up")

    with pytest.raises(RuntimeError, match="warm up"):
        await run_at_low_priority(broken)


async def test_activation_by_signal_and_stop_without_it() -> None:
    stop = asyncio.Event()
    waiting = asyncio.create_task(wait_for_activation(stop, "worker w1"))
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), ACTIVATE)
    assert await asyncio.wait_for(waiting, 5) is True
    stop.set()
    assert await wait_for_activation(stop, "worker w1") is False
    # the handler is gone again: SIGUSR1 would be the default action now
    assert signal.getsignal(ACTIVATE) in (signal.SIG_DFL, None)
