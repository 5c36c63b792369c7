"""Streamed generations, cancels and continuous batching through router and worker.

The demo GPT with a KV cache, served by a real worker on the real broker: a streamed
generation arrives in order and reassembles to the unstreamed tokens (which are the
engine's own greedy tokens); a cancel ends a running generation within a few steps and
frees its rows; a request that arrives while another decodes joins the running batch
and is answered long before the other one finishes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from graylane.client import Chunk, GraylaneClient, Task
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.kv_decode import generate_with_cache
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from tests.support.engines import GatedDecodeSteps
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

MODEL = "gpt"


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=3, kv_cache=True)


async def test_streamed_generation_reassembles_to_the_unstreamed_one(
    factory: KafkaFactory, kv_model: Path
) -> None:
    prompt = "stream me"
    reference = OnnxRuntimeEngine.load(kv_model, "fp32", intra_op_threads=1)
    expected = generate_with_cache(reference, [list(prompt.encode())], 24, None, 256)[0]
    chunks: list[Chunk] = []
    async with (
        running_stack(factory, model=MODEL, versions={"v1": kv_model}, stable="v1"),
        GraylaneClient(factory) as client,
    ):
        whole = await client.infer(
            MODEL, prompt=prompt, task=Task.GENERATE, max_new_tokens=24, timeout=30
        )
        async for chunk in client.stream(
            MODEL, prompt=prompt, max_new_tokens=24, stream_every_tokens=5, timeout=30
        ):
            chunks.append(chunk)
        # A seeded sampled generation is reproducible through the path, streamed or not.
        sampled = dict(prompt=prompt, max_new_tokens=24, temperature=1.0, top_p=0.95, seed=7)
        once = await client.infer(MODEL, task=Task.GENERATE, timeout=30, **sampled)
        again = [c async for c in client.stream(MODEL, timeout=30, **sampled)]
        other = await client.infer(MODEL, task=Task.GENERATE, timeout=30, **{**sampled, "seed": 8})
    assert whole.tokens == expected.tokens  # the engine's own greedy tokens
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert len(chunks) >= 4  # 24 tokens, a chunk every 5 (or every 50 ms)
    assert tuple(t for c in chunks for t in c.tokens) == whole.tokens
    assert "".join(c.text for c in chunks) == whole.text
    final = chunks[-1]
    assert final.finish_reason == "LENGTH"
    assert final.result is not None and final.result.ok
    assert tuple(t for c in again for t in c.tokens) == once.tokens
    assert once.tokens != whole.tokens  # sampled, not greedy
    assert other.tokens != once.tokens


async def test_a_cancel_stops_a_running_generation_and_frees_its_rows(
    factory: KafkaFactory, kv_model: Path
) -> None:
    async with running_stack(factory, model=MODEL, versions={"v1": kv_model}, stable="v1") as stack:
        worker = stack.workers["v1"]
        async with GraylaneClient(factory) as client:
            chunks: list[Chunk] = []
            stream = client.stream(
                MODEL, prompt="a long one", max_new_tokens=240, stream_every_tokens=1, timeout=30
            )
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 3:
                    await client.cancel(chunk.request_id, model=MODEL)
            final = chunks[-1]
            assert final.final and final.finish_reason == "CANCELLED"
            generated = sum(len(c.tokens) for c in chunks)
            assert 3 <= generated < 200  # stopped within a few steps, not at the end
            (decoder,) = [d for _, d in worker.backend.decoders.values()]
            await wait_until(lambda: decoder.live == 0, timeout=10, what="rows freed")
            assert decoder._loop.scheduler.running == ()
            assert decoder._loop.scheduler.reserved_kv_tokens == 0

            # A request leaving its stream early cancels it as well.
            seen = 0
            async for _ in client.stream(
                MODEL, prompt="walk away", max_new_tokens=240, stream_every_tokens=1, timeout=30
            ):
                seen += 1
                if seen == 2:
                    break
            await wait_until(lambda: decoder.live == 0, timeout=10, what="abandoned one freed")
            # And the worker serves on.
            after = await client.infer(
                MODEL, prompt="next", task=Task.GENERATE, max_new_tokens=4, timeout=30
            )
            assert len(after.tokens) == 4


async def test_a_request_arriving_mid_decode_joins_the_running_batch(
    factory: KafkaFactory, kv_model: Path
) -> None:
    """Ordered by events, not by this machine's speed: the long generation is held after
    its first token until the short request has reached the decoder, then both decode
    together; the short one (4 tokens) ends within a few of the long one's 240 steps."""
    engine = OnnxRuntimeEngine.load(kv_model, "fp32", name=MODEL, intra_op_threads=1)
    gate = GatedDecodeSteps(engine)
    async with running_stack(
        factory, model=MODEL, versions={"v1": kv_model}, stable="v1", engines={"v1": {"fp32": gate}}
    ) as stack:
        worker = stack.workers["v1"]
        async with GraylaneClient(factory) as client:
            long_chunks: list[Chunk] = []
            started = asyncio.Event()

            async def long_one() -> None:
                async for chunk in client.stream(
                    MODEL,
                    prompt="the long one",
                    max_new_tokens=240,
                    stream_every_tokens=1,
                    timeout=60,
                ):
                    long_chunks.append(chunk)
                    started.set()

            gate.shut()  # its first token goes out; its decode waits
            try:
                task = asyncio.create_task(long_one())
                await asyncio.wait_for(started.wait(), 30)
                (decoder,) = [d for _, d in worker.backend.decoders.values()]
                short_call = asyncio.create_task(
                    client.infer(
                        MODEL, prompt="short", task=Task.GENERATE, max_new_tokens=4, timeout=30
                    )
                )
                await wait_until(lambda: decoder.live == 2, timeout=30, what="the short one")
            finally:
                gate.open()
            short = await short_call
            await task
    assert decoder.peak_rows >= 2  # they shared decode steps
    long_final = long_chunks[-1].result
    assert long_final is not None and long_final.finish_reason == "LENGTH"
    assert sum(len(c.tokens) for c in long_chunks) == 240
    assert len(short.tokens) == 4
    # By the worker's stamps: the short one got its row and its answer while the long
    # one was still decoding.
    assert short.timing.dequeued_at_unix_ms >= long_final.timing.dequeued_at_unix_ms
    assert short.timing.completed_at_unix_ms < long_final.timing.completed_at_unix_ms
