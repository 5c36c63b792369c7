"""Deliberate faults as an engine: a wrapper that slows down or fails a real engine.

For tests and demos only (:class:`FaultInjection`).
The wrapper implements :class:`~graylane.engine.protocol.InferenceEngine`, so the
worker runs it like any engine and needs no fault code of its own. Faults apply
per engine call: a forward batch is one call per bucket group, a generation one
call per decoding step (``decode_step_latency_ms`` slows only the steps that
extend a KV cache: a slower time per output token with the same prefill).
Latency is spent inside ``run`` on the engine thread,
exactly like a slower engine, so it shows in compute time and device load.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from graylane.engine.errors import EngineRunError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature
from graylane.errors import ErrorCode

__all__ = ["FaultInjection", "FaultyEngine", "InjectedFault", "extends_cache", "with_faults"]


@dataclass(frozen=True, kw_only=True)
class FaultInjection:
    """Deliberate faults, for tests and demos only: extra latency and failures.

    Applied by :class:`FaultyEngine` per engine call.
    """

    extra_latency_ms: float = 0.0
    latency_factor: float = 1.0
    error_rate: float = 0.0
    latency_jitter_ms: float = 0.0
    """Extra latency drawn uniformly from [0, jitter] per batch (a noisy but healthy engine)."""
    decode_step_latency_ms: float = 0.0
    """Extra latency per decode step of a KV-cache generation (a call whose past is not
    empty), not per prefill: the time per output token grows, the prefill does not."""
    seed: int = 0

    @property
    def active(self) -> bool:
        return (
            self.extra_latency_ms > 0
            or self.latency_factor != 1.0
            or self.error_rate > 0
            or self.latency_jitter_ms > 0
            or self.decode_step_latency_ms > 0
        )


class InjectedFault(EngineRunError):
    """A failure injected on purpose (answered with ``INJECTED_FAULT``)."""

    code = ErrorCode.INJECTED_FAULT


class FaultyEngine:
    """``inner`` with extra latency and random failures as ``faults`` asks."""

    def __init__(
        self,
        inner: InferenceEngine,
        faults: FaultInjection,
        rng: random.Random,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._inner = inner
        self._faults = faults
        self._rng = rng
        self._sleep = sleep

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def variant(self) -> str:
        return self._inner.variant

    @property
    def io(self) -> IOSignature:
        return self._inner.io

    @property
    def inner(self) -> InferenceEngine:
        return self._inner

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        faults = self._faults
        if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
            raise InjectedFault("fault injected for testing")
        started = time.perf_counter()
        outputs = self._inner.run(feeds)
        compute_s = time.perf_counter() - started
        extra_s = faults.extra_latency_ms / 1000.0 + compute_s * max(
            0.0, faults.latency_factor - 1.0
        )
        if faults.latency_jitter_ms > 0:
            extra_s += self._rng.uniform(0.0, faults.latency_jitter_ms) / 1000.0
        if faults.decode_step_latency_ms > 0 and extends_cache(feeds):
            extra_s += faults.decode_step_latency_ms / 1000.0
        if extra_s > 0:
            self._sleep(extra_s)
        return outputs

    def close(self) -> None:
        self._inner.close()

    def __repr__(self) -> str:
        return f"FaultyEngine({self._inner!r}, {self._faults!r})"


def extends_cache(feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether ``feeds`` are a decode step: a past (``past_key_values.N.*``, shaped
    [rows, heads, width, head_dim]) that is not empty."""
    return any(
        name.startswith("past_key_values.") and value.ndim == 4 and value.shape[2] > 0
        for name, value in feeds.items()
    )


def with_faults(
    engines: Mapping[str, InferenceEngine], faults: FaultInjection
) -> dict[str, InferenceEngine]:
    """Every engine wrapped when ``faults`` is active (one seeded RNG for all), else as is."""
    if not faults.active:
        return dict(engines)
    rng = random.Random(faults.seed)
    return {name: FaultyEngine(engine, faults, rng) for name, engine in engines.items()}
