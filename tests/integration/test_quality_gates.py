"""Quality gates on the real broker: ``calib capture`` from recorded requests, a build
calibrated on it (int8 within 1 % of fp32, partially quantized where needed), and
``check consistency`` on a version pair within tolerance and one outside it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from graylane.app.cli.main import main
from graylane.artifacts.manifest import read_manifest
from graylane.artifacts.naming import Backend, Precision
from graylane.builder.build import run_build
from graylane.builder.samples import demo_sentences
from graylane.builder.spec import INT8_MIN_TOP1, load_spec
from graylane.capture.recorded import manifest_path
from graylane.clock import now_ms
from graylane.kafka.admin import ensure_topics
from graylane.kafka.seam import KafkaFactory
from graylane.models.byte_vocab import PAD_ID
from graylane.registry.repository import open_registry
from graylane.serde import encode, encode_key
from graylane.settings import Settings
from graylane.v1 import inference_pb2

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "qgpt"
DISTINCT = 900
REPEATS = 60

SPEC = """
model: qgpt
version: {version}
source: {{demo: tiny, seed: {seed}}}
precisions: {precisions}
{calibration}
validation:
  npz: held-out.npz
  samples: 120
  batch_size: 40
  generation: {{prompts: 4, new_tokens: 8}}
partial_quantization: {{node_budget: 6}}
tensorrt: {{enabled: false}}
"""
CALIBRATION = "calibration: {npz: calib.npz, samples: 600, batch_size: 100, method: minmax}"


def _prompts() -> list[str]:
    """Skewed like chat traffic: mostly short prompts, a tail of long ones (<= 64 bytes)."""
    rng = np.random.default_rng(7)
    words = " ".join(demo_sentences()).split()
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < DISTINCT:
        length = int(rng.integers(2, 17)) if rng.random() < 0.7 else int(rng.integers(17, 65))
        text = " ".join(rng.choice(words, size=16))[:length]
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


async def _record(factory: KafkaFactory, prompts: list[str]) -> None:
    layout = factory.layout
    await ensure_topics(factory, layout.model_specs(MODEL, ["1.0.0"]))
    producer = factory.producer()
    await producer.start()
    try:
        for i, text in enumerate([*prompts, *prompts[:REPEATS]]):
            request = inference_pb2.InferenceRequest(
                request_id=f"r{i}", model=MODEL, prompt=text, created_at_unix_ms=now_ms()
            )
            await producer.send(
                layout.ingress(MODEL), value=encode(request), key=encode_key(f"u{i % 37}")
            )
        await producer.flush()
    finally:
        await producer.stop()


def _build(root: Path, settings: Settings, version: str, seed: int, int8: bool) -> Path:
    precisions = "[fp32, int8]" if int8 else "[fp32]"
    text = SPEC.format(
        version=version,
        seed=seed,
        precisions=precisions,
        calibration=CALIBRATION if int8 else "",
    )
    path = root / f"spec-{version}.yaml"
    path.write_text(text)
    run_build(load_spec(path), store=settings.artifact_dir, registry=open_registry(settings.db_url))
    return path


def test_capture_build_and_consistency_on_recorded_traffic(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in {
        "TOPIC_PREFIX": settings.topic_prefix,
        "BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DB_URL": settings.db_url,
        "ARTIFACT_DIR": str(settings.artifact_dir),
    }.items():
        monkeypatch.setenv(f"GRAYLANE_{name}", value)
    start = now_ms()
    prompts = _prompts()
    asyncio.run(_record(factory, prompts))

    # calib capture: stratified, de-duplicated, the builder's .npz + a manifest.
    calib, held_out = tmp_path / "calib.npz", tmp_path / "held-out.npz"
    common = ["calib", "capture", "--model", MODEL, "--from", str(start), "--max-len", "64"]
    assert main([*common, "--samples", "600", "--buckets", "8,16,32,64", "--out", str(calib)]) == 0
    assert main([*common, "--samples", "150", "--split", "held-out", "--out", str(held_out)]) == 0
    manifest = json.loads(manifest_path(calib).read_text())
    assert manifest["topics"] == [factory.layout.ingress(MODEL)]
    assert manifest["records"] == DISTINCT + REPEATS and manifest["duplicates"] == REPEATS
    assert manifest["samples"] == 600 and manifest["split"] == "calibration"
    buckets = {(b["low"], b["high"]): b for b in manifest["buckets"]}
    assert sum(b["selected"] for b in buckets.values()) == 600
    # Long prompts are ~30 % of the traffic but get their full share of the buckets.
    assert buckets[(32, 64)]["selected"] == min(buckets[(32, 64)]["available"], 150)
    assert buckets[(0, 8)]["selected"] > 0 and buckets[(16, 32)]["selected"] > 0
    with np.load(calib) as arrays, np.load(held_out) as held:
        ids, mask = arrays["input_ids"], arrays["attention_mask"]
        assert ids.shape == mask.shape and ids.shape[0] == 600 and ids.shape[1] <= 64
        assert np.all(ids[mask == 0] == PAD_ID)
        calib_rows = {
            bytes(r[m.astype(bool)].astype(np.uint8)) for r, m in zip(ids, mask, strict=True)
        }
        assert len(calib_rows) == 600  # de-duplicated
        held_rows = {
            bytes(r[m.astype(bool)].astype(np.uint8))
            for r, m in zip(held["input_ids"], held["attention_mask"], strict=True)
        }
        assert held_rows and not calib_rows & held_rows  # validation never saw calibration
        assert calib_rows | held_rows <= {p.encode() for p in prompts}

    # A build calibrated on the capture: int8 within 1 % of fp32, or partially quantized.
    _build(tmp_path, settings, "1.0.0", 0, int8=True)
    registry = open_registry(settings.db_url)
    art = registry.get_artifact(MODEL, "1.0.0", Precision.INT8, Backend.ONNXRUNTIME)
    built = read_manifest(settings.artifact_dir / art.path)
    assert built.calibration is not None and built.calibration.samples == 600
    assert built.validation is not None and built.validation.metrics is not None
    assert built.validation.tolerance.min_top1_agreement == INT8_MIN_TOP1
    assert art.servable and built.validation.passed, built.validation.failures
    assert built.validation.metrics.top1_agreement >= INT8_MIN_TOP1
    partial = built.partial_quantization
    if partial is not None:  # full int8 missed 1 %: the record says what stayed float
        assert partial.passed and partial.kept_float and partial.full_failures
        assert len(partial.kept_float) <= partial.node_budget
        assert partial.speedup_vs_fp32 is not None
    _build(tmp_path, settings, "1.1.0", 0, int8=False)  # same weights, another build
    _build(tmp_path, settings, "2.0.0", 1, int8=False)  # another seed: a different model

    capsys.readouterr()
    check = ["check", "consistency", "--model", MODEL, "--baseline", "1.0.0", "--from", str(start)]
    assert main([*check, "--candidate", "1.1.0"]) == 0
    within = capsys.readouterr().out
    assert "held-out recorded requests" in within and "within tolerance" in within
    assert main([*check, "--candidate", "2.0.0"]) == 1
    outside = capsys.readouterr().out
    assert "outside tolerance" in outside and "top1_agreement" in outside
    assert main([*check, "--candidate", "2.0.0", "--data", str(held_out)]) == 1
    assert main([*check, "--candidate", "1.1.0", "--data", str(held_out)]) == 0
    assert main([*check, "--candidate", "9.9.9"]) == 2  # never built: cannot run
    nothing = ["calib", "capture", "--model", "unrecorded", "--out", str(tmp_path / "x.npz")]
    assert main(nothing) == 1 and not (tmp_path / "x.npz").exists()
