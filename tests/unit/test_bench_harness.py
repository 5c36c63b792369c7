"""Pieces the benchmarks share: readiness probing, worker command lines, run labels."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from graylane.app.bench import harness
from graylane.app.bench.harness import WorkerSpec, wait_answered
from graylane.app.bench.llm import model_label
from graylane.client import InferenceTimeout


def test_a_model_of_your_own_is_labelled_by_its_folder(tmp_path: Path) -> None:
    export = tmp_path / "tinyllama-1.1b"
    export.mkdir()
    assert model_label(export / "model.onnx") == "tinyllama-1.1b"
    assert model_label(export / "decoder_model_merged.onnx") == "tinyllama-1.1b"


def test_a_relative_model_path_is_labelled_by_the_folder_it_resolves_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "phi-mini").mkdir()
    monkeypatch.chdir(tmp_path / "phi-mini")
    assert model_label(Path("model.onnx")) == "phi-mini"


async def test_wait_answered_retries_timeouts_until_an_answer() -> None:
    calls = 0

    async def probe() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise InferenceTimeout("no answer yet")
        return "answered"

    await wait_answered(probe, within_s=30)
    assert calls == 3


async def test_wait_answered_gives_up_past_its_deadline() -> None:
    async def probe() -> None:
        await asyncio.sleep(0.01)
        raise InferenceTimeout("nobody serves")

    with pytest.raises(InferenceTimeout):
        await wait_answered(probe, within_s=0.05)


def test_a_worker_command_line_carries_its_threads_variants_and_extra_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []

    def start_service(name: str, args: list[str], logs: Path, env: dict[str, str]) -> str:
        seen.append([name, *args])
        return name

    monkeypatch.setattr(harness, "start_service", start_service)
    spec = WorkerSpec("v2", {"fp32": "/m/a.onnx"}, extra_args=("--max-batch", "8"), threads=0)
    harness.start_worker(spec, "gpt", {}, "bench-x")
    harness.start_worker(WorkerSpec("v1", {"fp16": "/m/b.onnx"}), "gpt", {}, "bench-x")
    head = ["worker", "--model", "gpt", "--version"]
    assert seen == [
        [
            "bench-x-worker-v2",
            *head,
            "v2",
            "--threads",
            "0",
            "--variant",
            "fp32=/m/a.onnx",
            "--max-batch",
            "8",
        ],
        ["bench-x-worker-v1", *head, "v1", "--threads", "1", "--variant", "fp16=/m/b.onnx"],
    ]
