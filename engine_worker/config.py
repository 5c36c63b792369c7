"""Worker configuration (read once at start-up)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.engine_worker.batching import DEFAULT_BUCKETS

if TYPE_CHECKING:
    from graylane.engine_worker.tokenizer import Tokenizer


@dataclass(frozen=True, kw_only=True)
class FaultInjection:
    """Deliberate faults, for tests and demos only: extra latency and failures.

    Applied by :class:`~graylane.engine_worker.faults.FaultyEngine` per engine call.
    """

    extra_latency_ms: float = 0.0
    latency_factor: float = 1.0
    error_rate: float = 0.0
    latency_jitter_ms: float = 0.0
    """Extra latency drawn uniformly from [0, jitter] per batch (a noisy but healthy engine)."""
    seed: int = 0

    @property
    def active(self) -> bool:
        return (
            self.extra_latency_ms > 0
            or self.latency_factor != 1.0
            or self.error_rate > 0
            or self.latency_jitter_ms > 0
        )


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    model: str
    version: str
    initial_variant: str
    max_batch_size: int = 8
    max_wait_ms: int = 5
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_seq_len: int = 256
    max_new_tokens: int = 256
    worker_id: str = field(default_factory=default_worker_id)
    metrics_port: int | None = None
    """Overrides ``GRAYLANE_METRICS_PORT`` (0 = a free port, below 0 = off)."""
    faults: FaultInjection = field(default_factory=FaultInjection)
    group_id: str = ""
    fetch_factor: int = 4
    """Records fetched per cycle = max_batch_size * fetch_factor (then planned into batches)."""
    adaptive_batching: bool = True
    """Learn the batch cap and wait from measured engine time (see batch_learner)."""
    latency_budget_ms: float = 0.0
    """Engine time one batch may take; 0 = no budget (learner and admission)."""
    default_deadline_ms: float = 0.0
    """Deadline of a request that names none, from its creation; 0 = no admission control."""
    engine_failure_limit: int = 5
    """Consecutive failed batches before the engine is reloaded, and after that before the
    worker exits non-zero (:mod:`~graylane.engine_worker.engine_health`); 0 = never."""
    tokenizer: Tokenizer | None = None
    """Text for prompts and results; ``None``: the one the model's metadata names, if any."""
    model_info: ModelInfo | None = None
    """Declared task and input vocabulary (from the manifest or the ONNX metadata)."""
    profiles: tuple[ShapeProfile, ...] = ()
    """The artifact's build profiles: warm-up shapes (and buckets, see ``shapes``)."""
    standby: bool = False
    """Warm up, then wait out of the group until activated (:mod:`.standby`)."""
