"""GPU path check (run by ``scripts/gpu-check.sh`` on a host with an NVIDIA GPU and TensorRT).

1. Builds the tiny demo GPT through the real builder (``run_build`` → ``compile_engines``
   → ``builder/tensorrt_build.build_engine``): fp32, fp16 and int8 engines.
2. Compares every engine with the ONNX variant it was compiled from through Polygraphy
   (``TrtRunner`` vs the project's ONNX Runtime runner, ``Comparator.compare_accuracy``).
3. Writes the results as JSON to the file given as its only argument.

Not a test module: CI has no GPU. Exit status 0 when every engine was built and
matches its ONNX variant within the tolerance, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from graylane.artifacts.build_info import Tolerance
from graylane.artifacts.naming import Backend, Precision
from graylane.builder.build import run_build
from graylane.builder.polygraphy_check import compare_runs, run_model
from graylane.builder.spec import parse_spec
from graylane.builder.variants import VariantStatus

# Engine vs its own ONNX variant (same graph, other kernels): max |Δ| on the logits.
ATOL = {Precision.FP32: 2e-3, Precision.FP16: 5e-2, Precision.INT8: 0.25}
SPEC: dict[str, Any] = {
    "model": "gpu-check",
    "version": "1.0.0",
    "strategy": "gpucheck",
    "source": {"demo": "tiny", "seed": 0},
    "precisions": ["fp32", "fp16", "int8"],
    "profiles": [
        {
            "name": "all",
            "shapes": {
                "input_ids": {"min": [1, 1], "opt": [4, 32], "max": [8, 64]},
                "attention_mask": {"min": [1, 1], "opt": [4, 32], "max": [8, 64]},
            },
        }
    ],
    "calibration": {"generator": "demo-text", "samples": 64, "seq_len": 32, "batch_size": 8},
    "validation": {"generator": "demo-text", "samples": 16, "seq_len": 32, "batch_size": 4},
    "tensorrt": {"enabled": True},
}


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    feeds = []
    for batch, seq in ((1, 1), (4, 32), (8, 64), (3, 17)):
        ids = rng.integers(0, 258, (batch, seq), dtype=np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return feeds


def _compare(onnx_path: Path, plan_path: Path, precision: Precision) -> dict[str, Any]:
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    feeds = _feeds()
    onnx_run = run_model(onnx_path, f"onnxruntime-{precision.value}", feeds)
    runner = TrtRunner(EngineFromBytes(plan_path.read_bytes()), name=f"tensorrt-{precision.value}")
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        trt_run = Comparator.run([runner], data_loader=[dict(f) for f in feeds])
    report = compare_runs(onnx_run, trt_run, Tolerance(max_abs=ATOL[precision]))
    return {
        "passed": all(o.passed for o in report.outputs),
        "atol": ATOL[precision],
        "outputs": {
            o.name: {"max_abs": o.max_abs, "mean_abs": o.mean_abs, "max_rel": o.max_rel}
            for o in report.outputs
        },
    }


def main(out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        spec = parse_spec(SPEC, Path(tmp))
        report = run_build(spec, store=Path(tmp) / "artifacts")
        onnx = {v.precision: v for v in report.variants if v.backend is Backend.ONNXRUNTIME}
        engines: dict[str, Any] = {}
        comparisons: dict[str, Any] = {}
        for v in report.variants:
            if v.backend is not Backend.TENSORRT:
                continue
            engines[v.precision.value] = {
                "status": v.status.value,
                "reason": v.reason,
                "compute_capability": v.compute_capability,
            }
            source = onnx.get(v.precision)
            if v.status is not VariantStatus.PRODUCED or v.folder is None or source is None:
                continue
            if source.folder is None:
                continue
            try:
                comparisons[v.precision.value] = _compare(
                    source.folder / "model.onnx", v.folder / "engine.plan", v.precision
                )
            except Exception as exc:  # report, do not crash: the summary says what failed
                comparisons[v.precision.value] = {"passed": False, "error": repr(exc)}
        built = [p for p, e in engines.items() if e["status"] == VariantStatus.PRODUCED.value]
        ok = (
            report.tensorrt_note is None
            and len(built) == len(spec.precisions)
            and len(comparisons) == len(built)
            and all(c["passed"] for c in comparisons.values())
        )
        result = {
            "ok": ok,
            "tensorrt_note": report.tensorrt_note,
            "engines": engines,
            "polygraphy": comparisons,
        }
    out.write_text(json.dumps(result), encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
