"""Engines that wrap a real one, for tests that watch or break what a worker runs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graylane.engine import InferenceEngine, IOSignature

__all__ = ["DelegatingEngine"]


class DelegatingEngine:
    """An :class:`InferenceEngine` that hands every call to ``inner``.

    Subclasses override what the test watches (``run``, ``io``, ``close``); the rest stays
    the real engine's.
    """

    def __init__(self, inner: InferenceEngine) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def variant(self) -> str:
        return self.inner.variant

    @property
    def io(self) -> IOSignature:
        return self.inner.io

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.inner.run(feeds)

    def close(self) -> None:
        self.inner.close()
