"""INT8 calibration with a content-addressed cache of tensor ranges.

What is cached: the calibration *result*, i.e. ONNX Runtime's ``TensorsData``
(per-tensor ranges, plus histograms for entropy/percentile), written with
``onnxruntime.quantization.calibrate.save_tensors_data`` to
``<cache_dir>/<key>.json``. ``quantize_static`` then reads it through its
``calibration_cache_path`` argument and skips calibration inference entirely.
The quantized file itself is not cached, so quantizer options can change without
recalibrating.

The key is ``sha256`` over the source ONNX digest, the calibration samples' digest,
the method and its parameters, so any change to the model or the data misses.

We run the calibrator ourselves (``create_calibrator`` → ``collect_data`` →
``compute_data``) rather than letting ``quantize_static`` do it, because
``quantize_static`` cannot pass the histogram size: its entropy defaults (128 bins
for 128 quantized bins) leave a single candidate threshold, which makes "entropy"
identical to min-max.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import CalibrationMethod as OrtCalibrationMethod
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

from graylane.artifacts.build_info import CalibrationMethod
from graylane.builder.runtime import complete_feeds
from graylane.builder.samples import SampleSet
from graylane.engine.onnxruntime import CPU
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError

__all__ = [
    "CalibrationError",
    "CalibrationRecord",
    "CalibrationTooSmall",
    "calibrate",
    "calibration_key",
    "check_calibration_size",
]

_CACHE_FORMAT = 1
_ENTROPY_BINS = 512
_ENTROPY_QUANTIZED_BINS = 128
_PERCENTILE_BINS = 2048

ORT_METHODS: Mapping[CalibrationMethod, OrtCalibrationMethod] = {
    CalibrationMethod.ENTROPY: OrtCalibrationMethod.Entropy,
    CalibrationMethod.MINMAX: OrtCalibrationMethod.MinMax,
    CalibrationMethod.PERCENTILE: OrtCalibrationMethod.Percentile,
}


class CalibrationError(GraylaneError):
    """Calibration could not measure activation ranges."""


class CalibrationTooSmall(CalibrationError):
    """The calibration set is under the spec's minimum and the build is not forced."""


def check_calibration_size(count: int, minimum: int, force: bool) -> str:
    """Refuse too small calibration sets unless forced (then: a note saying so).

    Ranges measured on a few inputs miss the activations real traffic produces.
    """
    if count >= minimum:
        return ""
    message = (
        f"the calibration set has {count} samples, under the minimum of {minimum}; "
        "capture more real traffic (graylane calib capture --samples 1000), lower "
        "calibration.min_samples in the spec, or pass --force"
    )
    if not force:
        raise CalibrationTooSmall(message)
    return f" — forced: {message}"


@dataclass(frozen=True)
class CalibrationRecord:
    """How the int8 ranges were obtained, for the manifest."""

    method: CalibrationMethod
    samples: int
    data_digest: str
    cache_key: str
    cache_hit: bool
    cache_path: Path
    duration_s: float
    percentile: float | None = None


def _options(method: CalibrationMethod, percentile: float) -> dict[str, object]:
    # Symmetric ranges: TensorRT accepts only zero-point-0 INT8 Q/DQ.
    if method is CalibrationMethod.ENTROPY:
        return {
            "symmetric": True,
            "num_bins": _ENTROPY_BINS,
            "num_quantized_bins": _ENTROPY_QUANTIZED_BINS,
        }
    if method is CalibrationMethod.PERCENTILE:
        return {"symmetric": True, "num_bins": _PERCENTILE_BINS, "percentile": percentile}
    return {"symmetric": True}


def calibration_key(
    source_sha256: str,
    data_digest: str,
    method: CalibrationMethod,
    percentile: float,
    op_types: tuple[str, ...] | None = None,
) -> str:
    """Content hash naming one calibration result."""
    payload = {
        "format": _CACHE_FORMAT,
        "source_sha256": source_sha256,
        "data": data_digest,
        "method": method.value,
        "options": _options(method, percentile),
        "op_types": sorted(op_types) if op_types else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, samples: SampleSet, model_path: Path) -> None:
        self._batches: Iterator[Mapping[str, np.ndarray]] = iter(samples.batches)
        self._io = IOSignature.from_onnx(onnx.load(str(model_path), load_external_data=False))

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else complete_feeds(self._io, batch)


def calibrate(
    model_path: Path,
    source_sha256: str,
    samples: SampleSet,
    method: CalibrationMethod,
    percentile: float,
    cache_dir: Path,
    use_external_data_format: bool = False,
    op_types: tuple[str, ...] | None = None,
) -> CalibrationRecord:
    """Ranges for ``model_path`` from ``samples``, from the cache when the key matches."""
    key = calibration_key(source_sha256, samples.digest, method, percentile, op_types)
    cache_path = cache_dir / f"{key}.json"
    start = time.perf_counter()
    hit = cache_path.is_file()
    if not hit:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="graylane-calib-") as tmp:
            try:
                calibrator = create_calibrator(
                    model_path,
                    list(op_types) if op_types else None,
                    augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                    calibrate_method=ORT_METHODS[method],
                    use_external_data_format=use_external_data_format,
                    providers=[CPU],  # ranges do not depend on the device
                    extra_options=_options(method, percentile),
                )
                # The histogram calibrators print their progress; keep the console ours.
                with contextlib.redirect_stdout(io.StringIO()):
                    calibrator.collect_data(_Reader(samples, model_path))
                    ranges = calibrator.compute_data()
            except Exception as exc:  # onnxruntime raises untyped errors here
                raise CalibrationError(f"calibration ({method.value}) failed: {exc}") from None
        # Write then rename, so a crash never leaves a half-written cache entry.
        partial = cache_path.with_name(f"{key}.{os.getpid()}.partial")
        save_tensors_data(ranges, partial)
        os.replace(partial, cache_path)
    return CalibrationRecord(
        method=method,
        samples=samples.count,
        data_digest=samples.digest,
        cache_key=key,
        cache_hit=hit,
        cache_path=cache_path,
        duration_s=time.perf_counter() - start,
        percentile=percentile if method is CalibrationMethod.PERCENTILE else None,
    )
