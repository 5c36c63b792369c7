"""The seam between Graylane and an inference runtime (ONNX Runtime, TensorRT)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from graylane.engine.signature import IOSignature

__all__ = ["InferenceEngine"]


@runtime_checkable
class InferenceEngine(Protocol):
    """A loaded engine variant that runs one batch at a time.

    ``run`` may be called from a worker thread; implementations release the GIL
    while computing. Errors are :class:`~graylane.engine.errors.EngineError`.
    """

    @property
    def name(self) -> str:
        """Model name (or file stem) this engine was loaded from."""
        ...

    @property
    def variant(self) -> str:
        """Precision variant label as in the artifact name, e.g. ``fp32`` or ``int8``."""
        ...

    @property
    def io(self) -> IOSignature: ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...
