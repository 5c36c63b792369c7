"""ONNX Runtime sessions for building, validating and benchmarking variants (CPU)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

__all__ = ["OrtRunner", "VariantLoadError", "open_runner"]


class VariantLoadError(RuntimeError):
    """ONNX Runtime cannot load or run a variant on this machine."""


@dataclass(frozen=True)
class OrtRunner:
    """A loaded session; call it with feeds to get named outputs."""

    session: ort.InferenceSession
    path: Path

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        try:
            values = self.session.run(names, dict(feeds))
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise VariantLoadError(f"{self.path.name}: inference failed: {exc}") from None
        return {n: np.asarray(v) for n, v in zip(names, values, strict=True)}


def open_runner(path: Path, threads: int | None = None) -> OrtRunner:
    """Open ``path`` on the CPU execution provider with quiet logging."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    try:
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise VariantLoadError(f"{path.name}: ONNX Runtime cannot load it: {exc}") from None
    return OrtRunner(session=session, path=path)
