"""Inference engines behind one protocol: ONNX Runtime here, TensorRT on GPUs.

The TensorRT backend is not imported here: ``graylane.engine_worker.engine.tensorrt_backend``
imports ``tensorrt`` only when an engine is loaded.
"""

from graylane.engine_worker.engine.errors import (
    EngineClosedError,
    EngineError,
    EngineLoadError,
    EngineRunError,
    IncompatibleEngineError,
    InvalidInputError,
)
from graylane.engine_worker.engine.protocol import Dim, InferenceEngine, IOSignature, TensorSpec

__all__ = [
    "Dim",
    "EngineClosedError",
    "EngineError",
    "EngineLoadError",
    "EngineRunError",
    "IOSignature",
    "IncompatibleEngineError",
    "InferenceEngine",
    "InvalidInputError",
    "TensorSpec",
]
