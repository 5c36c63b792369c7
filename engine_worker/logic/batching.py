"""Sequence-length bucket planning and right padding for dynamic batches.

Pure logic over plain data (numpy only): the worker hands over what it has
pulled from Kafka as items with an index and a sequence length, and gets back
batches that each fit one bucket, i.e. one padded length, which on TensorRT is
one optimization profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_BUCKETS",
    "BatchItem",
    "BatchingError",
    "BucketPolicy",
    "InvalidPolicyError",
    "PendingItem",
    "PlannedBatch",
    "SequenceTooLongError",
    "pad_token_batch",
    "split_first",
]

DEFAULT_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256)


class BatchingError(GraylaneError, ValueError):
    """Base of batch planning errors."""


class InvalidPolicyError(BatchingError):
    """A bucket policy is malformed (empty, unsorted, non-positive sizes)."""


class SequenceTooLongError(BatchingError):
    """A sequence is longer than the largest bucket (or than the padded length)."""

    def __init__(self, seq_len: int, limit: int, index: int | None = None) -> None:
        where = "" if index is None else f" (item {index})"
        super().__init__(f"sequence length {seq_len}{where} exceeds {limit}")
        self.seq_len = seq_len
        self.limit = limit
        self.index = index


class BatchItem(Protocol):
    """What planning needs to know about a pending request."""

    @property
    def index(self) -> int: ...

    @property
    def seq_len(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PendingItem:
    """The plain :class:`BatchItem`: a position in the caller's list and a length."""

    index: int
    seq_len: int


ItemT = TypeVar("ItemT", bound=BatchItem)


@dataclass(frozen=True, slots=True)
class PlannedBatch(Generic[ItemT]):
    """Items that run together, padded to ``bucket_len``, in arrival order."""

    bucket_len: int
    items: tuple[ItemT, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(item.index for item in self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True, kw_only=True)
class BucketPolicy:
    """Sequence-length buckets (strictly increasing) and a cap on rows per batch."""

    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_batch_size: int = 8

    def __post_init__(self) -> None:
        if not self.buckets:
            raise InvalidPolicyError("at least one bucket is required")
        if self.buckets[0] < 1:
            raise InvalidPolicyError(f"bucket sizes must be positive: {self.buckets}")
        if any(b <= a for a, b in zip(self.buckets, self.buckets[1:], strict=False)):
            raise InvalidPolicyError(f"buckets must be strictly increasing: {self.buckets}")
        if self.max_batch_size < 1:
            raise InvalidPolicyError(f"max_batch_size must be >= 1, got {self.max_batch_size}")

    @classmethod
    def powers_of_two(
        cls, max_seq_len: int, max_batch_size: int, *, smallest: int = 16
    ) -> BucketPolicy:
        """Buckets ``smallest, 2*smallest, ...`` up to and including ``max_seq_len``."""
        if max_seq_len < 1 or smallest < 1:
            raise InvalidPolicyError("max_seq_len and smallest must be positive")
        sizes: list[int] = []
        size = smallest
        while size < max_seq_len:
            sizes.append(size)
            size *= 2
        sizes.append(max_seq_len)
        return cls(buckets=tuple(sizes), max_batch_size=max_batch_size)

    @property
    def max_seq_len(self) -> int:
        return self.buckets[-1]

    def fits(self, seq_len: int) -> bool:
        return 0 <= seq_len <= self.buckets[-1]

    def bucket_for(self, seq_len: int) -> int:
        """The smallest bucket that holds ``seq_len`` tokens."""
        if seq_len < 0:
            raise BatchingError(f"sequence length must be >= 0, got {seq_len}")
        for bucket in self.buckets:
            if seq_len <= bucket:
                return bucket
        raise SequenceTooLongError(seq_len, self.buckets[-1])

    def plan_batches(
        self, items: Sequence[ItemT], max_batch_size: int | None = None
    ) -> list[PlannedBatch[ItemT]]:
        """Group ``items`` by bucket and cut each group into batches of at most max size.

        ``max_batch_size`` narrows the policy's cap for this plan (the adaptive
        batch learner's choice); it never widens it.

        Deterministic: items keep their order within a bucket (FIFO), and batches
        are ordered by their oldest item, so the bucket whose first item arrived
        first runs first. Raises :class:`SequenceTooLongError` naming the first item
        that fits no bucket; filter with :meth:`fits` beforehand to answer those
        requests separately.
        """
        groups: dict[int, list[tuple[int, ItemT]]] = {}
        for position, item in enumerate(items):
            if item.seq_len > self.buckets[-1]:
                raise SequenceTooLongError(item.seq_len, self.buckets[-1], item.index)
            groups.setdefault(self.bucket_for(item.seq_len), []).append((position, item))

        cap = self.max_batch_size
        if max_batch_size is not None:
            if max_batch_size < 1:
                raise InvalidPolicyError(f"max_batch_size must be >= 1, got {max_batch_size}")
            cap = min(cap, max_batch_size)
        batches: list[tuple[int, PlannedBatch[ItemT]]] = []
        for bucket, members in groups.items():
            for start in range(0, len(members), cap):
                chunk = members[start : start + cap]
                oldest = chunk[0][0]
                batches.append((oldest, PlannedBatch(bucket, tuple(item for _, item in chunk))))
        batches.sort(key=lambda pair: pair[0])
        return [batch for _, batch in batches]


def split_first(batches: Sequence[PlannedBatch[ItemT]], rows: int) -> list[PlannedBatch[ItemT]]:
    """``batches`` with the first one cut to ``rows`` rows, its rest run right after it
    (the batch learner explores one small batch ahead of the size in use)."""
    if not batches or rows < 1 or len(batches[0]) <= rows:
        return list(batches)
    first = batches[0]
    return [
        PlannedBatch(first.bucket_len, first.items[:rows]),
        PlannedBatch(first.bucket_len, first.items[rows:]),
        *batches[1:],
    ]


def pad_token_batch(
    rows: Sequence[npt.ArrayLike], bucket_len: int, pad_id: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Right-pad 1-D token rows to ``bucket_len``: ``(input_ids, attention_mask)``.

    Both arrays are int64 [len(rows), bucket_len]; the mask is 1 on real tokens.
    """
    if bucket_len < 0:
        raise BatchingError(f"bucket_len must be >= 0, got {bucket_len}")
    input_ids = np.full((len(rows), bucket_len), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), bucket_len), dtype=np.int64)
    for i, row in enumerate(rows):
        tokens = np.asarray(row)
        if tokens.ndim != 1:
            raise BatchingError(f"row {i} must be 1-D, got shape {tokens.shape}")
        if tokens.dtype.kind not in "iu":
            raise BatchingError(f"row {i} must hold integer token ids, got {tokens.dtype}")
        n = tokens.shape[0]
        if n > bucket_len:
            raise SequenceTooLongError(n, bucket_len, i)
        input_ids[i, :n] = tokens
        attention_mask[i, :n] = 1
    return input_ids, attention_mask
