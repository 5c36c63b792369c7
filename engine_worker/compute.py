"""Running the worker's engines: planned batches in, per-request outcomes out.

:func:`run_batch` runs one planned batch (items sharing a group key share engine
calls) and :func:`run_isolated` re-runs it item by item when one request's input
fails it. The shapes to warm up and batch with come from the IO signature and
the build profiles (:func:`warm_up_feeds`, :func:`profile_buckets`).

A worker whose engine fails every batch would otherwise answer
``ENGINE_FAILURE`` for ever. :class:`EngineHealth` counts *consecutive* engine
failures: after ``limit`` of them the worker reloads its engines once
(:attr:`EngineVerdict.RELOAD`); if the next ``limit`` batches fail too, it exits
non-zero (:attr:`EngineVerdict.EXIT`), so its supervisor restarts it and a
rollout sees the version as unresponsive. A served batch resets the count and
re-arms the reload. Only engine failures count: input errors (a bad request),
``SHED`` and faults injected on purpose never reach :meth:`EngineHealth.failed`.

:class:`WorkerEngines` is the worker's use of all this: it runs a batch on the
engine thread (so aiokafka's heartbeats keep running on the event loop), measures
the device load, and reloads the engines or gives up as :class:`EngineHealth` says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import TypeVar

import numpy as np

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.derived_inputs import derived_feeds
from graylane.engine.errors import EngineError, EngineRunError, InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature, TensorSpec
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.faults import FaultInjection, InjectedFault, with_faults
from graylane.engine_worker.forward import run_forward
from graylane.engine_worker.kv_decode import Decode, GenerationResult
from graylane.engine_worker.layouts import ATTENTION_MASK, INPUT_IDS, token_layout
from graylane.engine_worker.logic.batching import BucketPolicy
from graylane.engine_worker.requests import TaskKind, WorkItem
from graylane.errors import ErrorCode, GraylaneError, Rejection

__all__ = [
    "BatchRun",
    "EngineConfigError",
    "EngineHealth",
    "EngineVerdict",
    "Feeds",
    "ForwardOutcome",
    "GenerateOutcome",
    "LoadMeter",
    "Outcome",
    "RanBatch",
    "Reloader",
    "WarmUpLimits",
    "WorkerEngines",
    "WorkerGaveUp",
    "engine_rejection",
    "profile_buckets",
    "profile_max_batch",
    "run_batch",
    "run_isolated",
    "warm_up",
    "warm_up_feeds",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


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
    decode: Decode | None = None,
) -> BatchRun:
    """:func:`run_batch`; on an input error, re-run item by item and fail only the bad ones.

    A run failure of a batch of several (one request's input the engine cannot take,
    e.g. an id past an undeclared vocabulary) is isolated the same way: only the items
    that fail alone fail. If every item fails alone, the batch's error is raised.
    Injected faults are never isolated: they stand for a failing engine.
    """
    try:
        return run_batch(engine, items, policy, max_seq_len, pad_id, decode)
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
            alone = run_batch(engine, [item], policy, max_seq_len, pad_id, decode)
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
    decode: Decode | None = None,
) -> BatchRun:
    """Run a planned batch; items sharing a group key share engine calls.

    GENERATE items decode together, each with its own EOS and sampling; ``decode`` (the
    tokenizer's) is what their stop strings are matched on.
    """
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
                [m.eos_id for m in members],
                max_seq_len,
                policy=policy,
                pad_id=pad_id,
                sampling=[m.sampling for m in members],
                decode=decode,
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


@dataclass(frozen=True, kw_only=True)
class WarmUpLimits:
    """What a worker warms before it joins its group: the shapes it will run, in time.

    A decoder's context (8192 positions for SmolLM2) is no warm-up target: a prefill that
    long costs minutes and grows the engine's memory arena by gigabytes that stay held.
    Shapes are warmed shortest first, each engine in turn, up to ``max_len`` tokens, and
    warming stops once ``budget_s`` is spent (what is left is warmed by its first batch).
    """

    max_len: int | None = 512
    """The longest sequence warmed (``None``: every bucket up to the model's limit)."""
    budget_s: float | None = 30.0
    """Wall-clock time warm-up may take (``None``: no limit)."""


def warm_up(
    engines: Iterable[InferenceEngine],
    policy: BucketPolicy,
    max_seq_len: int,
    profiles: Sequence[ShapeProfile] = (),
    info: ModelInfo | None = None,
    limits: WarmUpLimits | None = None,
) -> int:
    """Run every engine once per warm-up shape (:func:`warm_up_feeds`) within ``limits``;
    the runs.

    A shape an engine refuses is logged and skipped: warm-up never stops a worker.
    """
    limits = limits or WarmUpLimits()
    started = time.perf_counter()
    cap = max_seq_len if limits.max_len is None else min(max_seq_len, limits.max_len)
    plans = [
        (engine, sorted(warm_up_feeds(engine.io, profiles, policy.buckets, cap, info), key=_size))
        for engine in engines
    ]
    runs = skipped = 0
    for engine, shapes in plans:
        for feeds in shapes:
            if limits.budget_s is not None and time.perf_counter() - started > limits.budget_s:
                skipped += 1
                continue
            try:
                engine.run(feeds)
            except EngineError as exc:
                dims = {k: v.shape for k, v in feeds.items()}
                log.warning("warm-up of %s at %s skipped: %s", engine.variant, dims, exc)
                continue
            runs += 1
    if skipped:
        log.info(
            "warm-up budget of %.0fs spent: %d shape(s) left to their first batch",
            limits.budget_s or 0.0,
            skipped,
        )
    return runs


def _size(feeds: Feeds) -> int:
    return sum(int(v.size) for v in feeds.values())


# --- shapes to warm up and batch with ---------------------------------------------------


Feeds = dict[str, np.ndarray]


def _token_input(info: ModelInfo | None) -> str:
    return info.token_input if info is not None and info.token_input else INPUT_IDS


def profile_buckets(
    profiles: Sequence[ShapeProfile], info: ModelInfo | None, max_seq_len: int
) -> tuple[int, ...] | None:
    """Sequence buckets from the profiles' opt and max lengths of the token input (≤ max).

    ``None`` when no profile gives the token input a sequence axis.
    """
    name = _token_input(info)
    lengths: set[int] = set()
    for profile in profiles:
        rng = profile.for_input(name)
        if rng is None or len(rng.opt) < 2:
            continue
        lengths.update(d for d in (rng.opt[1], rng.max[1]) if d <= max_seq_len)
    return tuple(sorted(lengths)) or None


def profile_max_batch(profiles: Sequence[ShapeProfile]) -> int | None:
    """The largest batch (axis 0 of ``max``) every input accepts in some profile, if any."""
    best: int | None = None
    for profile in profiles:
        if profile.shapes:
            rows = min(rng.max[0] for rng in profile.shapes if rng.max)
            best = rows if best is None else max(best, rows)
    return best


def warm_up_feeds(
    io: IOSignature,
    profiles: Sequence[ShapeProfile],
    buckets: Sequence[int],
    max_seq_len: int,
    info: ModelInfo | None = None,
) -> list[Feeds]:
    """One feed set per shape to warm up: each profile's opt shape, else per bucket.

    Inputs a token model derives (positions, a decoder's past) are filled as a
    forward pass fills them: an empty past, positions along the mask.
    """
    layout = token_layout(io)
    if profiles:
        found = [_feeds(io, _profile_dims(io, p), info) for p in profiles]
    elif layout is not None:
        seq = io.input(INPUT_IDS).shape[1]
        symbol = seq if isinstance(seq, str) else None
        found = [
            _feeds(io, _fill(io, {symbol: b} if symbol else {}, seq_len=b), info)
            for b in buckets
            if b <= max_seq_len
        ]
    else:
        return [_feeds(io, _fill(io, {}), info)]
    if layout is not None and layout.derived:
        for feeds in found:
            mask = feeds.get(ATTENTION_MASK, np.ones_like(feeds[INPUT_IDS]))
            feeds.update(derived_feeds(io, mask))
    return found


def _profile_dims(io: IOSignature, profile: ShapeProfile) -> dict[str, tuple[int, ...]]:
    """Shapes per input: the profile's opt, and for inputs it does not name, the declared
    shape with symbolic dims resolved from the named ones (else 1)."""
    symbols: dict[str, int] = {}
    for spec in io.inputs:
        rng = profile.for_input(spec.name)
        if rng is not None and len(rng.opt) == spec.rank:
            for dim, value in zip(spec.shape, rng.opt, strict=True):
                if isinstance(dim, str):
                    symbols.setdefault(dim, value)
    shapes = _fill(io, symbols)
    for spec in io.inputs:
        rng = profile.for_input(spec.name)
        if rng is not None and len(rng.opt) == spec.rank:
            shapes[spec.name] = tuple(rng.opt)
    return shapes


def _fill(
    io: IOSignature, symbols: dict[str, int], seq_len: int | None = None
) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in io.inputs:
        dims: list[int] = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int):
                dims.append(dim)
            elif isinstance(dim, str) and dim in symbols:
                dims.append(symbols[dim])
            elif seq_len is not None and axis == 1:
                dims.append(seq_len)
            else:
                dims.append(1)
        shapes[spec.name] = tuple(dims)
    return shapes


def _feeds(io: IOSignature, shapes: dict[str, tuple[int, ...]], info: ModelInfo | None) -> Feeds:
    return {spec.name: _value(spec, shapes[spec.name], info) for spec in io.inputs}


def _value(spec: TensorSpec, shape: tuple[int, ...], info: ModelInfo | None) -> np.ndarray:
    """Ones for integers (a valid id and an open mask), zeros for floats, true for booleans."""
    dtype = np.dtype(spec.dtype)
    if dtype.kind in "iu":
        vocab = info.vocab_size if info is not None else None
        fill = 0 if vocab == 1 else 1
        return np.full(shape, fill, dtype=dtype)
    if dtype == np.bool_:
        return np.ones(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype)


# --- failures -------------------------------------------------------------------------


def engine_rejection(exc: EngineError) -> Rejection:
    """The error result for a batch whose engine failed: its own code if it has one."""
    if isinstance(exc, InjectedFault):
        return Rejection(ErrorCode.INJECTED_FAULT, str(exc))
    return Rejection(ErrorCode.ENGINE_FAILURE, f"engine failed: {exc}")


class EngineConfigError(GraylaneError, ValueError):
    """An engine failure limit below zero."""


class EngineVerdict(Enum):
    CONTINUE = "continue"
    """Keep serving with the engine as it is."""
    RELOAD = "reload"
    """Reload the engines (same variants, same artifacts) once."""
    EXIT = "exit"
    """The reload did not help: end the worker with a non-zero status."""


class WorkerGaveUp(GraylaneError):
    """The engine kept failing after a reload; the worker ends (its supervisor restarts it)."""


@dataclass
class EngineHealth:
    """Consecutive engine failures of one worker, and whether it already reloaded."""

    limit: int = 5
    """Consecutive failed batches before a reload (and again before giving up); 0 = never."""
    consecutive: int = 0
    reloaded: bool = False
    last_error: str = ""

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise EngineConfigError(f"engine failure limit must be >= 0, got {self.limit}")

    def served(self) -> None:
        """A batch ran on the engine (input errors of single items included)."""
        self.consecutive = 0
        self.reloaded = False

    def failed(self, reason: str) -> EngineVerdict:
        """A batch failed in the engine; what the worker must do now."""
        self.last_error = reason
        if self.limit == 0:
            return EngineVerdict.CONTINUE
        self.consecutive += 1
        if self.consecutive < self.limit:
            return EngineVerdict.CONTINUE
        self.consecutive = 0
        if self.reloaded:
            return EngineVerdict.EXIT
        self.reloaded = True
        return EngineVerdict.RELOAD

    def give_up(self) -> WorkerGaveUp:
        return WorkerGaveUp(
            f"engine failed {self.limit} consecutive batches after a reload; "
            f"last error: {self.last_error}"
        )


# --- the worker's engines ---------------------------------------------------------------


class LoadMeter:
    """Busy share of the engine over a sliding few seconds (the device load signal)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._window_s = window_s
        self._start = time.monotonic()
        self._busy = 0.0
        self._last = 0.0

    def add(self, busy_s: float) -> float:
        now = time.monotonic()
        self._busy += busy_s
        elapsed = now - self._start
        self._last = min(1.0, self._busy / elapsed) if elapsed > 0 else 0.0
        if elapsed > self._window_s:
            self._start, self._busy = now, 0.0
        return self._last


Reloader = Callable[[], Mapping[str, InferenceEngine]]
"""Loads the worker's engines again, exactly as at start-up."""


@dataclass(frozen=True)
class RanBatch:
    """One batch through the engine: its run, the failure all its items share, the load."""

    run: BatchRun
    failure: Rejection | None
    device_load: float


class WorkerEngines:
    """The worker's engines on one engine thread, reloaded or given up on as health says.

    ``reload`` loads the engines again (same variants and artifacts, digests verified
    again) for a broken engine; ``give_up`` receives the :class:`WorkerGaveUp` that ends
    the worker once the current cycle is answered and committed; ``active`` names the
    variant a reload must not lose; ``decode`` is the tokenizer's (for stop strings).
    """

    def __init__(
        self,
        engines: Mapping[str, InferenceEngine],
        faults: FaultInjection,
        *,
        policy: BucketPolicy,
        max_seq_len: int,
        failure_limit: int,
        reload: Reloader | None,
        give_up: Callable[[BaseException], None],
        active: Callable[[], str],
        decode: Decode | None = None,
    ) -> None:
        self.plain = dict(engines)
        """Without fault injection: warm-up runs these."""
        self.engines = with_faults(engines, faults)
        self.policy = policy
        self.max_seq_len = max_seq_len
        self.health = EngineHealth(failure_limit)
        self._faults = faults
        self._reload = reload
        self._give_up = give_up
        self._active = active
        self._decode = decode
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._load = LoadMeter()

    async def in_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the engine thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def run(
        self, variant: str, items: Sequence[WorkItem], fallback: InferenceEngine
    ) -> RanBatch:
        """Run one planned batch; an engine failure or an unknown exception fails it whole.

        ``fallback`` runs when ``variant`` was lost by a reload since the cycle began.
        """
        engine = self.engines.get(variant, fallback)
        failure: Rejection | None = None
        try:
            batch = partial(
                run_isolated, engine, items, self.policy, self.max_seq_len, decode=self._decode
            )
            run = await asyncio.get_running_loop().run_in_executor(self._executor, batch)
            if run.outcomes:
                self.health.served()
        except EngineError as exc:
            if not isinstance(exc, InjectedFault):
                log.exception("engine failure on a batch of %d", len(items))
                await self.engine_failed(exc)
            run, failure = BatchRun({}, 0.0, 0), engine_rejection(exc)
        except Exception as exc:
            log.exception("unexpected error running a batch of %d", len(items))
            run = BatchRun({}, 0.0, 0)
            failure = Rejection(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        return RanBatch(run, failure, self._load.add(run.compute_ms / 1000.0))

    def note_busy(self, busy_s: float) -> float:
        """Engine time spent outside :meth:`run` (decode steps); the device load."""
        return self._load.add(busy_s)

    @property
    def device_load(self) -> float:
        return self._load.add(0.0)

    async def engine_failed(self, exc: EngineError) -> None:
        """Count a failed batch; reload the engines or give up when :class:`EngineHealth` says.

        Injected faults stand for a failing engine but are not counted (see the module)."""
        if isinstance(exc, InjectedFault):
            return
        reason = f"{type(exc).__name__}: {exc}"
        verdict = self.health.failed(reason)
        if verdict is EngineVerdict.EXIT:
            gave_up = self.health.give_up()
            log.critical("%s; the worker stops", gave_up)
            self._give_up(gave_up)
            return
        if verdict is EngineVerdict.CONTINUE:
            return
        if self._reload is None:
            log.error(
                "engine failed %d consecutive batches (%s); no loader to reload it with",
                self.health.limit,
                reason,
            )
            return
        log.error(
            "engine failed %d consecutive batches (%s); reloading it", self.health.limit, reason
        )
        try:
            fresh = dict(await self.in_thread(self._reload))
        except Exception as err:
            lost = WorkerGaveUp(f"engine reload failed: {type(err).__name__}: {err}")
            log.critical("%s; the worker stops", lost)
            self._give_up(lost)
            return
        log.warning("engine reloaded: %s", sorted(fresh))
        active = self._active()
        if active not in fresh:
            self._give_up(WorkerGaveUp(f"reload lost variant {active!r}"))
            return
        old, self.plain = self.plain, fresh
        self.engines = with_faults(fresh, self._faults)
        for engine in old.values():
            engine.close()

    def close(self) -> None:
        self._executor.shutdown(wait=False)
