"""One planned batch through an engine: requests in, per-request outcomes out (pure)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.errors import EngineError, EngineRunError, InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.batching import BucketPolicy
from graylane.engine_worker.faults import InjectedFault
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.engine_worker.shapes import warm_up_feeds
from graylane.engine_worker.tasks import GenerationResult, run_forward, run_generate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardOutcome:
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class GenerateOutcome:
    result: GenerationResult


Outcome = ForwardOutcome | GenerateOutcome


@dataclass(frozen=True)
class BatchRun:
    outcomes: dict[int, Outcome]
    """Outcome per WorkItem.index."""
    compute_ms: float
    engine_calls: int
    input_errors: dict[int, InvalidInputError] = field(default_factory=dict)
    """Items the engine refused for their own input (by WorkItem.index)."""
    engine_errors: dict[int, EngineRunError] = field(default_factory=dict)
    """Items the engine failed on when run alone, while their batch-mates ran."""


def run_isolated(
    engine: InferenceEngine,
    items: Sequence[WorkItem],
    policy: BucketPolicy,
    max_seq_len: int,
    pad_id: int = 0,
) -> BatchRun:
    """:func:`run_batch`; on an input error, re-run item by item and fail only the bad ones.

    A run failure of a batch of several (one request's input the engine cannot take,
    e.g. an id past an undeclared vocabulary) is isolated the same way: only the items
    that fail alone fail. If every item fails alone, the batch's error is raised.
    Injected faults are never isolated: they stand for a failing engine.
    """
    try:
        return run_batch(engine, items, policy, max_seq_len, pad_id)
    except InvalidInputError as exc:
        if len(items) == 1:
            return BatchRun({}, 0.0, 1, {items[0].index: exc})
        first: EngineRunError | None = None
    except EngineRunError as exc:
        if len(items) == 1 or isinstance(exc, InjectedFault):
            raise
        first = exc
    outcomes: dict[int, Outcome] = {}
    failed: dict[int, InvalidInputError] = {}
    broken: dict[int, EngineRunError] = {}
    compute_ms, calls = 0.0, 0
    for item in items:
        try:
            alone = run_batch(engine, [item], policy, max_seq_len, pad_id)
        except InvalidInputError as exc:
            failed[item.index] = exc
            calls += 1
            continue
        except EngineRunError as exc:
            broken[item.index] = exc
            calls += 1
            continue
        outcomes.update(alone.outcomes)
        compute_ms += alone.compute_ms
        calls += alone.engine_calls
    if first is not None and len(broken) == len(items):
        raise first
    return BatchRun(outcomes, compute_ms, calls, failed, broken)


def run_batch(
    engine: InferenceEngine,
    items: Sequence[WorkItem],
    policy: BucketPolicy,
    max_seq_len: int,
    pad_id: int = 0,
) -> BatchRun:
    """Run a planned batch; items sharing a group key share engine calls."""
    started = time.perf_counter()
    groups: dict[tuple[object, ...], list[WorkItem]] = {}
    for item in items:
        groups.setdefault(item.group_key, []).append(item)
    outcomes: dict[int, Outcome] = {}
    calls = 0
    for members in groups.values():
        first = members[0]
        calls += 1
        if first.task is TaskKind.GENERATE:
            results = run_generate(
                engine,
                [m.prompt_tokens for m in members],
                [m.max_new_tokens for m in members],
                first.eos_id,
                max_seq_len,
                policy=policy,
                pad_id=pad_id,
            )
            for m, r in zip(members, results, strict=True):
                outcomes[m.index] = GenerateOutcome(r)
        else:
            outs = run_forward(
                engine,
                [m.feeds for m in members],
                first.post,
                first.top_k,
                policy=policy,
                pad_id=pad_id,
            )
            for m, o in zip(members, outs, strict=True):
                outcomes[m.index] = ForwardOutcome(o)
    return BatchRun(outcomes, (time.perf_counter() - started) * 1000.0, calls)


def warm_up(
    engines: Iterable[InferenceEngine],
    policy: BucketPolicy,
    max_seq_len: int,
    profiles: Sequence[ShapeProfile] = (),
    info: ModelInfo | None = None,
) -> int:
    """Run every engine once per warm-up shape (:func:`~.shapes.warm_up_feeds`); the runs.

    A shape an engine refuses is logged and skipped: warm-up never stops a worker.
    """
    runs = 0
    for engine in engines:
        for feeds in warm_up_feeds(engine.io, profiles, policy.buckets, max_seq_len, info):
            try:
                engine.run(feeds)
            except EngineError as exc:
                shapes = {k: v.shape for k, v in feeds.items()}
                log.warning("warm-up of %s at %s skipped: %s", engine.variant, shapes, exc)
                continue
            runs += 1
    return runs
