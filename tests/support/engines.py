"""Engines that wrap a real one, for tests that watch or break what a worker runs."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.engine_worker.faults import extends_cache

__all__ = ["DelegatingEngine", "GatedDecodeSteps"]


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


class GatedDecodeSteps(DelegatingEngine):
    """A KV-cache engine whose decode steps wait while its gate is shut.

    Prefills run; once shut, a step that extends a cache blocks the engine thread (as a
    slow engine would) until :meth:`open`, after the ``after`` steps :meth:`shut` lets
    through. A test shuts the gate to hold a generation at a known point (some tokens
    out, its end not yet come) and opens it once the event it waits for happened: order
    by events, not by how fast this machine decodes.
    """

    def __init__(self, inner: InferenceEngine, *, wait_s: float = 60.0) -> None:
        super().__init__(inner)
        self._open = threading.Event()
        self._open.set()
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._passes = 0
        self.held = threading.Event()
        """Set once a decode step waits at the shut gate."""

    @property
    def metadata(self) -> Mapping[str, str]:
        """The real engine's model metadata (a tokenizer may be named there)."""
        return getattr(self.inner, "metadata", {})

    def shut(self, *, after: int = 0) -> None:
        """Hold the decode steps that come after the next ``after`` ones."""
        with self._lock:
            self._passes = after
        self.held.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._open.is_set() and extends_cache(feeds):
            with self._lock:
                passing = self._passes > 0
                self._passes -= int(passing)
            if passing:
                return self.inner.run(feeds)
            self.held.set()
            if not self._open.wait(self._wait_s):
                raise RuntimeError(f"the gate stayed shut for {self._wait_s:g} s")
        return self.inner.run(feeds)
