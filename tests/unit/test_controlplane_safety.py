"""Safer control-plane defaults (issue 10, item 9): weak tokens, plaintext binds,
list/log limits and Watch streams are refused or capped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from graylane.app.cli.main import main
from graylane.kafka.seam import KafkaFactory
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.limits import (
    ApiLimits,
    UnsafeConfig,
    WatchSlots,
    check_limit,
    check_startup,
    is_loopback,
)
from graylane.services.controlplane.logic.rules import InvalidArgument
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.services.controlplane.servicers import AuditServicer, ControlPlane, RolloutsServicer
from graylane.settings import Settings
from graylane.v1 import controlplane_pb2

STRONG = "0123456789abcdef"  # 16 characters


def tokens(text: str) -> TokenTable:
    return TokenTable(parse_tokens(text))


def start(text: str = f"{STRONG}:operator", host: str = "127.0.0.1", **kw: Any) -> None:
    check_startup(
        tokens=tokens(text),
        host=host,
        tls_cert=kw.get("tls_cert"),
        tls_key=kw.get("tls_key"),
        insecure=kw.get("insecure", False),
    )


def test_placeholder_and_short_tokens_are_refused_without_echoing_them() -> None:
    start()  # 16 characters on loopback: fine
    with pytest.raises(UnsafeConfig, match="placeholder"):
        start("change-me:operator:ops")
    with pytest.raises(UnsafeConfig, match="ops"):
        start(f"{STRONG}:operator,change-me:operator:ops")
    with pytest.raises(UnsafeConfig) as short:
        start(f"{STRONG}:operator,viewer-secret1:read_only:bob")
    assert "bob: 14 characters" in str(short.value)
    assert "viewer-secret1" not in str(short.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("[::]", False),
        ("", False),
        ("10.1.2.3", False),
        ("cp.example.com", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_plaintext_beyond_loopback_needs_insecure_or_tls(tmp_path: Path) -> None:
    with pytest.raises(UnsafeConfig, match="--insecure"):
        start(host="0.0.0.0")
    start(host="0.0.0.0", insecure=True)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    start(host="0.0.0.0", tls_cert=cert, tls_key=key)
    with pytest.raises(UnsafeConfig, match="both"):
        start(host="0.0.0.0", tls_cert=cert)


def test_the_server_refuses_before_touching_the_database(tmp_path: Path) -> None:
    assert ServerConfig(tokens=tokens(f"{STRONG}:operator")).host == "127.0.0.1"
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'never.db'}")
    with pytest.raises(UnsafeConfig):
        ControlPlaneServer(ServerConfig(tokens=tokens("short:operator")), KafkaFactory(settings))
    with pytest.raises(UnsafeConfig):
        ControlPlaneServer(
            ServerConfig(host="0.0.0.0", tokens=tokens(f"{STRONG}:operator")),
            KafkaFactory(settings),
        )
    assert not (tmp_path / "never.db").exists()


def test_cli_refuses_weak_tokens_and_plaintext_binds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRAYLANE_DB_URL", f"sqlite:///{tmp_path / 'never.db'}")
    monkeypatch.setenv("GRAYLANE_CP_TOKENS", "change-me:operator:ops")
    with pytest.raises(SystemExit, match="placeholder"):
        main(["controlplane"])
    monkeypatch.setenv("GRAYLANE_CP_TOKENS", f"{STRONG}:operator:ops")
    with pytest.raises(SystemExit, match="--insecure"):
        main(["controlplane", "--host", "0.0.0.0"])
    with pytest.raises(SystemExit, match="limits must be >= 1"):
        main(["controlplane", "--max-watch-streams", "0"])
    assert not (tmp_path / "never.db").exists()


def test_check_limit() -> None:
    assert check_limit(0, default=100, maximum=1000, what="rows") == 100
    assert check_limit(7, default=100, maximum=1000, what="rows") == 7
    assert check_limit(1000, default=100, maximum=1000, what="rows") == 1000
    assert check_limit(0, default=100, maximum=50, what="rows") == 50
    with pytest.raises(InvalidArgument, match="maximum of 1000 rows"):
        check_limit(1001, default=100, maximum=1000, what="rows")
    with pytest.raises(InvalidArgument, match=">= 0"):
        check_limit(-1, default=100, maximum=1000, what="rows")


def test_watch_slots() -> None:
    slots = WatchSlots(2)
    assert slots.acquire() and slots.acquire() and not slots.acquire()
    slots.release()
    assert slots.acquire()


# -- through the servicers, with a fake gRPC context ---------------------------------


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class FakeContext:
    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Aborted(code, message)


class FakeStore:
    def __init__(self) -> None:
        self.limits: list[int] = []

    def list_rollouts(self, model: str, *, active_only: bool = False, limit: int = 0) -> list[Any]:
        self.limits.append(limit)
        return []

    def query_audit(self, **kwargs: Any) -> list[Any]:
        self.limits.append(kwargs["limit"])
        return []


def control(store: FakeStore, limits: ApiLimits) -> ControlPlane:
    return ControlPlane(
        registry=None,  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        bus=None,  # type: ignore[arg-type]
        hub=RolloutHub(),
        tokens=tokens(f"{STRONG}:operator"),
        limits=limits,
    )


async def test_list_and_audit_limits_are_capped_with_invalid_argument() -> None:
    store = FakeStore()
    cp = control(store, ApiLimits(max_list_limit=10, max_audit_limit=20))
    rollouts, audit = RolloutsServicer(cp), AuditServicer(cp)
    await rollouts.List(controlplane_pb2.ListRolloutsRequest(limit=10), FakeContext())
    await rollouts.List(controlplane_pb2.ListRolloutsRequest(), FakeContext())
    await audit.Query(controlplane_pb2.AuditQuery(limit=20), FakeContext())
    assert store.limits == [10, 10, 20]
    with pytest.raises(Aborted) as too_many:
        await rollouts.List(controlplane_pb2.ListRolloutsRequest(limit=11), FakeContext())
    assert too_many.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(Aborted) as too_many_records:
        await audit.Query(controlplane_pb2.AuditQuery(limit=1_000_000), FakeContext())
    assert too_many_records.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum of 20 audit records" in str(too_many_records.value)


async def test_watch_streams_are_capped_with_resource_exhausted() -> None:
    cp = control(FakeStore(), ApiLimits(max_watch_streams=2))
    servicer = RolloutsServicer(cp)
    request = controlplane_pb2.WatchRolloutsRequest(model="gpt")
    streams = [servicer.Watch(request, FakeContext()) for _ in range(3)]
    waiting = [asyncio.ensure_future(s.__anext__()) for s in streams[:2]]
    await asyncio.sleep(0.01)
    assert cp.watch_slots.open == 2
    with pytest.raises(Aborted) as refused:
        await streams[2].__anext__()
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 Watch streams" in str(refused.value)
    # Closing a stream frees its slot.
    waiting[0].cancel()
    await asyncio.gather(waiting[0], return_exceptions=True)
    await streams[0].aclose()
    assert cp.watch_slots.open == 1
    again = servicer.Watch(request, FakeContext())
    pending = asyncio.ensure_future(again.__anext__())
    await asyncio.sleep(0.01)
    assert cp.watch_slots.open == 2
    for task in (pending, waiting[1]):
        task.cancel()
    await asyncio.gather(pending, waiting[1], return_exceptions=True)
    await again.aclose()
    await streams[1].aclose()
    assert cp.watch_slots.open == 0
