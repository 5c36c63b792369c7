"""Samples from recorded requests: decoding, de-duplication, split, stratification, padding."""

from __future__ import annotations

import numpy as np
import pytest

from graylane.capture.recorded import CaptureOptions, assemble, decode_request
from graylane.capture.sampling import (
    CaptureError,
    RecordedRow,
    Split,
    bucket_of,
    dedupe,
    row_digest,
    select_stratified,
    split_of,
    to_columns,
)
from graylane.serde import encode, to_tensors
from graylane.v1 import inference_pb2


def _row(tokens: list[int]) -> RecordedRow:
    ids = np.asarray(tokens, dtype=np.int64)
    return RecordedRow({"input_ids": ids, "attention_mask": np.ones_like(ids)})


def test_bucket_edges_are_inclusive_upper_bounds() -> None:
    assert [bucket_of(n, (8, 16)) for n in (1, 8, 9, 16, 17, 1000)] == [0, 0, 1, 1, 2, 2]


def test_stratified_selection_covers_short_and_long_inputs_of_skewed_traffic() -> None:
    # 95 % short traffic: a uniform sample of 40 would expect 2 long rows.
    rows = [_row([1 + i % 200] * 4 + [i]) for i in range(950)]
    rows += [_row([7] * 100 + [i]) for i in range(50)]
    picked = select_stratified(rows, 40, edges=(8, 16, 32, 64, 128), seed=0)
    lengths = [r.length for r in picked.rows]
    assert len(picked.rows) == 40
    assert sum(n > 64 for n in lengths) == 20 and sum(n <= 8 for n in lengths) == 20
    assert [(b.low, b.high, b.available, b.selected) for b in picked.buckets] == [
        (0, 8, 950, 20),
        (64, 128, 50, 20),
    ]
    again = select_stratified(rows, 40, edges=(8, 16, 32, 64, 128), seed=0)
    assert [row_digest(r) for r in again.rows] == [row_digest(r) for r in picked.rows]


def test_a_small_bucket_passes_its_unused_share_to_the_others() -> None:
    rows = [_row([1, i]) for i in range(100)] + [_row([2] * 50 + [i]) for i in range(3)]
    picked = select_stratified(rows, 30, edges=(8, 64), seed=1)
    assert {(b.low, b.selected) for b in picked.buckets} == {(0, 27), (8, 3)}


def test_duplicates_are_dropped_and_the_split_is_by_content() -> None:
    rows = [_row([i, i + 1]) for i in range(200)]
    unique, dropped = dedupe([*rows, *rows[:30]])
    assert len(unique) == 200 and dropped == 30
    held = [d for d, _ in unique if split_of(d) is Split.HELD_OUT]
    assert 20 <= len(held) <= 60  # one in five, by hash
    assert all(split_of(row_digest(r)) is split_of(d) for d, r in unique)


def test_columns_are_right_padded_with_the_pad_id_and_a_zero_mask() -> None:
    cols = to_columns([_row([5, 6, 7]), _row([8])], pad_id=257)
    assert cols["input_ids"].tolist() == [[5, 6, 7], [8, 257, 257]]
    assert cols["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert to_columns([_row([5, 6, 7])], max_len=2)["input_ids"].shape == (1, 2)
    with pytest.raises(CaptureError, match="disagree on their inputs"):
        to_columns([_row([1]), RecordedRow({"x": np.zeros(2, np.float32)})])


def test_requests_decode_from_prompt_token_ids_and_tensors() -> None:
    prompt = inference_pb2.InferenceRequest(model="m", prompt="hé")
    (row,) = decode_request(encode(prompt), "m") or []
    assert row.feeds["input_ids"].tolist() == list("hé".encode())
    ids = inference_pb2.InferenceRequest(model="m", token_ids=[256, 1, 2])
    assert [r.length for r in decode_request(encode(ids), "m") or []] == [3]
    batch = {
        "input_ids": np.array([[1, 2, 0], [3, 4, 5]], np.int64),
        "attention_mask": np.array([[1, 1, 0], [1, 1, 1]], np.int64),
    }
    tensors = inference_pb2.InferenceRequest(model="m", inputs=to_tensors(batch))
    assert [r.length for r in decode_request(encode(tensors), "m") or []] == [2, 3]
    assert decode_request(encode(prompt), "other") == []
    assert decode_request(b"\xff\x00garbage", "m") is None
    assert decode_request(encode(inference_pb2.InferenceRequest(model="m")), "m") is None


def test_assemble_keeps_one_split_and_counts_what_it_dropped() -> None:
    rows = [_row(list(range(1, 2 + i % 40))) for i in range(300)]
    rows += [_row([9, 9, 9, i]) for i in range(300)]
    opts = CaptureOptions(model="m", samples=50, edges=(8, 64), pad_id=0)
    columns, manifest = assemble([*rows, *rows[:10]], opts, ("p.ingress.m",))
    assert manifest.duplicates == 10 + 260 and manifest.samples == 50
    assert columns["input_ids"].shape[0] == 50 and manifest.topics == ("p.ingress.m",)
    _, held = assemble(rows, CaptureOptions(model="m", samples=50, split=Split.HELD_OUT), ("t",))
    assert held.split == "held-out" and held.other_split > held.samples
    with pytest.raises(CaptureError, match="no usable recorded requests"):
        assemble([], opts, ("t",))
