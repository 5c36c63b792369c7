"""Records damaged at the Kafka level, as a test writes them: header keys that are not UTF-8."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import aiokafka.producer.message_accumulator
import aiokafka.producer.producer
import pytest
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

__all__ = ["RawHeaderKey", "raw_header_keys"]


class RawHeaderKey(str):
    """A header key that aiokafka's pure-Python record builder writes as ``raw``
    (it calls ``key.encode()``), whatever bytes those are."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderKey:
        key = super().__new__(cls, "k")
        key.raw = raw
        return key

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


@contextlib.contextmanager
def raw_header_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Producers build batches with the pure-Python builder meanwhile, so a
    :class:`RawHeaderKey` goes on the wire as its raw bytes."""
    with monkeypatch.context() as patch:
        for module in (aiokafka.producer.message_accumulator, aiokafka.producer.producer):
            patch.setattr(module, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        yield
