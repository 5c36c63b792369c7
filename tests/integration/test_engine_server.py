"""Versions served by a real engine server: llama.cpp's ``llama-server`` on
SmolLM2-135M-Instruct (a trained model), behind the Kafka path and the gateway.

- Greedy chat completions through the gateway (gateway -> Kafka -> router -> worker ->
  engine) equal the engine's own answers to the same requests, and are real English;
  a stream reassembles to the unstreamed answer; ``logprobs`` and
  ``response_format: json_object`` are answered by the engine.
- A caller that hangs up frees the engine's slot (its ``/slots`` says so) long before
  the generation would have ended.
- The engine killed under load: every request is answered (an error while the engine is
  gone), the worker stays up and is not ready while the engine is away, and serves again
  within 10 s of the engine's return; nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest

from graylane.client import GraylaneClient, Result, Task
from graylane.clock import now_ms
from graylane.engine_worker.engine_server import EngineServerSettings
from graylane.kafka.seam import KafkaFactory
from graylane.metrics.process import ENGINE_UP
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from graylane.v1 import inference_pb2
from tests.support.gateway import running_gateway
from tests.support.llamacpp import StartLlamaServer
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

MODEL = "smollm2"
KEY = "team-a-0123456789abcdef"
KEYS = KeyRing(parse_api_keys(f"{KEY}:infer:team-a"))
QUESTIONS = (
    "What is the capital of France? Answer in one word.",
    "Name three colors of the rainbow.",
    "What is 2 plus 2?",
    "Write one sentence about the sea.",
)


def _openai(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _slots(url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/slots", timeout=5) as answer:
        slots = json.load(answer)
    assert isinstance(slots, list)
    return slots


async def test_greedy_answers_through_graylane_are_the_engines_own(
    factory: KafkaFactory, smollm2_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_gguf, threads=1, slots=4)
    async with (
        openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as direct,
        running_stack(
            factory,
            model=MODEL,
            versions={},
            stable="1.0.0",
            endpoints={"1.0.0": [server.endpoint("q4_1")]},
        ),
        running_gateway(factory, keys=KEYS) as gateway,
        _openai(gateway.url) as client,
    ):
        for question in QUESTIONS:
            own = await direct.chat.completions.create(
                model="smollm2",
                messages=_chat(question),
                max_tokens=32,
                temperature=0,  # type: ignore[arg-type]
            )
            through = await client.chat.completions.create(
                model=MODEL,
                messages=_chat(question),
                max_tokens=32,
                temperature=0,  # type: ignore[arg-type]
            )
            expected = own.choices[0].message.content
            assert through.choices[0].message.content == expected, question
            assert through.choices[0].finish_reason == own.choices[0].finish_reason
            assert through.usage is not None and own.usage is not None
            assert through.usage.completion_tokens == own.usage.completion_tokens
            assert through.system_fingerprint == "graylane:1.0.0"
        capital = await client.chat.completions.create(
            model=MODEL,
            messages=_chat(QUESTIONS[0]),
            max_tokens=32,
            temperature=0,  # type: ignore[arg-type]
        )
        answer = capital.choices[0].message.content or ""
        assert "Paris" in answer, answer  # a trained model, in English

        # A stream reassembles to the unstreamed answer.
        pieces: list[str] = []
        finish = None
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=_chat(QUESTIONS[3]),
            max_tokens=32,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        whole = await client.chat.completions.create(
            model=MODEL,
            messages=_chat(QUESTIONS[3]),
            max_tokens=32,
            temperature=0,  # type: ignore[arg-type]
        )
        assert len([p for p in pieces if p]) > 1  # it came in pieces
        assert "".join(pieces) == whole.choices[0].message.content
        assert finish == whole.choices[0].finish_reason

        # What only engines do: log probabilities and JSON mode.
        scored = await client.chat.completions.create(
            model=MODEL,
            messages=_chat(QUESTIONS[0]),  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        logprobs = scored.choices[0].logprobs
        assert logprobs is not None and logprobs.content
        assert "".join(t.token for t in logprobs.content) == scored.choices[0].message.content
        assert all(t.logprob <= 0.0 and len(t.top_logprobs) == 2 for t in logprobs.content)
        as_json = await client.chat.completions.create(
            model=MODEL,
            messages=_chat("Give the name and the capital of France as JSON."),  # type: ignore[arg-type]
            max_tokens=48,
            temperature=0,
            response_format={"type": "json_object"},
        )
        text = as_json.choices[0].message.content or ""
        assert isinstance(json.loads(text), dict), text

        # The probes clients of vLLM-compatible servers send first.
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            assert (await http.get("/health")).status_code == 200
            assert "version" in (await http.get("/version")).json()
            models = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            assert MODEL in [m["id"] for m in models.json()["data"]]


async def test_a_caller_that_hangs_up_frees_the_engines_slot(
    factory: KafkaFactory, smollm2_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_gguf, threads=1, slots=2)
    long_story = "Tell me a very long story about a dragon, with many chapters."
    async with (
        running_stack(
            factory,
            model=MODEL,
            versions={},
            stable="1.0.0",
            endpoints={"1.0.0": [server.endpoint("q4_1")]},
        ) as stack,
        running_gateway(factory, keys=KEYS) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=60) as http,
    ):
        body = {
            "model": MODEL,
            "messages": _chat(long_story),
            "max_tokens": 250,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {KEY}"}
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as sse:
            assert sse.status_code == 200
            texts = 0
            async for line in sse.aiter_lines():
                if (
                    line.startswith("data:")
                    and '"content":"' in line
                    and '"content":""' not in line
                ):
                    texts += 1
                    if texts >= 3:
                        break  # the caller goes away mid-answer

        def busy() -> bool:
            return any(slot.get("is_processing") for slot in _slots(server.url))

        await wait_until(lambda: not busy(), timeout=30, what="the engine's slot freed")
        decoded = max(
            int(s["next_token"][0]["n_decoded"])  # type: ignore[index]
            for s in _slots(server.url)
            if s.get("next_token")
        )
        assert decoded < 100, decoded  # stopped long before its max_tokens
        cancelled = stack.workers["1.0.0"].registry.get_sample_value(
            "graylane_generation_finish_total",
            {"model": MODEL, "version": "1.0.0", "variant": "q4_1", "reason": "cancelled"},
        )
        assert cancelled == 1.0


async def test_the_engine_killed_under_load_answers_every_request_and_comes_back(
    factory: KafkaFactory, smollm2_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_gguf, threads=1, slots=4)
    sent: list[str] = []
    results: dict[str, Result] = {}
    async with (
        running_stack(
            factory,
            model=MODEL,
            versions={},
            stable="1.0.0",
            endpoints={"1.0.0": [server.endpoint("q4_1")]},
            engine_server=EngineServerSettings(retry_budget_s=0.5, probe_every_s=0.5),
        ) as stack,
        GraylaneClient(factory, client_id="engine-load") as client,
    ):
        worker = stack.workers["1.0.0"]
        readiness = worker.observability.readiness

        async def collect() -> None:
            async for result in client.results():
                results[result.request_id] = result

        async def send(n: int, every_s: float) -> None:
            for _ in range(n):
                rid = await client.submit(
                    MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=QUESTIONS[2])],
                    max_new_tokens=24,
                )
                sent.append(rid)
                await asyncio.sleep(every_s)

        collector = asyncio.create_task(collect())
        try:
            await send(8, 0.1)
            await wait_until(lambda: len(results) >= 4, timeout=60, what="answers before")
            killed_ms = now_ms()
            server.kill()
            await send(8, 0.1)  # while the engine is gone
            await wait_until(
                lambda: ENGINE_UP in readiness.missing(), timeout=10, what="worker not ready"
            )
            assert worker.ready.is_set()  # up, serving what it can: not crashed
            await asyncio.sleep(2.0)
            server.restart()
            back_ms = now_ms()
            await send(8, 0.1)
            await wait_until(lambda: len(results) >= len(sent), timeout=90, what="every answer")
            await wait_until(
                lambda: ENGINE_UP not in readiness.missing(), timeout=10, what="ready again"
            )
        finally:
            collector.cancel()
    assert set(results) == set(sent)  # nothing acknowledged was lost
    failed = [r for r in results.values() if not r.ok]
    assert failed, "no request saw the engine gone"
    assert {r.error_code for r in failed} <= {"ENGINE_UNAVAILABLE", "ENGINE_FAILURE"}, failed
    # the system's own stamps: when the worker answered each request
    after = [r for r in results.values() if r.ok and r.timing.completed_at_unix_ms > back_ms]
    assert after, "nothing served after the engine came back"
    first_back = min(r.timing.completed_at_unix_ms for r in after)
    assert first_back - back_ms <= 10_000, (first_back - back_ms, killed_ms)
    assert all(r.text.strip() and r.finish_reason in ("EOS", "LENGTH") for r in after)
