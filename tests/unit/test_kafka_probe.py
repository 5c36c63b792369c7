"""Unit tests of the local-broker tooling (deploy/kafka/kafka.py) that need no broker:
the raw Kafka wire-protocol probe, cluster ids, config rendering and stale pid files."""

from __future__ import annotations

import base64
import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from graylane.deploy.kafka import broker as kafka_broker
from graylane.deploy.kafka import kafka as kt
from graylane.deploy.kafka import layout as kafka_layout
from graylane.deploy.kafka import probe as kafka_probe
from graylane.deploy.kafka import process as kafka_process


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def _api_versions_frame(
    correlation_id: int, error_code: int, apis: list[tuple[int, int, int]]
) -> bytes:
    body = struct.pack(">ihi", correlation_id, error_code, len(apis))
    for key, lo, hi in apis:
        body += struct.pack(">hhh", key, lo, hi)
    return body


def _metadata_frame(
    correlation_id: int,
    brokers: list[tuple[int, str, int, str | None]],
    cluster_id: str | None,
    controller_id: int,
) -> bytes:
    body = struct.pack(">ii", correlation_id, 0)  # correlation id, throttle_time_ms
    body += struct.pack(">i", len(brokers))
    for node_id, host, port, rack in brokers:
        body += struct.pack(">i", node_id) + _str(host) + struct.pack(">i", port) + _str(rack)
    body += _str(cluster_id) + struct.pack(">i", controller_id)
    body += struct.pack(">i", 0)  # topics: empty, ignored by the parser
    return body


# ---------------------------------------------------------------- request encoding


def test_api_versions_v0_request_bytes() -> None:
    got = kafka_probe.encode_api_versions_request(7, "abc")
    expected = (
        b"\x00\x00\x00\x0d"  # size 13
        + b"\x00\x12"  # api_key 18 (ApiVersions)
        + b"\x00\x00"  # api_version 0
        + b"\x00\x00\x00\x07"  # correlation_id 7
        + b"\x00\x03abc"  # client_id: int16 length + utf-8
    )
    assert got == expected


def test_null_client_id_is_length_minus_one() -> None:
    got = kafka_probe.encode_api_versions_request(1, None)
    assert got == struct.pack(">ihhih", 10, 18, 0, 1, -1)


def test_metadata_v4_request_asks_for_no_topics_without_auto_creation() -> None:
    got = kafka_probe.encode_metadata_request(2, "x")
    size, api_key, version, corr = struct.unpack(">ihhi", got[:12])
    assert (api_key, version, corr) == (3, 4, 2)
    assert size == len(got) - 4
    assert got[12:15] == b"\x00\x01x"
    # topics = [] (int32 0: empty, which is not "all topics"), allow_auto_topic_creation = false
    assert got[15:] == b"\x00\x00\x00\x00" + b"\x00"


# ---------------------------------------------------------------- response parsing


def test_parse_api_versions_response() -> None:
    frame = _api_versions_frame(7, 0, [(0, 3, 12), (3, 0, 13), (18, 0, 4)])
    ranges = kafka_probe.parse_api_versions_response(frame, 7)
    assert ranges == [
        kafka_probe.ApiVersionRange(0, 3, 12),
        kafka_probe.ApiVersionRange(3, 0, 13),
        kafka_probe.ApiVersionRange(18, 0, 4),
    ]


def test_api_versions_error_code_is_reported() -> None:
    frame = _api_versions_frame(7, 35, [(18, 0, 3)])  # UNSUPPORTED_VERSION
    with pytest.raises(kafka_probe.ProtocolError, match="error_code=35"):
        kafka_probe.parse_api_versions_response(frame, 7)


def test_correlation_id_mismatch() -> None:
    frame = _api_versions_frame(8, 0, [(18, 0, 4)])
    with pytest.raises(kafka_probe.ProtocolError, match="correlation id mismatch: sent 7, got 8"):
        kafka_probe.parse_api_versions_response(frame, 7)


@pytest.mark.parametrize("cut", [0, 3, 5, 9, 12])
def test_truncated_response(cut: int) -> None:
    frame = _api_versions_frame(7, 0, [(18, 0, 4), (3, 0, 13)])
    with pytest.raises(kafka_probe.ProtocolError):
        kafka_probe.parse_api_versions_response(frame[:cut], 7)


def test_empty_api_list_is_not_a_broker() -> None:
    with pytest.raises(kafka_probe.ProtocolError, match="no APIs"):
        kafka_probe.parse_api_versions_response(_api_versions_frame(1, 0, []), 1)


def test_parse_metadata_response_head() -> None:
    frame = _metadata_frame(2, [(1, "127.0.0.1", 9092, None), (2, "h2", 9093, "r1")], "cid", 1)
    md = kafka_probe.parse_metadata_response(frame, 2)
    assert md.brokers == (
        kafka_probe.BrokerInfo(1, "127.0.0.1", 9092, None),
        kafka_probe.BrokerInfo(2, "h2", 9093, "r1"),
    )
    assert md.cluster_id == "cid"
    assert md.controller_id == 1


# ---------------------------------------------------------------- probe over a real socket


def _fake_broker(
    api_versions_reply: bytes, metadata_reply: bytes | None
) -> tuple[socket.socket, threading.Thread, list[bytes]]:
    """One-connection TCP server answering with canned, size-prefixed frames."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    seen: list[bytes] = []

    def read_request(conn: socket.socket) -> bytes:
        (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
        return conn.recv(size, socket.MSG_WAITALL)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for reply in (api_versions_reply, metadata_reply):
                if reply is None:
                    return
                seen.append(read_request(conn))
                conn.sendall(struct.pack(">i", len(reply)) + reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread, seen


def test_probe_against_fake_broker() -> None:
    apis = _api_versions_frame(1, 0, [(3, 0, 12), (18, 0, 4)])
    meta = _metadata_frame(2, [(1, "127.0.0.1", 19092, None)], "abc", 1)
    server, thread, seen = _fake_broker(apis, meta)
    with server:
        md = kt.probe("127.0.0.1", server.getsockname()[1], timeout=5)
        thread.join(5)
    assert md.brokers[0].port == 19092 and md.cluster_id == "abc"
    assert struct.unpack(">hhi", seen[0][:8]) == (18, 0, 1)
    assert struct.unpack(">hhi", seen[1][:8]) == (3, 4, 2)


def test_probe_rejects_broker_without_metadata_v4() -> None:
    apis = _api_versions_frame(1, 0, [(3, 5, 12), (18, 0, 4)])
    server, thread, _ = _fake_broker(apis, None)
    with server, pytest.raises(kafka_probe.ProtocolError, match="Metadata v4"):
        kt.probe("127.0.0.1", server.getsockname()[1], timeout=5)
    thread.join(5)


def test_probe_connection_closed_mid_response() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            conn.sendall(struct.pack(">i", 100) + b"\x00\x00")  # promises 100 bytes, sends 2

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with server, pytest.raises(kafka_probe.ProtocolError, match="connection closed"):
        kt.probe("127.0.0.1", server.getsockname()[1], timeout=5)
    thread.join(5)


# ---------------------------------------------------------------- local state, no broker


def test_cluster_id_is_a_kafka_uuid() -> None:
    for _ in range(200):
        cid = kafka_broker.new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_rendered_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAYLANE_LOCAL_DIR", str(tmp_path))
    kafka_broker.write_config(19092, 20092)
    text = kafka_layout.server_properties().read_text()
    assert "${" not in text
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:20092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:20092"
    assert props["log.dirs"] == str(tmp_path.resolve() / "kafka" / "data")
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert kafka_process.properties_port(kafka_layout.server_properties()) == 19092


def test_ports_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAYLANE_KAFKA_CONTROLLER_PORT", raising=False)
    monkeypatch.setenv("GRAYLANE_KAFKA_PORT", "19092")
    assert kafka_layout.configured_port() == 19092
    assert kafka_layout.configured_controller_port(19092) == 20092
    monkeypatch.setenv("GRAYLANE_KAFKA_PORT", "nope")
    with pytest.raises(kafka_layout.KafkaLocalError):
        kafka_layout.configured_port()


@pytest.mark.parametrize(
    "content",
    # the live pid's id names no pid: every pytest-xdist worker collects the same tests
    ["999999999\n", "garbage\n", pytest.param(f"{os.getpid()}\n", id="this-process")],
)
def test_stale_pid_file_is_removed(
    content: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nonexistent pid, unparsable file, and a live pid that is not a Kafka broker (this test).
    monkeypatch.setenv("GRAYLANE_LOCAL_DIR", str(tmp_path))
    kafka_layout.pid_file().parent.mkdir(parents=True)
    kafka_layout.pid_file().write_text(content)
    assert kafka_process.running_pid() is None
    assert not kafka_layout.pid_file().exists()
    assert kafka_process.is_running() is False
