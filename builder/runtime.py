"""The builder's handle on the one ONNX Runtime adapter (:mod:`graylane.engine.onnxruntime`).

Validation, fp16 kernel probing and ``graylane bench variants`` run a variant
through exactly the session configuration a worker serves it with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.engine.errors import EngineError
from graylane.engine.onnxruntime import OnnxRuntimeEngine

__all__ = ["OrtRunner", "VariantLoadError", "open_runner"]

VariantLoadError = EngineError
"""ONNX Runtime cannot load or run a variant on this machine (any engine error)."""


@dataclass(frozen=True)
class OrtRunner:
    """A loaded variant; call it with feeds to get named outputs."""

    engine: OnnxRuntimeEngine
    path: Path

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.run(feeds)


def open_runner(path: Path, threads: int | None = None) -> OrtRunner:
    """Load ``path`` as the worker would (same session options and providers).

    The variant label is the folder name: variants are written to ``<work>/<precision>/``.
    """
    engine = OnnxRuntimeEngine.load(path, path.parent.name, intra_op_threads=threads)
    return OrtRunner(engine=engine, path=path)
