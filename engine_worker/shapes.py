"""Shapes the worker warms up and batches with, from the IO signature and the build profiles.

Pure numpy: no input names are assumed. With build profiles, every profile's
``opt`` shape is warmed up and the sequence buckets are the profiles' ``opt`` and
``max`` lengths of the token input; without them, a token model is warmed once
per bucket and any other model once with every dynamic dimension at 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.model_info import ModelInfo
from graylane.engine.signature import IOSignature, TensorSpec
from graylane.engine_worker.tasks import INPUT_IDS, token_layout

__all__ = ["Feeds", "profile_buckets", "profile_max_batch", "warm_up_feeds"]

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
    """One feed set per shape to warm up: each profile's opt shape, else per bucket."""
    if profiles:
        return [_feeds(io, _profile_dims(io, p), info) for p in profiles]
    if token_layout(io) is not None:
        seq = next(s for s in io.inputs if s.rank == 2).shape[1]
        symbol = seq if isinstance(seq, str) else None
        return [
            _feeds(io, _fill(io, {symbol: b} if symbol else {}, seq_len=b), info)
            for b in buckets
            if b <= max_seq_len
        ]
    return [_feeds(io, _fill(io, {}), info)]


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
