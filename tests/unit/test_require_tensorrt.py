"""``graylane worker --require-tensorrt``: a GPU pod never serves ONNX Runtime on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.models.demo_gpt import write_demo_gpt


def test_a_worker_requiring_tensorrt_refuses_an_onnx_runtime_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_demo_gpt(tmp_path / "tiny.onnx", "tiny", seed=1)
    monkeypatch.setenv("GRAYLANE_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never reached
    argv = ["worker", "--model", "m", "--version", "1.0.0", "--variant", f"fp32={model}"]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--require-tensorrt"])
    message = str(refused.value.code)
    assert "--require-tensorrt" in message and "fp32" in message and "ONNX Runtime" in message
