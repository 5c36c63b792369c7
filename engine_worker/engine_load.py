"""An engine server's own load: its waiting and running requests and KV-cache use (pure).

A worker that serves through an engine server knows the calls it has in flight and
those it holds back, but not how full the engine's KV cache is, nor what other
clients queue there. Each engine publishes that itself; the worker reads it every
second (:mod:`~graylane.engine_worker.engine_server`) and feeds it into the same
decode-load telemetry the native decoder sends (waiting sequences, KV-cache occupancy),
which the QoS controller and scale-out read.

What is read, per engine (:class:`~graylane.artifacts.naming.Backend`): waiting, running,
KV-cache occupancy (0..1).

- **vLLM**, ``/metrics``: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc`` (before its v1 engine: ``vllm:gpu_cache_usage_perc``);
- **SGLang**, ``/metrics``: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``,
  ``sglang:token_usage``;
- **llama.cpp**, ``/metrics``: ``llamacpp:requests_deferred``,
  ``llamacpp:requests_processing``; and ``/slots``: the tokens the busy slots hold (prompt
  and generated) over every slot's ``n_ctx`` is its KV-cache occupancy;
- **TensorRT-LLM**, ``/metrics`` (JSON iteration statistics, the newest):
  ``numQueuedRequests``, ``numActiveRequests``, ``kvCacheStats.usedNumBlocks`` over
  ``kvCacheStats.maxNumBlocks``.

Labelled series of one metric are summed (one engine serving several models counts
its whole queue). A figure an engine does not publish is ``None``: the worker then
uses its own count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from graylane.artifacts.naming import Backend

__all__ = [
    "METRIC_NAMES",
    "EngineLoad",
    "MetricNames",
    "llamacpp_slots",
    "load_paths",
    "parse_prometheus",
    "prometheus_load",
    "read_load",
    "trtllm_iteration_stats",
]


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine said of its load; ``None`` where it says nothing."""

    waiting: int | None = None
    running: int | None = None
    kv_cache_occupancy: float | None = None

    def merged(self, other: EngineLoad) -> EngineLoad:
        """``self`` with the figures it lacks taken from ``other``."""
        return EngineLoad(
            self.waiting if self.waiting is not None else other.waiting,
            self.running if self.running is not None else other.running,
            self.kv_cache_occupancy
            if self.kv_cache_occupancy is not None
            else other.kv_cache_occupancy,
        )


@dataclass(frozen=True, slots=True)
class MetricNames:
    """An engine's Prometheus metric names (the first of each tuple that is present)."""

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_cache: tuple[str, ...] = ()


METRIC_NAMES: Mapping[Backend, MetricNames] = {
    Backend.VLLM: MetricNames(
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    Backend.SGLANG: MetricNames(
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_cache=("sglang:token_usage",),
    ),
    Backend.LLAMACPP: MetricNames(
        waiting=("llamacpp:requests_deferred",),
        running=("llamacpp:requests_processing",),
    ),
}
"""Prometheus names per engine; TRT-LLM publishes JSON instead (see the table above)."""


def load_paths(backend: Backend) -> tuple[str, ...]:
    """The paths of an engine that tell its load, read in this order."""
    if backend is Backend.LLAMACPP:
        return ("/metrics", "/slots")
    return ("/metrics",)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values of a Prometheus text exposition, summed over each metric's labels.

    Comments, blank lines and unreadable lines are skipped (a partial answer is still
    read); non-finite values are left out.
    """
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                continue
            name, rest = line[:brace], line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            values[name] = values.get(name, 0.0) + value
    return values


def _first(values: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _count(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))


def _fraction(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


def prometheus_load(backend: Backend, text: str) -> EngineLoad:
    """The load an engine's ``/metrics`` text tells (nothing for an engine not mapped)."""
    names = METRIC_NAMES.get(backend)
    if names is None:
        return EngineLoad()
    values = parse_prometheus(text)
    return EngineLoad(
        waiting=_count(_first(values, names.waiting)),
        running=_count(_first(values, names.running)),
        kv_cache_occupancy=_fraction(_first(values, names.kv_cache)),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def llamacpp_slots(text: str) -> EngineLoad:
    """llama.cpp's ``/slots``: the busy slots, and the tokens they hold (prompt and
    generated) over every slot's context: its KV-cache occupancy."""
    try:
        slots = json.loads(text)
    except (ValueError, RecursionError):
        return EngineLoad()
    if not isinstance(slots, list):
        return EngineLoad()
    capacity = held = busy = 0
    for slot in slots:
        if not isinstance(slot, dict):
            continue
        capacity += _int(slot.get("n_ctx"))
        if slot.get("is_processing") is True:
            busy += 1
            held += _int(slot.get("n_prompt_tokens"))
            steps = slot.get("next_token")
            if isinstance(steps, list) and steps and isinstance(steps[0], dict):
                held += _int(steps[0].get("n_decoded"))
    if capacity == 0:
        return EngineLoad(running=busy)
    return EngineLoad(running=busy, kv_cache_occupancy=min(1.0, held / capacity))


def trtllm_iteration_stats(text: str) -> EngineLoad:
    """TensorRT-LLM's ``/metrics``: a JSON list of iteration statistics; the newest
    one's queued and active requests and KV-cache blocks in use."""
    try:
        stats = json.loads(text)
    except (ValueError, RecursionError):
        return EngineLoad()
    if isinstance(stats, list):
        stats = stats[-1] if stats else None
    if not isinstance(stats, dict):
        return EngineLoad()
    kv = stats.get("kvCacheStats")
    occupancy = None
    if isinstance(kv, dict) and _int(kv.get("maxNumBlocks")):
        occupancy = min(1.0, _int(kv.get("usedNumBlocks")) / _int(kv.get("maxNumBlocks")))
    queued, active = stats.get("numQueuedRequests"), stats.get("numActiveRequests")
    return EngineLoad(
        waiting=_int(queued) if isinstance(queued, int) else None,
        running=_int(active) if isinstance(active, int) else None,
        kv_cache_occupancy=occupancy,
    )


def read_load(backend: Backend, answers: Mapping[str, str]) -> EngineLoad:
    """The load the answers of :func:`load_paths` tell (a path that did not answer is
    missing from ``answers``)."""
    if backend is Backend.TRTLLM:
        return trtllm_iteration_stats(answers.get("/metrics", ""))
    load = prometheus_load(backend, answers.get("/metrics", ""))
    if backend is Backend.LLAMACPP and "/slots" in answers:
        load = load.merged(llamacpp_slots(answers["/slots"]))
    return load
