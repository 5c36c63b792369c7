"""`graylane traffic replay`: recorded requests re-sent to another version and
compared with the recorded results (an offline shadow test), on the real broker."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.client import GraylaneClient, Task
from graylane.clock import now_ms
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.serde import PostProcess, decode
from graylane.settings import Settings
from graylane.v1 import inference_pb2, telemetry_pb2
from tests.support.stack import read_topic, running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"


async def test_replayed_traffic_agrees_with_a_twin_and_differs_from_another_model(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    versions = {
        "v1": write_demo_gpt(tmp_path / "v1.onnx", "tiny", seed=1),
        "twin": write_demo_gpt(tmp_path / "twin.onnx", "tiny", seed=1),  # same weights
        "other": write_demo_gpt(tmp_path / "other.onnx", "tiny", seed=9),
    }
    monkeypatch.setenv("GRAYLANE_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("GRAYLANE_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("COLUMNS", "200")
    async with running_stack(factory, model=MODEL, versions=versions, stable="v1"):
        start_ms = now_ms()
        async with GraylaneClient(factory) as client:
            for i in range(6):
                await client.infer(
                    MODEL,
                    prompt=f"recorded {i}",
                    routing_key=f"u{i}",
                    post_process=PostProcess.TOPK_LAST,
                    top_k=3,
                    timeout=30,
                )
                await client.infer(
                    MODEL, prompt=f"story {i}", task=Task.GENERATE, max_new_tokens=4, timeout=30
                )
        window = ["--model", MODEL, "--from", str(start_ms), "--timeout-s", "30"]
        capsys.readouterr()
        twin = await asyncio.to_thread(main, ["traffic", "replay", *window, "--version", "twin"])
        twin_out = capsys.readouterr().out
        other = await asyncio.to_thread(main, ["traffic", "replay", *window, "--version", "other"])
        other_out = capsys.readouterr().out
        # Replays are shadow traffic: answers on the shadow topic, never live latency.
        shadow = [
            decode(inference_pb2.InferenceResult, v)
            for v in await read_topic(factory, factory.layout.shadow(MODEL), expect=24)
        ]
        telemetry: list[telemetry_pb2.BatchTelemetry] = []

        async def replay_telemetry_arrived() -> bool:  # it follows the results it describes
            telemetry[:] = [
                decode(telemetry_pb2.BatchTelemetry, r.value)
                for r in await read_to_end(factory, factory.layout.telemetry())
            ]
            return sum(t.request_count for t in telemetry if t.version in {"twin", "other"}) >= 24

        await wait_until(replay_telemetry_arrived, timeout=20, what="replay telemetry")
        # The same replay as a document (its shadow answers come after those counted above).
        capsys.readouterr()
        as_json = await asyncio.to_thread(
            main, ["traffic", "replay", *window, "--version", "other", "-o", "json"]
        )
        other_doc = json.loads(capsys.readouterr().out)
    replayed = [r for r in shadow if r.version in {"twin", "other"}]
    assert len(replayed) == 24 and all(r.shadow for r in replayed)
    replay_batches = [t for t in telemetry if t.version in {"twin", "other"}]
    assert replay_batches and all(t.shadow_count == t.request_count for t in replay_batches)
    assert twin == 0, twin_out
    # The table row: replayed, agree, differ, no recorded result, errors / timeouts, agreement.
    row = next((line for line in twin_out.splitlines() if "%" in line), "")
    assert re.findall(r"[\d.]+%?", row) == ["12", "12", "0", "0", "0", "100.00%"], twin_out
    assert other == 1, other_out
    assert "100.00%" not in other_out
    assert as_json == 1  # the exit status is the table's
    assert (other_doc["apiVersion"], other_doc["kind"]) == ("graylane.v1", "TrafficReplayReport")
    report = other_doc["object"]
    assert (report["model"], report["version"], report["replayed"]) == (MODEL, "other", 12)
    assert report["differ"] > 0 and len(report["differing_request_ids"]) == report["differ"]
    assert (
        report["agree"] + report["differ"] + report["no_recorded_result"] + report["errors"]
        == report["replayed"]
    )
