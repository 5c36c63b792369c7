"""Inference engines behind one protocol, shared by the worker, the builder and the benches.

ONNX Runtime (``graylane.engine.onnxruntime``) and TensorRT
(``graylane.engine.tensorrt``) adapters are not imported here: importing this
package needs neither runtime.

Room: the library. May import the library; no service.
"""

from graylane.engine.errors import (
    BadDtype,
    BadShape,
    EngineClosedError,
    EngineError,
    EngineLoadError,
    EngineRunError,
    IncompatibleEngineError,
    InvalidInputError,
    MissingInput,
    UnexpectedInput,
)
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import Dim, IOSignature, TensorSpec

__all__ = [
    "BadDtype",
    "BadShape",
    "Dim",
    "EngineClosedError",
    "EngineError",
    "EngineLoadError",
    "EngineRunError",
    "IOSignature",
    "IncompatibleEngineError",
    "InferenceEngine",
    "InvalidInputError",
    "MissingInput",
    "TensorSpec",
    "UnexpectedInput",
]
