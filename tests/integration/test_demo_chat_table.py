"""The demo's streamed act on the real broker: its generations, answered by a real worker
(ONNX Runtime, KV cache), give the demo table TTFT and TPOT p99 figures per version."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.app.demo.monitor import Monitor
from graylane.app.demo.streamed import show_streams
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka]

MODEL = "chat"


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=3, kv_cache=True)


async def test_streamed_act_feeds_ttft_and_tpot_into_the_demo_table(
    factory: KafkaFactory, kv_model: Path
) -> None:
    lines: list[str] = []
    async with running_stack(factory, model=MODEL, versions={"v1": kv_model}, stable="v1"):
        shown = await show_streams(factory, MODEL, lines.append, max_new_tokens=24, batch=4)
    assert len(shown.results) == 1 + 1 + 4  # the long one, the short one, the batch
    assert all(r.ok and r.version == "v1" for r in shown.results)
    monitor = Monitor(MODEL, window_s=600.0)
    for result in shown.results:
        monitor.on_result(result)
    table = monitor.table("t")
    heads = [str(c.header) for c in table.columns]
    cells = {str(c.header): [str(x) for x in c.cells] for c in table.columns}
    assert heads[-2:] == ["TTFT p99 ms", "TPOT p99 ms"]
    ttfts = [r.timing.ttft_ms for r in shown.results]
    tpots = [r.timing.tpot_ms for r in shown.results if r.timing.tpot_ms > 0]
    assert min(ttfts) > 0 and tpots
    assert cells["version"] == ["v1"]
    ttft_p99 = float(cells["TTFT p99 ms"][0])
    assert min(ttfts) - 1 <= ttft_p99 <= max(ttfts) + 1
    assert min(tpots) - 0.1 <= float(cells["TPOT p99 ms"][0]) <= max(tpots) + 0.1
