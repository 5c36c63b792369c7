"""Recorded requests → samples: read the version/ingress topics by time, decode, write .npz.

The topics are read from ``from_ms`` (``offsets_for_times``) to their end offsets
as of now (or ``to_ms``). A request's inputs are its named tensors (one row per
item of the batch axis), else its ``token_ids``, else its ``prompt`` as byte-level
ids (the request contract): those give ``input_ids`` and an all-ones
``attention_mask``. Shadow copies and replays are the same inputs again and fall
out in de-duplication.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from graylane.capture.sampling import (
    ATTENTION_MASK,
    DEFAULT_BUCKET_EDGES,
    INPUT_IDS,
    BucketCount,
    CaptureError,
    RecordedRow,
    Split,
    dedupe,
    select_stratified,
    split_of,
    to_columns,
)
from graylane.errors import GraylaneError
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import ClientFactory, known_topics
from graylane.serde import decode, from_tensors
from graylane.topics import TopicLayout
from graylane.v1 import inference_pb2

__all__ = [
    "CaptureManifest",
    "CaptureOptions",
    "capture",
    "decode_request",
    "manifest_path",
    "read_rows",
    "source_topics",
    "write_capture",
]

MANIFEST_SUFFIX = ".manifest.json"


@dataclass(frozen=True, kw_only=True)
class CaptureOptions:
    """What to capture: whose traffic, from when, how much, and how to pad it."""

    model: str
    version: str | None = None
    from_ms: int = 0
    to_ms: int = 0
    samples: int = 1000
    split: Split = Split.CALIBRATION
    seed: int = 0
    edges: tuple[int, ...] = DEFAULT_BUCKET_EDGES
    pad_id: int = 0
    max_len: int | None = None
    timeout_s: float = 60.0


@dataclass(frozen=True)
class CaptureManifest:
    """Where a captured sample came from and what it holds (written next to the .npz)."""

    model: str
    version: str | None
    split: str
    topics: tuple[str, ...]
    from_ms: int
    to_ms: int
    first_record_ms: int | None
    last_record_ms: int | None
    records: int
    undecodable: int
    duplicates: int
    other_split: int
    samples: int
    seq_len: int
    buckets: tuple[BucketCount, ...]
    npz_sha256: str = ""
    arrays: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def source_topics(layout: TopicLayout, model: str, version: str | None) -> tuple[str, ...]:
    """The version's request topic when a version is named, else the model's ingress."""
    if version:
        return (layout.version_requests(model, version),)
    return (layout.ingress(model),)


def decode_request(data: bytes | None, model: str) -> list[RecordedRow] | None:
    """The rows of one recorded request of ``model``; None when it cannot be read."""
    try:
        request = decode(inference_pb2.InferenceRequest, data)
    except Exception:  # a record that is no request is skipped, counted, not fatal
        return None
    if request.model and request.model != model:
        return []
    if request.inputs:
        try:
            feeds = from_tensors(request.inputs)
        except Exception:
            return None
        batch = {int(a.shape[0]) for a in feeds.values() if a.ndim > 0}
        if len(batch) != 1:
            return None
        (rows,) = batch
        return [
            RecordedRow({k: np.ascontiguousarray(v[i]) for k, v in feeds.items()})
            for i in range(rows)
        ]
    if request.token_ids:
        tokens = np.asarray(list(request.token_ids), dtype=np.int64)
    elif request.prompt:
        tokens = np.frombuffer(request.prompt.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    else:
        return None
    return [RecordedRow({INPUT_IDS: tokens, ATTENTION_MASK: np.ones_like(tokens)})]


@dataclass(frozen=True)
class _Read:
    rows: list[RecordedRow]
    records: int
    undecodable: int
    first_ms: int | None
    last_ms: int | None


async def read_rows(
    factory: ClientFactory, layout: TopicLayout, options: CaptureOptions
) -> tuple[tuple[str, ...], _Read]:
    """Every decodable row recorded on the source topics in the time range."""
    rows: list[RecordedRow] = []
    records = undecodable = 0
    stamps: list[int] = []
    topics = source_topics(layout, options.model, options.version)
    producer = factory.producer()
    await producer.start()
    try:
        existing = await known_topics(producer)
    finally:
        await producer.stop()
    for topic in topics:
        if topic not in existing:
            continue  # nothing was ever recorded there
        found = await read_to_end(
            factory,
            topic,
            from_ms=options.from_ms,
            to_ms=options.to_ms,
            timeout_s=options.timeout_s,
            client_suffix="capture",
        )
        for record in found:
            records += 1
            decoded = decode_request(record.value, options.model)
            if decoded is None:
                undecodable += 1
                continue
            stamps.append(int(record.timestamp))
            rows.extend(RecordedRow(r.feeds, int(record.timestamp)) for r in decoded)
    return topics, _Read(
        rows, records, undecodable, min(stamps, default=None), max(stamps, default=None)
    )


def _choose(
    rows: Sequence[RecordedRow], options: CaptureOptions
) -> tuple[list[RecordedRow], int, int]:
    unique, duplicates = dedupe(rows)
    wanted = [r for d, r in unique if split_of(d) is options.split]
    return wanted, duplicates, len(unique) - len(wanted)


async def capture(
    factory: ClientFactory, layout: TopicLayout, options: CaptureOptions
) -> tuple[dict[str, np.ndarray], CaptureManifest]:
    """Read, de-duplicate, keep one split, stratify and pad: arrays and their manifest."""
    topics, read = await read_rows(factory, layout, options)
    return assemble(read.rows, options, topics, read)


def assemble(
    rows: Iterable[RecordedRow],
    options: CaptureOptions,
    topics: tuple[str, ...],
    read: _Read | None = None,
) -> tuple[dict[str, np.ndarray], CaptureManifest]:
    rows = list(rows)
    wanted, duplicates, other = _choose(rows, options)
    if not wanted:
        raise CaptureError(
            f"no usable recorded requests of {options.model} on {', '.join(topics)} in the range "
            f"({len(rows)} row(s) read, {duplicates} duplicate(s), {other} in the other split)"
        )
    selection = select_stratified(wanted, options.samples, edges=options.edges, seed=options.seed)
    columns = to_columns(selection.rows, pad_id=options.pad_id, max_len=options.max_len)
    first = next(iter(columns.values()))
    manifest = CaptureManifest(
        model=options.model,
        version=options.version,
        split=options.split.value,
        topics=topics,
        from_ms=options.from_ms,
        to_ms=options.to_ms,
        first_record_ms=None if read is None else read.first_ms,
        last_record_ms=None if read is None else read.last_ms,
        records=len(rows) if read is None else read.records,
        undecodable=0 if read is None else read.undecodable,
        duplicates=duplicates,
        other_split=other,
        samples=int(first.shape[0]),
        seq_len=int(first.shape[1]) if first.ndim > 1 else 1,
        buckets=selection.buckets,
        arrays={k: list(v.shape) for k, v in columns.items()},
    )
    return columns, manifest


def manifest_path(npz: Path) -> Path:
    return npz.with_name(npz.name.removesuffix(".npz") + MANIFEST_SUFFIX)


class CaptureWriteError(GraylaneError):
    """The capture could not be written."""


def write_capture(
    out: Path, columns: dict[str, np.ndarray], manifest: CaptureManifest
) -> CaptureManifest:
    """Write ``out`` (.npz, one array per input) and its JSON manifest beside it."""
    if out.suffix != ".npz":
        raise CaptureWriteError(f"{out}: the calibration file must end in .npz")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.npz")
    np.savez(partial, **columns)  # type: ignore[arg-type]
    partial.replace(out)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    final = replace(manifest, npz_sha256=digest)
    manifest_path(out).write_text(final.to_json() + "\n")
    return final
