from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane.engine_worker.logic.batching import (
    BatchingError,
    BucketPolicy,
    InvalidPolicyError,
    PendingItem,
    SequenceTooLongError,
    pad_token_batch,
    split_first,
)

POLICY = BucketPolicy(buckets=(16, 32, 64, 128, 256), max_batch_size=3)


@pytest.mark.parametrize(
    ("seq_len", "bucket"), [(0, 16), (1, 16), (16, 16), (17, 32), (64, 64), (65, 128), (256, 256)]
)
def test_bucket_for_picks_the_smallest_bucket_that_fits(seq_len: int, bucket: int) -> None:
    assert POLICY.bucket_for(seq_len) == bucket


def test_bucket_for_refuses_too_long_and_negative() -> None:
    with pytest.raises(SequenceTooLongError):
        POLICY.bucket_for(257)
    with pytest.raises(BatchingError):
        POLICY.bucket_for(-1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"buckets": ()},
        {"buckets": (0, 16)},
        {"buckets": (32, 16)},
        {"buckets": (16, 16)},
        {"max_batch_size": 0},
    ],
)
def test_malformed_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicyError):
        BucketPolicy(**kwargs)  # type: ignore[arg-type]


def test_powers_of_two_end_at_max_seq_len() -> None:
    assert BucketPolicy.powers_of_two(256, 4).buckets == (16, 32, 64, 128, 256)
    assert BucketPolicy.powers_of_two(100, 4, smallest=8).buckets == (8, 16, 32, 64, 100)
    assert BucketPolicy.powers_of_two(10, 4).buckets == (10,)


def test_plan_is_fifo_within_bucket_and_oldest_batch_first() -> None:
    lengths = [5, 40, 6, 7, 33, 8, 3, 200]
    items = [PendingItem(i, n) for i, n in enumerate(lengths)]
    plan = POLICY.plan_batches(items)
    assert [(b.bucket_len, b.indices) for b in plan] == [
        (16, (0, 2, 3)),
        (64, (1, 4)),
        (16, (5, 6)),
        (256, (7,)),
    ]


def test_plan_of_nothing_is_empty() -> None:
    assert POLICY.plan_batches([]) == []


def test_plan_names_the_item_that_fits_no_bucket() -> None:
    with pytest.raises(SequenceTooLongError) as info:
        POLICY.plan_batches([PendingItem(0, 3), PendingItem(41, 300)])
    assert info.value.index == 41


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=256), max_size=60),
    max_batch=st.integers(min_value=1, max_value=9),
)
def test_plan_properties(lengths: list[int], max_batch: int) -> None:
    policy = BucketPolicy(buckets=(16, 32, 64, 128, 256), max_batch_size=max_batch)
    items = [PendingItem(i * 3 + 1, n) for i, n in enumerate(lengths)]
    plan = policy.plan_batches(items)
    seen = [item.index for batch in plan for item in batch.items]
    assert sorted(seen) == sorted(item.index for item in items)  # each exactly once
    for batch in plan:
        assert 1 <= len(batch) <= max_batch
        assert {policy.bucket_for(item.seq_len) for item in batch.items} == {batch.bucket_len}
        assert all(item.seq_len <= batch.bucket_len for item in batch.items)
        assert list(batch.indices) == sorted(batch.indices)  # FIFO within a batch
    firsts = [batch.indices[0] for batch in plan]
    assert firsts == sorted(firsts)
    assert policy.plan_batches(items) == plan  # deterministic


def test_plan_accepts_any_item_with_index_and_seq_len() -> None:
    class Request:
        def __init__(self, index: int, seq_len: int, payload: str) -> None:
            self.index = index
            self.seq_len = seq_len
            self.payload = payload

    plan = POLICY.plan_batches([Request(0, 3, "a"), Request(1, 20, "b")])
    assert [batch.items[0].payload for batch in plan] == ["a", "b"]


def test_pad_token_batch_pads_right_with_a_mask() -> None:
    ids, mask = pad_token_batch([np.array([1, 2, 3]), [4], np.array([], dtype=np.int64)], 4, 0)
    np.testing.assert_array_equal(ids, [[1, 2, 3, 0], [4, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert ids.dtype == np.int64
    assert mask.dtype == np.int64


def test_pad_token_batch_refuses_long_or_bad_rows() -> None:
    with pytest.raises(SequenceTooLongError):
        pad_token_batch([np.arange(5)], 4, 0)
    with pytest.raises(BatchingError):
        pad_token_batch([np.zeros((2, 2), dtype=np.int64)], 4, 0)
    with pytest.raises(BatchingError):
        pad_token_batch([np.array([0.5])], 4, 0)


def test_plan_batches_narrows_but_never_widens_the_cap() -> None:
    policy = BucketPolicy(buckets=(16,), max_batch_size=4)
    items = [PendingItem(i, 5) for i in range(6)]
    assert [len(b) for b in policy.plan_batches(items, 1)] == [1] * 6
    assert [len(b) for b in policy.plan_batches(items, 16)] == [4, 2]
    with pytest.raises(InvalidPolicyError):
        policy.plan_batches(items, 0)


def test_split_first_runs_a_small_batch_ahead_of_the_rest() -> None:
    policy = BucketPolicy(buckets=(16, 32), max_batch_size=4)
    items = [PendingItem(i, 10) for i in range(6)] + [PendingItem(6, 20)]
    planned = policy.plan_batches(items)
    split = split_first(planned, 1)
    assert [b.indices for b in split] == [(0,), (1, 2, 3), (4, 5), (6,)]
    assert [b.bucket_len for b in split] == [16, 16, 16, 32]
    assert split_first(planned, 4) == planned  # already that small: unchanged
    assert split_first([], 1) == []
