"""Samples from recorded requests: de-duplicated, split, stratified by length, padded.

Pure: rows in, arrays and counts out. A row is one request's inputs without the
batch axis; its *length* is the number of real tokens (``attention_mask`` sum, or
the first axis of ``input_ids``, or of the first input). Rows are split into a
calibration part and a held-out part by a hash of their content, so
``calib capture`` and ``check consistency --data recorded`` never share a sample
however often either runs. Selection is stratified: every length bucket that has
rows gets an equal share of the samples (unused share passes to the others), so
short and long inputs are both covered however skewed the traffic is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_BUCKET_EDGES",
    "BucketCount",
    "CaptureError",
    "RecordedRow",
    "Selection",
    "Split",
    "bucket_of",
    "dedupe",
    "row_digest",
    "select_stratified",
    "split_of",
    "to_columns",
]

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds (inclusive) of the length buckets; longer rows fall in a last, open bucket."""

HELD_OUT_EVERY = 5
"""One row in five (by content hash) is held out for validation and consistency checks."""

INPUT_IDS, ATTENTION_MASK = "input_ids", "attention_mask"


class CaptureError(GraylaneError, ValueError):
    """Recorded traffic cannot give the samples asked for."""


class Split(Enum):
    """Which part of the recorded rows a reader wants."""

    CALIBRATION = "calibration"
    HELD_OUT = "held-out"


@dataclass(frozen=True)
class RecordedRow:
    """One recorded request's inputs (no batch axis) and when it was recorded."""

    feeds: Mapping[str, np.ndarray]
    timestamp_ms: int = 0

    @property
    def length(self) -> int:
        if ATTENTION_MASK in self.feeds:
            return int(np.asarray(self.feeds[ATTENTION_MASK]).sum())
        first = (
            self.feeds[INPUT_IDS] if INPUT_IDS in self.feeds else next(iter(self.feeds.values()))
        )
        return int(first.shape[0]) if first.ndim else 1


def row_digest(row: RecordedRow) -> str:
    """Content hash of a row: names, dtypes, shapes and bytes of its real part."""
    sha = hashlib.sha256()
    for name in sorted(row.feeds):
        array = np.ascontiguousarray(row.feeds[name])
        sha.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def split_of(digest: str) -> Split:
    return Split.HELD_OUT if int(digest[:8], 16) % HELD_OUT_EVERY == 0 else Split.CALIBRATION


def dedupe(rows: Iterable[RecordedRow]) -> tuple[list[tuple[str, RecordedRow]], int]:
    """(unique rows with their digests, in first-seen order; number of duplicates dropped)."""
    seen: set[str] = set()
    unique: list[tuple[str, RecordedRow]] = []
    dropped = 0
    for row in rows:
        digest = row_digest(row)
        if digest in seen:
            dropped += 1
            continue
        seen.add(digest)
        unique.append((digest, row))
    return unique, dropped


def bucket_of(length: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding ``length``: first edge >= length, else the open last one."""
    for i, edge in enumerate(edges):
        if length <= edge:
            return i
    return len(edges)


@dataclass(frozen=True)
class BucketCount:
    """One length bucket: ``low < length <= high`` (``high`` None: open)."""

    low: int
    high: int | None
    available: int
    selected: int


@dataclass(frozen=True)
class Selection:
    rows: tuple[RecordedRow, ...]
    buckets: tuple[BucketCount, ...]


def _shares(sizes: Sequence[int], total: int) -> list[int]:
    """Water-filling: equal shares per bucket, a small bucket's unused share goes to the rest."""
    shares = [0] * len(sizes)
    left = min(total, sum(sizes))
    open_ = [i for i, s in enumerate(sizes) if s > 0]
    while left > 0 and open_:
        each = max(1, left // len(open_))
        for i in list(open_):
            take = min(each, sizes[i] - shares[i], left)
            shares[i] += take
            left -= take
            if shares[i] == sizes[i]:
                open_.remove(i)
            if left == 0:
                break
    return shares


def select_stratified(
    rows: Sequence[RecordedRow],
    samples: int,
    *,
    edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
    seed: int = 0,
) -> Selection:
    """Up to ``samples`` rows, spread over the length buckets; seeded, so repeatable."""
    if samples < 1:
        raise CaptureError(f"samples must be at least 1, got {samples}")
    by_bucket: list[list[RecordedRow]] = [[] for _ in range(len(edges) + 1)]
    for row in rows:
        by_bucket[bucket_of(row.length, edges)].append(row)
    rng = np.random.default_rng(seed)
    shares = _shares([len(b) for b in by_bucket], samples)
    chosen: list[RecordedRow] = []
    counts: list[BucketCount] = []
    for i, (members, share) in enumerate(zip(by_bucket, shares, strict=True)):
        order = rng.permutation(len(members))[:share]
        chosen.extend(members[int(j)] for j in sorted(order))
        low = 0 if i == 0 else edges[i - 1]
        high = edges[i] if i < len(edges) else None
        if members:
            counts.append(BucketCount(low, high, len(members), share))
    chosen.sort(key=lambda r: r.length)
    return Selection(rows=tuple(chosen), buckets=tuple(counts))


def to_columns(
    rows: Sequence[RecordedRow], pad_id: int = 0, max_len: int | None = None
) -> dict[str, np.ndarray]:
    """One array per input, samples on axis 0; rows are right-padded to the longest.

    ``input_ids`` pads with ``pad_id``, every other input with zeros (so the
    ``attention_mask`` marks padding); ``max_len`` cuts longer rows.
    """
    if not rows:
        raise CaptureError("no rows to write")
    names = list(rows[0].feeds)
    for row in rows:
        if list(row.feeds) != names:
            raise CaptureError(
                "recorded requests disagree on their inputs: "
                f"{sorted(names)} vs {sorted(row.feeds)}"
            )
    columns: dict[str, np.ndarray] = {}
    for name in names:
        arrays = [np.asarray(r.feeds[name]) for r in rows]
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) != 1:
            raise CaptureError(f"input {name!r} has several dtypes in the recorded requests")
        ranks = {a.ndim for a in arrays}
        if ranks != {arrays[0].ndim} or arrays[0].ndim == 0:
            raise CaptureError(f"input {name!r} has no common rank >= 1 in the recorded requests")
        rest = {a.shape[1:] for a in arrays}
        if len(rest) != 1:
            raise CaptureError(f"input {name!r}: only the first axis may vary, got {sorted(rest)}")
        longest = max(a.shape[0] for a in arrays)
        width = longest if max_len is None else min(longest, max_len)
        fill = pad_id if name == INPUT_IDS else 0
        out = np.full((len(arrays), width, *arrays[0].shape[1:]), fill, dtype=arrays[0].dtype)
        for i, a in enumerate(arrays):
            out[i, : min(width, a.shape[0])] = a[:width]
        columns[name] = out
    return columns
