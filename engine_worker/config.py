"""A worker's configuration: what it serves and how (read once at start-up)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.artifacts.signing import RefusedArtifact
from graylane.engine.server import EngineEndpoint
from graylane.engine_worker.compute import WarmUpLimits
from graylane.engine_worker.engine_server import EngineServerSettings
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.logic.batching import DEFAULT_BUCKETS
from graylane.engine_worker.logic.streaming import StreamPolicy
from graylane.engine_worker.requests import Tokenizer

__all__ = ["WorkerConfig", "default_worker_id"]


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
    worker exits non-zero (:class:`~graylane.engine_worker.compute.EngineHealth`); 0 = never."""
    tokenizer: Tokenizer | None = None
    """Text for prompts and results; ``None``: the one the model's metadata names, if any."""
    model_info: ModelInfo | None = None
    """Declared task and input vocabulary (from the manifest or the ONNX metadata)."""
    profiles: tuple[ShapeProfile, ...] = ()
    """The artifact's build profiles: warm-up shapes (and buckets: ``profile_buckets``)."""
    standby: bool = False
    """Warm up, then wait out of the group until activated (:func:`wait_for_activation`)."""
    continuous_batching: bool = True
    """GENERATE on a model with a KV cache runs in one continuous decode batch per variant
    (:mod:`~graylane.engine_worker.generation`), not per fetched cycle."""
    max_sequences: int = 0
    """Sequences decoding together (0 = max_batch_size)."""
    max_prefill_tokens: int = 0
    """Prompt tokens prefilled in one decode step (0 = no cap; one prompt always joins)."""
    max_kv_tokens: int = 0
    """Cache positions the running sequences may reserve together (0 = no cap; the CLI
    derives it from ``--kv-cache-mb``: :func:`~graylane.engine_worker.layouts.kv_tokens_for`)."""
    warm_up: WarmUpLimits = field(default_factory=WarmUpLimits)
    """Which shapes are warmed before joining the group, and for how long at most."""
    stream: StreamPolicy = field(default_factory=StreamPolicy)
    """When a streamed generation publishes a chunk (a request may name its own)."""
    max_in_flight: int = 8
    """Fetched cycles whose answers may be unacknowledged at once (offsets are committed
    in order as they are): what lets a request join a running decode batch."""
    refused_artifacts: tuple[RefusedArtifact, ...] = ()
    """Artifacts not loaded because their signature did not verify (counted as
    ``graylane_artifact_verification_failures_total{reason}``)."""
    endpoints: tuple[EngineEndpoint, ...] = ()
    """Serve through these engine servers instead of local engines, one per variant, best
    first (:mod:`~graylane.engine_worker.engine_server`)."""
    engine_server: EngineServerSettings = field(default_factory=EngineServerSettings)
    """How the engine servers are called (with ``endpoints``)."""
