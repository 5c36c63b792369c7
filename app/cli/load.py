"""``graylane load``: a steady, low request rate through the SDK (so a canary has traffic).

Requests leave on a fixed schedule (``rate`` per second), each in its own task, so a slow
or failed answer never delays the next one; at most ``max_in_flight`` wait at once (a send
due while that many wait is skipped and counted). A failed request (timeout, rejection,
unknown model while the stack starts) is counted by kind and the loop goes on. A progress
line is printed every ``report_every_s`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["LoadPlan", "LoadTally", "register", "run_load"]


@dataclass(frozen=True, kw_only=True)
class LoadPlan:
    """How much load: requests per second, for how long (None: until stopped)."""

    rate: float
    duration_s: float | None = None
    max_in_flight: int = 32
    report_every_s: float = 30.0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")


@dataclass
class LoadTally:
    """What the load generator did so far."""

    sent: int = 0
    ok: int = 0
    skipped: int = 0
    failed: Counter[str] = field(default_factory=Counter)

    def line(self, elapsed_s: float, in_flight: int) -> str:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        rate = self.sent / elapsed_s if elapsed_s > 0 else 0.0
        return (
            f"[load] {elapsed_s:6.0f}s sent {self.sent} ({rate:.2f}/s) ok {self.ok} "
            f"in flight {in_flight} skipped {self.skipped} failed: {failed}"
        )


async def run_load(
    send: Callable[[int], Awaitable[object]],
    plan: LoadPlan,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    say: Callable[[str], None] = print,
) -> LoadTally:
    """Call ``send(i)`` for i = 0, 1, ... at ``plan.rate`` per second; never raises for a
    failed request."""
    tally = LoadTally()
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        try:
            await send(i)
        except Exception as exc:  # a bad answer is counted; the load goes on
            tally.failed[type(exc).__name__] += 1
        else:
            tally.ok += 1

    start = clock()
    next_report = start + plan.report_every_s
    i = 0
    while plan.duration_s is None or i < plan.rate * plan.duration_s:
        due = start + i / plan.rate
        now = clock()
        if due > now:
            await sleep(due - now)
        if len(pending) >= plan.max_in_flight:
            tally.skipped += 1
        else:
            tally.sent += 1
            task = asyncio.ensure_future(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
        i += 1
        if clock() >= next_report:
            say(tally.line(clock() - start, len(pending)))
            next_report += plan.report_every_s
    if pending:
        await asyncio.gather(*pending)
    say(tally.line(clock() - start, 0))
    return tally


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    load = sub.add_parser(
        "load", help="send a steady low rate of requests through the SDK (a canary's traffic)"
    )
    load.add_argument("--model", required=True, help="the model to send to")
    load.add_argument("--rate", type=float, default=2.0, help="requests per second")
    load.add_argument("--duration", type=float, default=None, help="seconds; default: forever")
    load.add_argument("--prompt", default="The quick brown fox", help="the prompt")
    load.add_argument("--max-new-tokens", type=int, default=8, help="tokens per generation")
    load.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    load.add_argument("--max-in-flight", type=int, default=32, help="requests waiting at once")
    load.add_argument("--report-every", type=float, default=30.0, help="seconds between lines")
    load.set_defaults(handler=_load)


def _load(args: argparse.Namespace) -> int:
    from graylane.client import GraylaneClient, Task
    from graylane.settings import Settings

    plan = LoadPlan(
        rate=args.rate,
        duration_s=args.duration,
        max_in_flight=args.max_in_flight,
        report_every_s=args.report_every,
    )

    async def main() -> LoadTally:
        async with GraylaneClient(Settings.from_env()) as client:

            async def send(i: int) -> object:
                return await client.infer(
                    args.model,
                    prompt=f"{args.prompt} {i}",
                    task=Task.GENERATE,
                    max_new_tokens=args.max_new_tokens,
                    timeout=args.timeout,
                    routing_key=f"load-{i}",
                )

            return await run_load(send, plan)

    tally = asyncio.run(main())
    return 0 if tally.ok else 1
