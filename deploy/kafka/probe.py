"""A raw Kafka wire-protocol readiness probe (stdlib only, no Kafka client library)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from graylane.deploy.kafka.layout import HOST, NODE_ID, KafkaLocalError

__all__ = [
    "API_METADATA",
    "API_SASL_AUTHENTICATE",
    "API_SASL_HANDSHAKE",
    "API_VERSIONS",
    "CLIENT_ID",
    "METADATA_PROBE_VERSION",
    "ApiVersionRange",
    "BrokerInfo",
    "ClusterMetadata",
    "ProtocolError",
    "encode_api_versions_request",
    "encode_metadata_request",
    "encode_request",
    "is_ready",
    "parse_api_versions_response",
    "parse_metadata_response",
    "probe",
    "sasl_plain_login",
]

# --------------------------------------------------------------------------------------------
# Minimal Kafka wire protocol (ApiVersions v0 and Metadata v4), enough for a readiness probe.
#   request  = int32 size | int16 api_key | int16 api_version | int32 correlation_id
#              | string client_id (int16 length + utf-8) | body
#   response = int32 size | int32 correlation_id | body       (header v0: no tagged fields)
# --------------------------------------------------------------------------------------------
API_METADATA = 3
API_SASL_HANDSHAKE = 17
API_VERSIONS = 18
API_SASL_AUTHENTICATE = 36
METADATA_PROBE_VERSION = 4  # last layout before flexible versions that every 4.x broker speaks
CLIENT_ID = "graylane-probe"


class ProtocolError(KafkaLocalError):
    """The peer answered, but not like a healthy Kafka broker."""


@dataclass(frozen=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True)
class ClusterMetadata:
    brokers: tuple[BrokerInfo, ...]
    cluster_id: str | None
    controller_id: int


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: bytes = b""
) -> bytes:
    """Size-prefixed request with a v1 request header (non-flexible)."""
    if client_id is None:
        cid = struct.pack(">h", -1)
    else:
        raw = client_id.encode("utf-8")
        cid = struct.pack(">h", len(raw)) + raw
    payload = struct.pack(">hhi", api_key, api_version, correlation_id) + cid + body
    return struct.pack(">i", len(payload)) + payload


def encode_api_versions_request(correlation_id: int, client_id: str | None = CLIENT_ID) -> bytes:
    """ApiVersions v0: the body is empty."""
    return encode_request(API_VERSIONS, 0, correlation_id, client_id)


def encode_metadata_request(correlation_id: int, client_id: str | None = CLIENT_ID) -> bytes:
    """Metadata v4 for no topics: topics = [] (empty, not null), allow_auto_topic_creation=false."""
    body = struct.pack(">i", 0) + b"\x00"
    return encode_request(API_METADATA, METADATA_PROBE_VERSION, correlation_id, client_id, body)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError(
                f"truncated response: need {n} bytes at offset {self.pos}, have {len(self.data)}"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        return int(struct.unpack(">b", self.take(1))[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def nullable_string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self.take(n).decode("utf-8")

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ProtocolError("unexpected null string")
        return value

    def array_len(self) -> int:
        n = self.int32()
        if n < -1 or n > len(self.data):
            raise ProtocolError(f"implausible array length {n}")
        return max(n, 0)


def _check_frame(frame: bytes, correlation_id: int) -> _Reader:
    """`frame` is the response without its int32 size prefix."""
    reader = _Reader(frame)
    got = reader.int32()
    if got != correlation_id:
        raise ProtocolError(f"correlation id mismatch: sent {correlation_id}, got {got}")
    return reader


def parse_api_versions_response(frame: bytes, correlation_id: int) -> list[ApiVersionRange]:
    """Parse an ApiVersions v0 response frame (without the size prefix)."""
    reader = _check_frame(frame, correlation_id)
    error_code = reader.int16()
    if error_code != 0:
        raise ProtocolError(f"ApiVersions failed with error_code={error_code}")
    ranges = []
    for _ in range(reader.array_len()):
        key, lo, hi = reader.int16(), reader.int16(), reader.int16()
        ranges.append(ApiVersionRange(key, lo, hi))
    if not ranges:
        raise ProtocolError("ApiVersions response lists no APIs")
    return ranges


def parse_metadata_response(frame: bytes, correlation_id: int) -> ClusterMetadata:
    """Parse the head of a Metadata v3..v8 response (brokers, cluster id, controller id)."""
    reader = _check_frame(frame, correlation_id)
    reader.int32()  # throttle_time_ms
    brokers = []
    for _ in range(reader.array_len()):
        node_id = reader.int32()
        host = reader.string()
        port = reader.int32()
        rack = reader.nullable_string()
        brokers.append(BrokerInfo(node_id, host, port, rack))
    cluster_id = reader.nullable_string()
    controller_id = reader.int32()
    return ClusterMetadata(tuple(brokers), cluster_id, controller_id)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _roundtrip(sock: socket.socket, request: bytes) -> bytes:
    sock.sendall(request)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if not 4 <= size <= 64 * 1024 * 1024:
        raise ProtocolError(f"implausible response size {size}")
    return _recv_exact(sock, size)


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def sasl_plain_login(sock: socket.socket, username: str, password: str) -> None:
    """SaslHandshake v1 (PLAIN) then SaslAuthenticate v0; raises ProtocolError when refused."""
    handshake = encode_request(API_SASL_HANDSHAKE, 1, 3, CLIENT_ID, _string("PLAIN"))
    reader = _check_frame(_roundtrip(sock, handshake), 3)
    error_code = reader.int16()
    if error_code != 0:
        raise ProtocolError(f"SaslHandshake(PLAIN) refused with error_code={error_code}")
    token = b"\0" + username.encode() + b"\0" + password.encode()
    body = struct.pack(">i", len(token)) + token
    reader = _check_frame(
        _roundtrip(sock, encode_request(API_SASL_AUTHENTICATE, 0, 4, CLIENT_ID, body)), 4
    )
    error_code = reader.int16()
    if error_code != 0:
        message = reader.nullable_string()
        raise ProtocolError(f"SASL/PLAIN login as {username!r} failed: {message} ({error_code})")


def probe(
    host: str, port: int, timeout: float = 5.0, login: tuple[str, str] | None = None
) -> ClusterMetadata:
    """Ask a broker for ApiVersions (v0) then Metadata (v4) over one raw TCP connection.

    With ``login`` (user, password) it first logs in with SASL/PLAIN (secured mode).
    Returns the cluster metadata; raises OSError (nothing listening) or ProtocolError.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        ranges = parse_api_versions_response(_roundtrip(sock, encode_api_versions_request(1)), 1)
        if login is not None:
            sasl_plain_login(sock, *login)
        meta = {r.api_key: r for r in ranges}.get(API_METADATA)
        if meta is None or not meta.min_version <= METADATA_PROBE_VERSION <= meta.max_version:
            raise ProtocolError(f"broker does not support Metadata v{METADATA_PROBE_VERSION}")
        return parse_metadata_response(_roundtrip(sock, encode_metadata_request(2)), 2)


def is_ready(port: int, login: tuple[str, str] | None = None) -> bool:
    """True when our single node answers the probe on HOST:`port` and lists itself."""
    try:
        md = probe(HOST, port, timeout=3.0, login=login)
    except (OSError, ProtocolError):
        return False
    return any(b.node_id == NODE_ID and b.port == port for b in md.brokers)
