"""``graylane bench fuzz``: malformed records on every topic a service reads; does any die?

A stack on the real broker under a prefix of its own (the chaos bench's services as OS
processes: control plane with its audit sink, router, a worker of the stable and of the
candidate version of the tiny demo model, the policy engine with its lease). For each
topic a service reads, a seeded generator writes a burst of records damaged at two
levels at once:

- the record: header keys or values that are not UTF-8, thousands of headers, a huge
  header, null or empty header values; null, empty, huge or non-UTF-8 keys; empty values
  and values near the topic's ``max.message.bytes``;
- the protobuf: truncated, random or bit-flipped bytes, a valid message of another topic's
  type, unknown enum values, unknown fields (every wire type), extreme values (negative and
  huge numbers, NaN and infinities, huge strings, long repeated fields), other encodings
  (JSON, text format, UTF-16, base64, gzip) and, among them, plausible messages.

Plausible control records name a decoy model, so that what they may legitimately change
(a routing table, a rollout) never touches the model the checks run on; request, telemetry
and shadow records name the real one. After each burst a valid request must be answered
through the client SDK and a short canary must be moved by the policy engine (a step
forward or a rollback: any decision), then it is rolled back. A service that exits is seen
by a process poll and started once more; if it exits again while the same burst is being
read it is in a crash loop (it stays down). At the end every service is restarted once,
which re-reads whatever the services read only when they start (the policy engine's
restore). The same seed writes the same records (``--only`` replays one topic's burst);
every record is summarized under the run folder. The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import hashlib
import json
import math
import random
import re
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from graylane import serde
from graylane.app.bench.chaos_stack import (
    CANDIDATE,
    MODEL,
    STABLE,
    TOKEN,
    RolloutWatch,
    ServiceSet,
    StackError,
    build_model,
    log_mentions,
    service_env,
    start_all,
    wait_port,
)
from graylane.app.cli.demo import free_port
from graylane.client import ClientError, GraylaneClient, RequestRejected
from graylane.kafka.admin import describe_topic_configs, ensure_topics
from graylane.kafka.reading import FollowFrom, TopicFollower
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.lease import LeaseKeeper
from graylane.serde import PostProcess
from graylane.settings import REPO_ROOT, Settings
from graylane.topics import TopicLayout
from graylane.v1 import (
    audit_pb2,
    control_pb2,
    controlplane_pb2,
    inference_pb2,
    rollout_pb2,
    telemetry_pb2,
)

__all__ = [
    "DAMAGE",
    "TARGETS",
    "BurstResult",
    "FuzzConfig",
    "FuzzRecord",
    "Target",
    "generate",
    "main",
]

DECOY = "fuzz-decoy"
"""The model that plausible control records name (never the one the checks run on)."""

_FAR_PAST_MS = 1_700_000_000_000  # plausible timestamps, fixed so the records are seeded
_DONE_PHASES = (rollout_pb2.PROMOTED, rollout_pb2.ROLLED_BACK, rollout_pb2.ABORTED)


@dataclass(frozen=True)
class Target:
    """One topic a service reads: its message type and who reads it."""

    name: str
    message: type[Message]
    readers: tuple[str, ...]
    names: tuple[str, ...]
    """Strings a plausible message uses for its name-like fields."""
    compacted: bool = False

    def topic(self, layout: TopicLayout, lease_topic: str) -> str:
        topics = {
            "ingress": layout.ingress(MODEL),
            "version-stable": layout.version_requests(MODEL, STABLE),
            "version-candidate": layout.version_requests(MODEL, CANDIDATE),
            "telemetry": layout.telemetry(),
            "shadow": layout.shadow(MODEL),
            "commands": layout.commands(),
            "routing": layout.routing(),
            "precision": layout.precision(),
            "rollouts": layout.rollouts(),
            "scale": layout.scale(),
            "audit": layout.audit(),
            "lease": lease_topic,
        }
        return topics[self.name]


_REAL = (MODEL, STABLE, CANDIDATE, "fp32", "int8")
_CONTROL = (DECOY, "9.9.9", "0.0.1", "fp32", f"{DECOY}/9.9.9")

TARGETS: tuple[Target, ...] = (
    Target("ingress", inference_pb2.InferenceRequest, ("router",), _REAL),
    Target("version-stable", inference_pb2.InferenceRequest, ("worker-a",), _REAL),
    Target("version-candidate", inference_pb2.InferenceRequest, ("candidate",), _REAL),
    Target("telemetry", telemetry_pb2.BatchTelemetry, ("policy",), (*_REAL, DECOY)),
    Target("shadow", inference_pb2.InferenceResult, ("policy",), _REAL),
    Target("commands", rollout_pb2.RolloutCommand, ("policy",), _CONTROL),
    Target("routing", control_pb2.RoutingTable, ("router", "policy"), _CONTROL, True),
    Target(
        "precision",
        control_pb2.PrecisionCommand,
        ("worker-a", "candidate", "policy"),
        _CONTROL,
        True,
    ),
    Target("rollouts", rollout_pb2.RolloutState, ("controlplane", "policy"), _CONTROL, True),
    Target("scale", control_pb2.ScaleRequest, ("policy",), _CONTROL, True),
    Target("audit", audit_pb2.AuditRecord, ("controlplane",), _CONTROL),
    # Last: a plausible claim may legitimately take the lease from the running engine.
    Target("lease", control_pb2.PolicyLease, ("policy",), _CONTROL, True),
)


# -- the generator (pure) -------------------------------------------------------------


class RawHeaderKey(str):
    """A header key whose bytes are written as they are (aiokafka encodes keys as UTF-8)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderKey:
        made = super().__new__(cls, raw.decode("latin-1"))
        made.raw = raw
        return made

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class FuzzRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers
    damage: str
    """``<record damage>+<protobuf damage>``, e.g. ``header-key-not-utf8+truncated``."""

    def size(self) -> int:
        heads = sum(len(k.encode()) + len(v or b"") for k, v in self.headers)
        return len(self.key or b"") + len(self.value or b"") + heads

    def summary(self, index: int) -> dict[str, object]:
        """What the run folder keeps of a record (enough to find and rebuild it)."""

        def show(data: bytes | None) -> object:
            return None if data is None else {"len": len(data), "head": data[:48].hex()}

        return {
            "i": index,
            "damage": self.damage,
            "key": show(self.key),
            "headers": len(self.headers),
            "header_keys": [k.encode()[:24].hex() for k, _ in self.headers[:4]],
            "value": show(self.value),
            "value_sha256": None if self.value is None else hashlib.sha256(self.value).hexdigest(),
        }


_NOT_UTF8 = (b"\xff\xfe", b"\xc3\x28", b"\x80abc", b"\xed\xa0\x80", b"ok\xf0\x28\x8c")
_ODD_STRINGS = (
    "",
    "\x00",
    "\u202e\u0635",
    "../../etc/passwd",
    "a.b/c d",
    "\U0001f525" * 10,
    "graylane.control.routing",
    "%s%n",
)

_RECORD_DAMAGE = (
    ("plain", 6),
    ("header-key-not-utf8", 3),
    ("header-value-not-utf8", 2),
    ("many-headers", 1),
    ("huge-header", 1),
    ("null-header-value", 1),
    ("empty-header-key", 1),
    ("key-null", 1),
    ("key-empty", 1),
    ("key-huge", 1),
    ("key-not-utf8", 2),
)
_VALUE_DAMAGE = (
    ("plausible", 4),
    ("extreme", 4),
    ("unknown-enum", 2),
    ("unknown-fields", 2),
    ("unknown-group", 1),
    ("wrong-type", 2),
    ("truncated", 3),
    ("random", 2),
    ("bitflip", 2),
    ("empty", 1),
    ("null", 1),
    ("huge", 1),
    ("json", 1),
    ("text", 1),
    ("utf16", 1),
    ("base64", 1),
    ("gzip", 1),
)


DAMAGE = frozenset(n for n, _ in _RECORD_DAMAGE + _VALUE_DAMAGE)
"""Every kind of damage, as ``--without`` names them."""


def _pick(rng: random.Random, table: tuple[tuple[str, int], ...], without: frozenset[str]) -> str:
    weights = [0 if n in without and n != "plain" and n != "plausible" else w for n, w in table]
    return rng.choices([n for n, _ in table], weights=weights)[0]


def generate(
    target: Target, count: int, *, seed: int, limit: int, without: frozenset[str] = frozenset()
) -> list[FuzzRecord]:
    """``count`` damaged records for ``target``; the same arguments give the same records.

    ``limit`` is the topic's ``max.message.bytes``: no record is larger than it allows
    (the broker would refuse it, and no service would see it). At most three records
    per burst are near the limit, to spare the broker's disk. ``without`` names kinds of
    damage left out (to look past a known crash).
    """
    rng = random.Random(f"fuzz:{seed}:{target.name}")
    budget = limit - 4096
    near_limit = 0
    out: list[FuzzRecord] = []
    for _ in range(count):
        record_damage = _pick(rng, _RECORD_DAMAGE, without)
        if target.compacted and record_damage == "key-null":
            record_damage = "key-empty"  # a compacted topic refuses a record without a key
        value_damage = _pick(rng, _VALUE_DAMAGE, without)
        if value_damage == "huge":
            if near_limit >= 3:
                value_damage = "random"
            near_limit += 1
        key = _key(rng, record_damage, target)
        headers = _headers(rng, record_damage)
        # each header costs a few bytes of framing on top of its key and value
        heads = sum(len(k.encode()) + len(v or b"") + 12 for k, v in headers)
        room = budget - len(key or b"") - heads
        value = _value(rng, value_damage, target, room)
        if value is not None and len(value) > room:
            value = value[: max(0, room)]
        if key is None and value is None:
            value = b""  # a record needs one of them
        out.append(FuzzRecord(key, value, headers, f"{record_damage}+{value_damage}"))
    return out


def _key(rng: random.Random, damage: str, target: Target) -> bytes | None:
    if damage == "key-null":
        return None
    if damage == "key-empty":
        return b""
    if damage == "key-huge":
        return rng.randbytes(rng.choice((1_000, 10_000, 100_000)))
    if damage == "key-not-utf8":
        return rng.choice(_NOT_UTF8)
    return (
        rng.choice(target.names).encode() if rng.random() < 0.7 else rng.randbytes(8).hex().encode()
    )


def _headers(rng: random.Random, damage: str) -> Headers:
    if damage == "header-key-not-utf8":
        return [
            ("content-type", b"application/x-protobuf"),
            (RawHeaderKey(rng.choice(_NOT_UTF8)), b"v"),
        ]
    if damage == "header-value-not-utf8":
        return [("traceparent", rng.choice(_NOT_UTF8))]
    if damage == "many-headers":
        return [(f"h{i}", b"x" * rng.randint(0, 8)) for i in range(rng.choice((100, 1000, 5000)))]
    if damage == "huge-header":
        return [("big", rng.randbytes(rng.choice((16 * 1024, 64 * 1024, 256 * 1024))))]
    if damage == "null-header-value":
        return [("nullable", None), ("request-id", None)]
    if damage == "empty-header-key":
        return [("", b""), ("", b"again")]
    return (
        [] if rng.random() < 0.5 else [("traceparent", b"00-" + rng.randbytes(16).hex().encode())]
    )


def _value(rng: random.Random, damage: str, target: Target, room: int) -> bytes | None:
    if damage == "null":
        return None
    if damage == "empty":
        return b""
    if damage == "random":
        return rng.randbytes(rng.choice((1, 7, 64, 1024, 65_536)))
    if damage == "huge":
        return rng.randbytes(max(0, room))
    if damage == "wrong-type":
        other = rng.choice([t for t in TARGETS if t.message is not target.message])
        return serde.encode(_message(rng, other.message, target.names, extreme=False))
    extreme = damage == "extreme"
    message = _message(rng, target.message, target.names, extreme=extreme)
    if damage == "unknown-enum":
        _unknown_enums(rng, message)
    plain = serde.encode(message)
    if damage in ("plausible", "extreme", "unknown-enum"):
        return plain
    if damage == "unknown-fields":
        return plain + b"".join(_unknown_field(rng) for _ in range(rng.randint(1, 5)))
    if damage == "unknown-group":
        # a start-group tag with no end: not a message at all
        return plain + _varint((rng.randint(100, 10_000) << 3) | 3) + b"\x08\x01"
    if damage == "truncated":
        return plain[: rng.randint(0, max(0, len(plain) - 1))]
    if damage == "bitflip":
        flipped = bytearray(plain or b"\x00")
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        return bytes(flipped)
    if damage == "json":
        return json_format.MessageToJson(message).encode()
    if damage == "text":
        return text_format.MessageToString(message).encode()
    if damage == "utf16":
        return json_format.MessageToJson(message).encode("utf-16")
    if damage == "base64":
        return base64.b64encode(plain)
    if damage == "gzip":
        return gzip.compress(plain, mtime=0)
    raise ValueError(f"unknown damage {damage!r}")


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _unknown_field(rng: random.Random) -> bytes:
    number = rng.choice((99, 1000, 65_535, (1 << 29) - 1))
    wire = rng.choice((0, 1, 2, 5))
    tag = _varint((number << 3) | wire)
    if wire == 0:
        return tag + _varint(rng.choice((0, 1, (1 << 64) - 1)))
    if wire == 1:
        return tag + struct.pack("<d", rng.choice((math.nan, math.inf, -1.0)))
    if wire == 5:
        return tag + struct.pack("<I", rng.getrandbits(32))
    blob = rng.randbytes(rng.choice((0, 3, 300)))
    return tag + _varint(len(blob)) + blob


def _message(
    rng: random.Random, kind: type[Message], names: tuple[str, ...], *, extreme: bool
) -> Message:
    message = kind()
    _fill(rng, message, names, extreme=extreme, depth=0)
    return message


def _fill(
    rng: random.Random, message: Message, names: tuple[str, ...], *, extreme: bool, depth: int
) -> None:
    for f in message.DESCRIPTOR.fields:
        if rng.random() < 0.25:
            continue
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            _fill_field(rng, message, f, names, extreme=extreme, depth=depth)


def _fill_field(
    rng: random.Random,
    message: Message,
    f: Any,
    names: tuple[str, ...],
    *,
    extreme: bool,
    depth: int,
) -> None:
    entry: Descriptor | None = f.message_type
    if entry is not None and entry.GetOptions().map_entry:
        mapping: Any = getattr(message, f.name)
        key_f, value_f = entry.fields_by_name["key"], entry.fields_by_name["value"]
        for _ in range(rng.randint(1, 3)):
            k = _scalar(rng, key_f, names, extreme=extreme)
            if value_f.message_type is not None:
                if depth < 3:
                    _fill(rng, mapping[k], names, extreme=extreme, depth=depth + 1)
            else:
                mapping[k] = _scalar(rng, value_f, names, extreme=extreme)
        return
    if f.is_repeated:
        many: Any = getattr(message, f.name)
        if extreme:  # long lists of scalars; of messages, long only at the top
            count = rng.choice(
                (0, 1, 64, 2000) if entry is None else (0, 1, 2, 200 if depth == 0 else 3)
            )
        else:
            count = rng.randint(1, 3)
        for _ in range(count):
            if entry is not None:
                if depth < 3:
                    _fill(rng, many.add(), names, extreme=extreme, depth=depth + 1)
            else:
                many.append(_scalar(rng, f, names, extreme=extreme))
        return
    if entry is not None:
        if depth < 3:
            child: Message = getattr(message, f.name)
            child.SetInParent()
            _fill(rng, child, names, extreme=extreme, depth=depth + 1)
        return
    setattr(message, f.name, _scalar(rng, f, names, extreme=extreme))


_INT_LIMITS = {
    FieldDescriptor.CPPTYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, (1 << 64) - 1),
}


def _scalar(rng: random.Random, f: Any, names: tuple[str, ...], *, extreme: bool) -> Any:
    kind = f.cpp_type
    if kind in _INT_LIMITS:
        low, high = _INT_LIMITS[kind]
        if extreme:
            return rng.choice((low, high, -1 if low < 0 else 0, high // 2))
        if f.name.endswith("unix_ms"):
            return _FAR_PAST_MS + rng.randint(0, 10**10)
        return rng.randint(0, 100)
    if kind in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        if extreme:
            big = 1e308 if kind == FieldDescriptor.CPPTYPE_DOUBLE else 3e38
            return rng.choice((math.nan, math.inf, -math.inf, -0.0, big, -big, 5e-324))
        return rng.uniform(0, 100)
    if kind == FieldDescriptor.CPPTYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.CPPTYPE_ENUM:
        if extreme:
            return rng.choice((9999, -1, (1 << 31) - 1))
        return rng.choice([v.number for v in f.enum_type.values])
    if kind == FieldDescriptor.CPPTYPE_STRING:
        if f.type == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(rng.choice((0, 16, 100_000) if extreme else (0, 8, 32)))
        if extreme:
            return rng.choice(("x" * 10_000, "y" * 100_000, *_ODD_STRINGS))
        return rng.choice(names) if rng.random() < 0.8 else rng.choice(_ODD_STRINGS)
    raise TypeError(f"no value for field {f.full_name}")


def _unknown_enums(rng: random.Random, message: Message) -> None:
    """Every enum field set (where the generator left it) becomes a value no reader knows."""
    for f, value in message.ListFields():
        if f.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
            unknown = rng.choice((99, 9999, -7))
            if f.is_repeated:
                getattr(message, f.name).append(unknown)
            else:
                setattr(message, f.name, unknown)
        elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
            for child in value if f.is_repeated else (value,):
                _unknown_enums(rng, child)
    for top in message.DESCRIPTOR.fields:
        if (
            top.cpp_type == FieldDescriptor.CPPTYPE_ENUM
            and not top.is_repeated
            and rng.random() < 0.5
        ):
            setattr(message, top.name, rng.choice((99, 9999)))


# -- writing records with any header key -------------------------------------------------


@contextlib.contextmanager
def raw_header_keys() -> Iterator[None]:
    """While inside, aiokafka builds batches with its pure-Python builder, which writes
    a :class:`RawHeaderKey` as its raw bytes (the compiled one insists on UTF-8)."""
    from aiokafka.producer import message_accumulator, producer
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

    saved = (message_accumulator.DefaultRecordBatchBuilder, producer.DefaultRecordBatchBuilder)
    message_accumulator.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy
    producer.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy
    try:
        yield
    finally:
        message_accumulator.DefaultRecordBatchBuilder, producer.DefaultRecordBatchBuilder = saved


async def write_burst(
    settings: Settings, topic: str, records: list[FuzzRecord], limit: int
) -> dict[str, int]:
    """Write ``records`` to ``topic``; what the broker refused, by error type."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.client_id}-fuzz",
        acks="all",
        linger_ms=5,
        max_request_size=limit + 65_536,
        request_timeout_ms=60_000,
        **settings.security.client_options(),
    )
    refused: dict[str, int] = {}
    with raw_header_keys():
        await producer.start()
        try:
            futures = []
            for r in records:
                try:
                    futures.append(
                        await producer.send(topic, r.value, key=r.key, headers=r.headers)
                    )
                except Exception as exc:  # refused before it left (its size): counted
                    refused[type(exc).__name__] = refused.get(type(exc).__name__, 0) + 1
            for outcome in await asyncio.gather(*futures, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    name = type(outcome).__name__
                    refused[name] = refused.get(name, 0) + 1
        finally:
            await producer.stop()
    return refused


# -- the stack's watchdog ---------------------------------------------------------------


@dataclass
class Crash:
    """A service that exited while a burst was being read."""

    service: str
    burst: str
    exit_code: int | None
    log: str
    traceback: str
    crash_loop: bool = False


_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):$", re.M)


def last_traceback(log: Path | None, max_chars: int = 6000) -> str:
    """The last traceback in a service log (or its last lines when there is none)."""
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace")
    starts = [m.start() for m in _TRACEBACK.finditer(text)]
    if not starts:
        return "\n".join(text.splitlines()[-20:])[-max_chars:]
    lines = text[starts[-1] :].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if not line.startswith(" ")), 0)
    return "\n".join(lines[: end + 1])[-max_chars:]


class Watchdog:
    """Polls every service; one that exited is started again once per burst, and one that
    exits again during the same burst is in a crash loop (left down)."""

    def __init__(self, services: ServiceSet, progress: Callable[[str], None]) -> None:
        self.services = services
        self.progress = progress
        self.burst = "setup"
        self.crashes: list[Crash] = []
        self.crash_loops: set[str] = set()
        self.restarted: dict[str, tuple[str, float]] = {}
        """service -> (burst, monotonic time) of its last restart."""

    def check(self) -> None:
        for name, proc in self.services.procs.items():
            if proc.alive() or name in self.crash_loops:
                continue
            again = self.restarted.get(name, ("", 0.0))[0] == self.burst
            crash = Crash(
                name, self.burst, proc.exit_code(), str(proc.log), last_traceback(proc.log), again
            )
            self.crashes.append(crash)
            if again:
                self.crash_loops.add(name)
                self.progress(f"    CRASH LOOP: {name} exited again ({crash.exit_code}); left down")
                continue
            self.progress(
                f"    {name} exited with {crash.exit_code} during the {self.burst} burst "
                f"(log {proc.log}); starting it again"
            )
            self.services.start(name)
            self.restarted[name] = (self.burst, time.monotonic())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def settle(self, grace_s: float) -> None:
        """Until every service restarted in this burst has stayed up ``grace_s``."""
        while True:
            self.check()
            waiting = [
                at + grace_s - time.monotonic()
                for name, (burst, at) in self.restarted.items()
                if burst == self.burst and name not in self.crash_loops
            ]
            if not waiting or max(waiting) <= 0:
                return
            await asyncio.sleep(min(1.0, max(waiting)))


# -- the checks after each burst ---------------------------------------------------------


@dataclass(frozen=True)
class FuzzConfig:
    records: int = 1000
    """Records per topic."""
    seed: int = 23
    only: tuple[str, ...] = ()
    """Only these targets (names in :data:`TARGETS`); default every one."""
    without: frozenset[str] = frozenset()
    """Kinds of damage left out (names in :data:`DAMAGE`)."""
    work_dir: Path | None = None
    window_ms: int = 4000
    step_ms: int = 1000
    probe_timeout_s: float = 60.0
    decide_timeout_s: float = 90.0
    restart_grace_s: float = 20.0


@dataclass
class BurstResult:
    target: str
    topic: str
    records: int
    refused: dict[str, int]
    answered: bool = False
    answer_s: float | None = None
    rejected: list[str] = field(default_factory=list)
    decided: str = ""
    """The canary's first decision (``PROGRESSING step 1``, ``ROLLED_BACK``...), or empty."""
    decide_s: float | None = None
    dead: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "records": self.records,
            "refused": self.refused,
            "answered": self.answered,
            "answer_s": self.answer_s,
            "rejected": self.rejected[:5],
            "decided": self.decided or None,
            "decide_s": self.decide_s,
            "dead": self.dead,
        }


def _rpc(port: int, method: str, request: Message) -> Any:
    import grpc

    from graylane.app.cli.controlplane_calls import stubs

    rpc, (channel, metadata) = stubs(
        argparse.Namespace(addr=f"127.0.0.1:{port}", token=TOKEN, ca=None)
    )
    try:
        return getattr(rpc.RolloutsStub(channel), method)(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        raise RuntimeError(f"{method}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


def _canary_spec() -> rollout_pb2.RolloutSpec:
    """Half the traffic to the candidate; the first step passes on a handful of samples,
    the second never ends (so nothing is promoted): a move to step 1, or a rollback, is
    the decision looked for."""
    return rollout_pb2.RolloutSpec(
        model=MODEL,
        baseline_version=STABLE,
        candidate_version=CANDIDATE,
        strategy=rollout_pb2.CANARY,
        steps=[
            rollout_pb2.RolloutStep(weight_percent=50, min_samples=5, min_dwell_s=1.0),
            rollout_pb2.RolloutStep(weight_percent=60, min_samples=10**9, min_dwell_s=3600.0),
            rollout_pb2.RolloutStep(weight_percent=100, min_samples=10**9, min_dwell_s=3600.0),
        ],
        gates=rollout_pb2.GateSpec(max_p99_ratio=50.0, max_error_rate_delta=0.5),
        failures_to_rollback=50,
    )


def _describe(state: rollout_pb2.RolloutState) -> str:
    phase = rollout_pb2.RolloutPhase.Name(state.phase)
    return phase if state.phase in _DONE_PHASES else f"{phase} step {state.step_index}"


@dataclass
class Checks:
    """The valid request and the canary run after each burst."""

    factory: KafkaFactory
    client: GraylaneClient
    cp_port: int
    cfg: FuzzConfig
    watchdog: Watchdog
    tokens: list[int] = field(default_factory=lambda: [(7 * k) % 250 + 3 for k in range(32)])

    def _timeout(self, full_s: float) -> float:
        """A service in a crash loop stays down: no point waiting the full time."""
        return min(full_s, 10.0) if self.watchdog.crash_loops else full_s

    async def valid_request(self, result: BurstResult) -> None:
        t0 = time.monotonic()
        deadline = t0 + self._timeout(self.cfg.probe_timeout_s)
        while time.monotonic() < deadline:
            try:
                await self.client.infer(
                    MODEL,
                    token_ids=self.tokens,
                    routing_key=f"user-{uuid.uuid4().hex[:8]}",
                    post_process=PostProcess.ARGMAX_LAST,
                    timeout=min(10.0, max(1.0, deadline - time.monotonic())),
                )
            except RequestRejected as exc:
                result.rejected.append(str(exc.result.error_code))
                await asyncio.sleep(1.0)
            except ClientError:
                continue
            else:
                result.answered, result.answer_s = True, round(time.monotonic() - t0, 2)
                return

    async def canary(self, result: BurstResult) -> None:
        """Start the canary, load it until the policy engine decides, then roll it back."""
        watch = RolloutWatch()
        follower = TopicFollower(
            self.factory,
            self.factory.layout.rollouts(),
            watch.on_record,
            start_at=FollowFrom.END,  # nothing of the bursts: only what is written from now
            client_suffix=f"fuzz-rollouts-{uuid.uuid4().hex[:4]}",
            poll_ms=200,
        )
        await follower.start()
        try:
            rollout_id = await self._start()
            if not rollout_id:
                result.decided = ""
                return
            t0 = time.monotonic()
            deadline = t0 + self._timeout(self.cfg.decide_timeout_s)
            while time.monotonic() < deadline:
                state = watch.latest(rollout_id)
                if state is not None and (
                    state.phase in _DONE_PHASES
                    or (state.phase == rollout_pb2.PROGRESSING and state.step_index >= 1)
                ):
                    result.decided = _describe(state)
                    result.decide_s = round(time.monotonic() - t0, 2)
                    break
                for _ in range(4):  # a paced load, so that the step sees samples
                    await self.client.submit(
                        MODEL,
                        token_ids=self.tokens,
                        routing_key=f"user-{uuid.uuid4().hex[:8]}",
                        post_process=PostProcess.ARGMAX_LAST,
                    )
                await asyncio.sleep(0.2)
            await self._end(rollout_id, watch)
        finally:
            with contextlib.suppress(Exception):
                await follower.stop()

    async def _start(self) -> str:
        """The control plane refuses a start while the last canary is still active: retry."""
        deadline = time.monotonic() + self._timeout(60.0)
        while True:
            try:
                state = await asyncio.to_thread(_rpc, self.cp_port, "Start", _canary_spec())
                return str(state.rollout_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    return ""
                await asyncio.sleep(1.0)

    async def _end(self, rollout_id: str, watch: RolloutWatch) -> None:
        request = controlplane_pb2.RolloutActionRequest(rollout_id=rollout_id, reason="fuzz")
        with contextlib.suppress(RuntimeError):
            state = watch.latest(rollout_id)
            if state is None or state.phase not in _DONE_PHASES:
                await asyncio.to_thread(_rpc, self.cp_port, "Rollback", request)
        deadline = time.monotonic() + self._timeout(30.0)
        while time.monotonic() < deadline:
            state = watch.latest(rollout_id)
            if state is not None and state.phase in _DONE_PHASES:
                return
            await asyncio.sleep(0.2)


# -- the run ------------------------------------------------------------------------------


async def _topic_limit(factory: KafkaFactory, topic: str) -> int:
    admin = factory.admin()
    await admin.start()
    try:
        return int((await describe_topic_configs(admin, topic))["max.message.bytes"])
    finally:
        await admin.close()


async def _delete_topics(factory: KafkaFactory, prefix: str) -> None:
    admin = factory.admin()
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(f"{prefix}.")]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


@dataclass
class Stack:
    """One stack under a prefix of its own, its watchdog and the checks run against it."""

    settings: Settings
    factory: KafkaFactory
    services: ServiceSet
    watchdog: Watchdog
    checks: Checks
    lease_topic: str
    stop: asyncio.Event
    watching: asyncio.Task[None]

    @property
    def crash_looped(self) -> bool:
        return bool(self.watchdog.crash_loops)

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(Exception):
            await self.watching
        self.watchdog.check()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.checks.client.close(), 10)
        await asyncio.to_thread(self.services.stop_all)
        with contextlib.suppress(Exception):
            await _delete_topics(self.factory, self.settings.topic_prefix)


async def open_stack(
    cfg: FuzzConfig, run_dir: Path, crashes: list[Crash], progress: Callable[[str], None]
) -> Stack:
    """Build the demo model into ``run_dir``'s registry, start every service and wait
    until a request is answered and the policy engine has restored its state."""
    run_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"fuzz{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env().with_overrides(
        topic_prefix=prefix,
        db_url=f"sqlite:///{run_dir / 'graylane.db'}",
        artifact_dir=run_dir / "artifacts",
    )
    factory = KafkaFactory(settings)
    layout = factory.layout
    progress(f"building {MODEL} {STABLE} and {CANDIDATE} (demo GPT, tiny) under {run_dir}")
    files = await asyncio.to_thread(build_model, settings, progress)
    await ensure_topics(
        factory, layout.shared_specs() + layout.model_specs(MODEL, [STABLE, CANDIDATE])
    )
    cp_port = free_port()
    services = ServiceSet(env=service_env(settings, run_dir, cp_port), logs=run_dir / "logs")
    watchdog = Watchdog(services, progress)
    watchdog.crashes = crashes
    progress(f"starting the stack on {settings.bootstrap_servers}, prefix {prefix}")
    start_all(services, files, window_ms=cfg.window_ms, step_ms=cfg.step_ms, stable_workers=1)
    client = GraylaneClient(factory, client_id=f"fuzz-{uuid.uuid4().hex[:8]}")
    stop = asyncio.Event()
    stack = Stack(
        settings,
        factory,
        services,
        watchdog,
        Checks(factory, client, cp_port, cfg, watchdog),
        LeaseKeeper(factory, "fuzz-bench").topic,
        stop,
        asyncio.create_task(watchdog.run(stop)),
    )
    try:
        await asyncio.to_thread(wait_port, cp_port, 120, services.procs["controlplane"].alive)
        await client.start()
        progress("waiting for the stack to answer (workers warm up before they join)")
        first = BurstResult("start", "", 0, {})
        for _ in range(3):
            await stack.checks.valid_request(first)
            if first.answered:
                break
        policy = services.procs["policy"]
        deadline = time.monotonic() + 120
        while not log_mentions(policy.log, "restored ") and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await stack.checks.canary(first)
        if not (first.answered and first.decided):
            raise StackError(
                f"the fresh stack does not work: answered {first.answered}, canary "
                f"{first.decided or 'not decided'} (logs in {services.logs})"
            )
        progress(
            f"the stack works: a request answered in {first.answer_s} s, "
            f"a canary decided ({first.decided}) in {first.decide_s} s"
        )
    except BaseException:
        await stack.close()
        raise
    return stack


async def burst(
    stack: Stack, target: Target, cfg: FuzzConfig, run_dir: Path, progress: Callable[[str], None]
) -> BurstResult:
    """One topic's burst, then the checks; a service that exits is restarted once."""
    layout = stack.factory.layout
    topic = target.topic(layout, stack.lease_topic)
    limit = await _topic_limit(stack.factory, topic)
    records = generate(target, cfg.records, seed=cfg.seed, limit=limit, without=cfg.without)
    (run_dir / "records").mkdir(parents=True, exist_ok=True)
    with (run_dir / "records" / f"{target.name}.jsonl").open("w") as out:
        for i, r in enumerate(records):
            out.write(json.dumps(r.summary(i)) + "\n")
    stack.watchdog.burst = target.name
    refused = await write_burst(stack.settings, topic, records, limit)
    result = BurstResult(target.name, topic, len(records), refused)
    progress(
        f"{target.name}: {len(records)} records on {topic} (limit {limit} B; "
        f"refused {sum(refused.values())}); read by {', '.join(target.readers)}"
    )
    await stack.checks.valid_request(result)
    await stack.checks.canary(result)
    await stack.watchdog.settle(cfg.restart_grace_s)
    result.dead = stack.services.dead()
    answered = f"answered in {result.answer_s} s" if result.answered else "NOT answered"
    down = f"; DOWN: {', '.join(result.dead)}" if result.dead else ""
    progress(f"    valid request {answered}; canary {result.decided or 'NOT decided'}{down}")
    return result


async def restart_all(
    stack: Stack, cfg: FuzzConfig, progress: Callable[[str], None]
) -> BurstResult:
    """Every service killed and started again: what they read only at start is read again."""
    progress("restarting every service once (what they read only at start is read again)")
    stack.watchdog.burst = "restart"
    for name in list(stack.services.procs):
        if name not in stack.watchdog.crash_loops:
            stack.services.kill(name)
            stack.services.start(name)
            stack.watchdog.restarted[name] = ("restart", time.monotonic())
    await stack.watchdog.settle(cfg.restart_grace_s)
    final = BurstResult("restart", "", 0, {})
    await stack.checks.valid_request(final)
    await stack.checks.canary(final)
    await stack.watchdog.settle(cfg.restart_grace_s)
    final.dead = stack.services.dead()
    progress(
        f"after the restart: valid request {'answered' if final.answered else 'NOT answered'}, "
        f"canary {final.decided or 'NOT decided'}"
        + (f"; DOWN: {', '.join(final.dead)}" if final.dead else "")
    )
    return final


async def run(cfg: FuzzConfig, progress: Callable[[str], None]) -> dict[str, object]:
    """Every burst on one stack; after a crash loop the rest go to a fresh stack (a new
    prefix and registry), so that each topic is still measured."""
    unknown = set(cfg.only) - {t.name for t in TARGETS}
    if unknown:
        raise ValueError(f"no such fuzz target: {', '.join(sorted(unknown))}")
    if cfg.without - DAMAGE:
        raise ValueError(f"no such damage: {', '.join(sorted(cfg.without - DAMAGE))}")
    targets = [t for t in TARGETS if not cfg.only or t.name in cfg.only]
    run_dir = cfg.work_dir or REPO_ROOT / ".local" / "fuzz" / time.strftime("run-%Y%m%d-%H%M%S")
    crashes: list[Crash] = []
    loops: list[str] = []
    results: list[BurstResult] = []
    stacks = 0
    stack: Stack | None = None
    final = BurstResult("restart", "", 0, {})
    try:
        looped: set[str] = set()
        for target in targets:
            if stack is not None and stack.crash_looped:
                progress("    a crash loop: the next bursts go to a fresh stack")
                await stack.close()
                stack = None
            if stack is None:
                stacks += 1
                stack = await open_stack(cfg, run_dir / f"stack-{stacks}", crashes, progress)
                looped = set()
            results.append(await burst(stack, target, cfg, run_dir / f"stack-{stacks}", progress))
            loops += [f"{n}@{target.name}" for n in sorted(stack.watchdog.crash_loops - looped)]
            looped = set(stack.watchdog.crash_loops)
        if stack is None:
            stacks += 1
            stack = await open_stack(cfg, run_dir / f"stack-{stacks}", crashes, progress)
            looped = set()
        final = await restart_all(stack, cfg, progress)
        loops += [f"{n}@restart" for n in sorted(stack.watchdog.crash_loops - looped)]
        alive = not stack.services.dead()
    finally:
        if stack is not None:
            await stack.close()
        for crash in crashes:
            progress(
                f"crash of {crash.service} during the {crash.burst} burst "
                f"(exit {crash.exit_code}{', crash loop' if crash.crash_loop else ''}; "
                f"log {crash.log}):\n{crash.traceback}"
            )
    return {
        "topics": len(results),
        "records": sum(r.records for r in results),
        "services_alive": alive and not loops,
        "crash_loops": len(loops),
        "valid_after_each_burst": all(r.answered for r in results),
        "decisions_after": sum(1 for r in results if r.decided),
        "crash_loop_at": loops,
        "after_restart": final.as_json(),
        "stacks": stacks,
        "per_topic": {r.target: r.as_json() for r in results},
        "crashes": [
            {
                "service": c.service,
                "burst": c.burst,
                "exit_code": c.exit_code,
                "crash_loop": c.crash_loop,
                "error": c.traceback.strip().splitlines()[-1] if c.traceback.strip() else "",
            }
            for c in crashes
        ],
        "seed": cfg.seed,
        "records_per_topic": cfg.records,
        "without": sorted(cfg.without),
        "run_dir": str(run_dir),
    }


def main(cfg: FuzzConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    report = asyncio.run(run(cfg, progress))
    per_topic: dict[str, dict[str, object]] = report["per_topic"]  # type: ignore[assignment]
    print()
    print(f"{'topic':<18} {'records':>7} {'refused':>7} {'answered':>8} {'decided':<22} down")
    for name, r in per_topic.items():
        refused: dict[str, int] = r["refused"]  # type: ignore[assignment]
        dead: list[str] = r["dead"]  # type: ignore[assignment]
        print(
            f"{name:<18} {r['records']:>7} {sum(refused.values()):>7} "
            f"{'yes' if r['answered'] else 'NO':>8} {r['decided'] or 'NO'!s:<22} "
            f"{', '.join(dead) or '-'}"
        )
    print(json.dumps(report))
    return 0
