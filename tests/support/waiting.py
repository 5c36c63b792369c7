"""Wait on an event, not a sleep: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from graylane.kafka.reading import wait_for_assignment
from graylane.kafka.seam import ConsumerOptions, KafkaFactory

POLL_S = 0.05


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float,
    what: str = "",
    poll_s: float = POLL_S,
) -> None:
    """Return as soon as `condition()` is true; raise TimeoutError after `timeout` seconds.

    `condition` may be a plain or an async callable; it is checked once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not true within {timeout:g} s: {what or condition!r}")
        await asyncio.sleep(poll_s)


async def end_offsets(factory: KafkaFactory, topic: str) -> dict[int, int]:
    """The end offset (next offset to be written) of every partition of `topic`."""
    consumer = factory.consumer(topic, options=ConsumerOptions(group_id=None), client_suffix="ends")
    await consumer.start()
    try:
        partitions = await wait_for_assignment(consumer)
        ends = await consumer.end_offsets(list(partitions))
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()
