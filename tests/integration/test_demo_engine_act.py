"""The demo's real chat model on the real broker: SmolLM2 on llama.cpp behind a worker and
the gateway streams a real English answer through the OpenAI chat endpoint, and its
generations give the demo table TTFT and TPOT p99 figures per version."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.app.demo.engine_act import CHAT_MODEL, _stream_answer
from graylane.app.demo.monitor import Monitor
from graylane.client import GraylaneClient, Task
from graylane.kafka.seam import KafkaFactory
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from graylane.v1 import inference_pb2
from tests.support.gateway import running_gateway
from tests.support.llamacpp import StartLlamaServer
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka]

KEY = "demo-0123456789abcdef"


async def test_the_act_streams_real_text_and_feeds_ttft_and_tpot_into_the_table(
    factory: KafkaFactory, smollm2_q4_0_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    printed: list[str] = []
    async with (
        running_stack(
            factory,
            model=CHAT_MODEL,
            versions={},
            stable="1.0.0",
            endpoints={"1.0.0": [server.endpoint("q4_0")]},
        ),
        running_gateway(factory, keys=KeyRing(parse_api_keys(f"{KEY}:infer:demo"))) as gateway,
    ):
        text, ttft_ms, tokens = await _stream_answer(
            gateway.url, KEY, "What is the capital of France? Answer in one word.", printed.append
        )
        async with GraylaneClient(factory, client_id="demo-act-test") as client:
            results = [
                await client.infer(
                    CHAT_MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=q)],
                    max_new_tokens=16,
                    timeout=60,
                )
                for q in ("Name a color.", "What is 3 plus 4?", "Say hello in French.")
            ]
    assert "Paris" in text and ttft_ms > 0 and tokens > 1
    assert text in "".join(printed)  # printed whole, as it came
    assert len([p for p in printed if p.strip()]) > 3  # as it arrived, not in one piece
    monitor = Monitor(CHAT_MODEL, window_s=600.0)
    for result in results:
        assert result.ok and result.text.strip()
        monitor.on_result(result)
    table = monitor.table("t")
    heads = [str(c.header) for c in table.columns]
    cells = {str(c.header): [str(x) for x in c.cells] for c in table.columns}
    assert heads[-2:] == ["TTFT p99 ms", "TPOT p99 ms"]
    assert cells["version"] == ["1.0.0"]
    ttfts = [r.timing.ttft_ms for r in results]
    assert min(ttfts) - 1 <= float(cells["TTFT p99 ms"][0]) <= max(ttfts) + 1
    assert float(cells["TPOT p99 ms"][0]) > 0
