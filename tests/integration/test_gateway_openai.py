"""The official ``openai`` package against a gateway on the real broker.

A router and a worker serve the demo GPT (KV cache, byte-level tokenizer); the gateway
runs under uvicorn on a free port in the test's event loop. Each engine call of the
worker is slowed by 5 ms, and the streamed generation is held before its last tokens
(its decode steps wait at a gate) until the caller has its first text: that text
reaches the caller while the generation runs on is an order of events, not of speeds.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from graylane import serde
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.kv_decode import generate_with_cache
from graylane.engine_worker.logic.streaming import safe_text
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory, Record
from graylane.models.byte_vocab import decode_tokens
from graylane.models.demo_gpt import write_demo_gpt
from graylane.services.gateway.chat import CHATML, ChatMessage, ChatRole
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from graylane.v1 import inference_pb2
from tests.support.engines import GatedDecodeSteps
from tests.support.gateway import running_gateway
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

MODEL = "gpt"
KEY = "team-a-0123456789abcdef"
LIMITED_KEY = "team-b-0123456789abcdef"
KEYS = KeyRing(parse_api_keys(f"{KEY}:infer:team-a, {LIMITED_KEY}:infer:team-b:0.01:1"))
MESSAGES = [
    {"role": "system", "content": "You answer in bytes."},
    {"role": "user", "content": "Say something"},
]
NEW_TOKENS = 48
HELD_AT = NEW_TOKENS - 8
"""Decode steps the streamed generation runs before it waits for the caller."""


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=3, kv_cache=True)


def _openai(base: str, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


async def test_chat_completions_streamed_and_not_and_the_refusals(
    factory: KafkaFactory, kv_model: Path
) -> None:
    prompt = CHATML.render([ChatMessage(ChatRole(m["role"]), m["content"]) for m in MESSAGES])
    reference = OnnxRuntimeEngine.load(kv_model, "fp32", intra_op_threads=1)
    expected = generate_with_cache(reference, [list(prompt.encode())], NEW_TOKENS, None, 256)[0]
    slow_steps = {"v1": FaultInjection(extra_latency_ms=5.0)}
    gate = GatedDecodeSteps(OnnxRuntimeEngine.load(kv_model, "fp32", name=MODEL))
    async with (
        running_stack(
            factory,
            model=MODEL,
            versions={"v1": kv_model},
            stable="v1",
            faults=slow_steps,
            engines={"v1": {"fp32": gate}},
        ) as stack,
        running_gateway(factory, keys=KEYS) as gateway,
        _openai(gateway.url) as client,
        _openai(gateway.url, "not-a-key-of-this-gateway") as stranger,
        _openai(gateway.url, LIMITED_KEY) as limited,
    ):
        whole = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0
        )
        (decoder,) = [d for _, d in stack.workers["v1"].backend.decoders.values()]
        pieces: list[str] = []
        live_at_first_text: int | None = None
        finish: str | None = None
        usage = None
        roles = []
        registry = gateway.observability.registry
        open_during: float | None = None
        # Held 8 tokens before its end until the caller has its first text: that text
        # cannot have come after the generation ended.
        gate.shut(after=HELD_AT)
        try:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=NEW_TOKENS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    if live_at_first_text is None:
                        live_at_first_text = decoder.live  # is the worker still generating it?
                        open_during = registry.get_sample_value("graylane_gateway_streams_open")
                        gate.open()
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
        finally:
            gate.open()  # whatever happened, nothing waits on it any more
        open_after: float | None = None

        def closed() -> bool:
            nonlocal open_after
            open_after = registry.get_sample_value("graylane_gateway_streams_open")
            return open_after == 0.0

        await wait_until(closed, timeout=10, what="the gateway's stream closed")

        # Completions too, on the same path.
        completion = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0
        )

        # Refusals in OpenAI's error format.
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.chat.completions.create(model="no-such-model", messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError) as bad_key:
            await stranger.chat.completions.create(model=MODEL, messages=MESSAGES)
        allowed = await limited.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        )
        with pytest.raises(openai.RateLimitError) as throttled:
            await limited.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        # options only engine servers apply travel to the worker, whose own decoder
        # refuses them: a 400 naming the option
        with pytest.raises(openai.BadRequestError) as many:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
        with pytest.raises(openai.BadRequestError) as logprobs:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True)

    text = whole.choices[0].message.content
    assert text == decode_tokens(expected.tokens)  # the engine's own greedy tokens
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == NEW_TOKENS
    assert whole.usage.prompt_tokens == len(prompt.encode())
    assert whole.system_fingerprint == "graylane:v1"
    assert "".join(pieces) == text  # streamed, reassembled: the same greedy text
    assert len(pieces) >= 3
    # the text before the hold is not empty (a stream holds back a broken UTF-8 tail)
    assert safe_text(decode_tokens(expected.tokens[:HELD_AT]))
    assert live_at_first_text == 1  # text reached the caller while the generation ran on
    assert roles == ["assistant"]
    assert (open_during, open_after) == (1.0, 0.0)  # the streams-open gauge
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == NEW_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + NEW_TOKENS
    assert completion.choices[0].text == text
    assert completion.object == "text_completion"

    assert unknown.value.status_code == 404
    assert unknown.value.code == "model_not_found"
    assert "no-such-model" in unknown.value.message
    assert bad_key.value.status_code == 401
    assert bad_key.value.code == "invalid_api_key"
    assert allowed.choices[0].finish_reason == "length"
    assert throttled.value.status_code == 429
    assert throttled.value.code == "rate_limit_exceeded"
    assert int(throttled.value.response.headers["retry-after"]) >= 1
    assert many.value.status_code == 400 and "n is not supported" in many.value.message
    assert logprobs.value.status_code == 400 and "logprobs is not supported" in (
        logprobs.value.message
    )


async def _final_result(
    factory: KafkaFactory, topic: str, request_id: str
) -> inference_pb2.InferenceResult:
    """The final chunk of ``request_id`` on ``topic`` (read from the beginning)."""
    found: list[inference_pb2.InferenceResult] = []
    seen = asyncio.Event()

    def keep(record: Record) -> None:
        pb = serde.decode(inference_pb2.InferenceResult, record.value)
        if pb.request_id == request_id and pb.chunk.final:
            found.append(pb)
            seen.set()

    async with TopicFollower(
        factory, topic, keep, start_at=FollowFrom.BEGINNING, client_suffix="final"
    ):
        await asyncio.wait_for(seen.wait(), 30)
    return found[0]


async def test_a_caller_that_goes_away_cancels_its_generation(
    factory: KafkaFactory, kv_model: Path
) -> None:
    slow_steps = {"v1": FaultInjection(extra_latency_ms=10.0)}
    async with (
        running_stack(
            factory, model=MODEL, versions={"v1": kv_model}, stable="v1", faults=slow_steps
        ) as stack,
        running_gateway(factory, keys=KEYS) as gateway,
    ):
        body = json.dumps(
            {"model": MODEL, "prompt": "a long one", "max_tokens": 240, "stream": True}
        ).encode()
        # A raw connection, so that hanging up closes the socket there and then.
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        assert head.startswith("HTTP/1.1 200"), head
        request_id = next(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("x-request-id:")
        )
        await reader.readuntil(b"data: ")  # the first chunk: hang up mid-generation
        writer.transport.abort()
        final = await _final_result(factory, gateway.client.reply_topic, request_id)
        (decoder,) = [d for _, d in stack.workers["v1"].backend.decoders.values()]
        await wait_until(lambda: decoder.live == 0, timeout=10, what="cancelled row freed")
        async with _openai(gateway.url) as client:
            after = await client.completions.create(
                model=MODEL, prompt="next", max_tokens=4, temperature=0
            )
    assert final.finish_reason == inference_pb2.CANCELLED
    assert final.usage.completion_tokens < 200  # stopped mid-way, not at max_tokens (240)
    assert after.choices[0].finish_reason == "length"  # and the worker serves on
    cancelled = gateway.observability.registry.get_sample_value(
        "graylane_gateway_cancelled_total", {"endpoint": "completions"}
    )
    assert cancelled == 1.0
