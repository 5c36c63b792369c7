"""The demo's streamed generations: chunks printed as they arrive, and one request
joining a running decode batch.

Two generations of a decoder with a KV cache: a long one streamed chunk by chunk (each
line printed the moment its record arrives, with its time since the request was sent),
and, while it decodes, a short one that joins the running batch and is answered before
the long one ends. Then a few more of different lengths at once, so the demo's table
has TTFT and TPOT p99 figures of the version (:attr:`StreamShown.results`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from graylane.client import Chunk, GraylaneClient, InferenceTimeout, Result, Task
from graylane.kafka.seam import KafkaFactory

__all__ = ["StreamShown", "show_streams"]


@dataclass(frozen=True)
class StreamShown:
    chunks: int
    tokens: int
    finish_reason: str
    ttft_ms: float
    tpot_ms: float
    short_ms: float
    """The short request's whole latency (it joined while the long one decoded)."""
    long_ms: float
    results: tuple[Result, ...] = ()
    """Every generation's result (the long, the short and the batch after them)."""


async def _ready(client: GraylaneClient, model: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            await client.infer(model, prompt="hi", task=Task.GENERATE, max_new_tokens=1, timeout=5)
            return
        except InferenceTimeout:
            if time.monotonic() > deadline:
                raise


async def show_streams(
    factory: KafkaFactory,
    model: str,
    out: Callable[[str], None],
    *,
    prompt: str = "Once upon a time",
    max_new_tokens: int = 48,
    batch: int = 6,
) -> StreamShown:
    """Stream one long generation (printing each chunk live) while a short one joins;
    then ``batch`` generations of different lengths at once."""
    async with GraylaneClient(factory, client_id="demo-stream") as client:
        await _ready(client, model)
        sent = time.perf_counter()
        chunks: list[Chunk] = []
        short: list[Result] = []

        async def short_one() -> None:
            short.append(
                await client.infer(
                    model, prompt="and then", task=Task.GENERATE, max_new_tokens=4, timeout=30
                )
            )
            out(
                f"    + a short request joined the running batch: answered in "
                f"{short[0].timing.total_ms:.0f} ms ({len(short[0].tokens)} tokens)"
            )

        joiner: asyncio.Task[None] | None = None
        async for chunk in client.stream(
            model, prompt=prompt, max_new_tokens=max_new_tokens, stream_every_tokens=6, timeout=30
        ):
            chunks.append(chunk)
            at = (time.perf_counter() - sent) * 1000.0
            out(
                f"    chunk {chunk.sequence:>2} at {at:6.0f} ms: {len(chunk.tokens)} token(s) "
                f"{chunk.text!r}" + (f"  [{chunk.finish_reason}]" if chunk.final else "")
            )
            if joiner is None:
                joiner = asyncio.create_task(short_one())
        if joiner is not None:
            await joiner
        more = await asyncio.gather(
            *(
                client.infer(
                    model,
                    prompt=f"{prompt} {i}",
                    task=Task.GENERATE,
                    max_new_tokens=4 + (i * max_new_tokens) // max(batch, 1),
                    timeout=60,
                )
                for i in range(batch)
            )
        )
    final = chunks[-1].result
    timing = final.timing if final is not None else None
    return StreamShown(
        chunks=len(chunks),
        tokens=sum(len(c.tokens) for c in chunks),
        finish_reason=chunks[-1].finish_reason,
        ttft_ms=timing.ttft_ms if timing is not None else 0.0,
        tpot_ms=timing.tpot_ms if timing is not None else 0.0,
        short_ms=short[0].timing.total_ms if short else 0.0,
        long_ms=timing.total_ms if timing is not None else 0.0,
        results=(*((final,) if final is not None else ()), *short, *more),
    )
