"""graylane load: requests on a fixed schedule, failures counted, never the end of the loop."""

from __future__ import annotations

import asyncio

import pytest

from graylane.app.cli.load import LoadPlan, run_load
from graylane.client import InferenceTimeout


class FakeClock:
    """Time that moves only when the load generator sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)  # tasks started before the sleep run at the time they were due
        self.now += seconds


def test_sends_at_the_rate_and_counts_failures_without_stopping() -> None:
    clock = FakeClock()
    sent_at: list[float] = []
    lines: list[str] = []

    async def send(i: int) -> object:
        sent_at.append(clock.now)
        if i % 5 == 0:
            raise InferenceTimeout("no result")
        if i == 7:
            raise RuntimeError("broken record")
        return i

    plan = LoadPlan(rate=4.0, duration_s=5.0, report_every_s=2.0)
    tally = asyncio.run(run_load(send, plan, clock=clock, sleep=clock.sleep, say=lines.append))
    assert tally.sent == 20 and len(sent_at) == 20
    assert sent_at == pytest.approx([i / 4.0 for i in range(20)])
    assert tally.failed == {"InferenceTimeout": 4, "RuntimeError": 1}
    assert tally.ok == 15 and tally.skipped == 0
    assert len(lines) == 3 and "sent 20" in lines[-1] and "InferenceTimeout 4" in lines[-1]


def test_a_send_due_while_too_many_wait_is_skipped() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    async def send(i: int) -> object:
        await release.wait()
        return i

    async def main() -> tuple[int, int]:
        plan = LoadPlan(rate=10.0, duration_s=1.0, max_in_flight=3, report_every_s=60.0)
        task = asyncio.ensure_future(run_load(send, plan, clock=clock, sleep=clock.sleep))
        while clock.now < 0.9:  # the last send is due at 0.9 s
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        release.set()
        tally = await task
        return tally.sent, tally.skipped

    assert asyncio.run(main()) == (3, 7)


def test_a_plan_refuses_a_rate_that_sends_nothing() -> None:
    with pytest.raises(ValueError):
        LoadPlan(rate=0)
    with pytest.raises(ValueError):
        LoadPlan(rate=1, max_in_flight=0)
