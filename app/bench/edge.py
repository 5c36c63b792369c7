"""``graylane bench edge``: hostile HTTP callers against a running gateway. Does it hold?

A router, a worker (the tiny demo GPT with a KV cache) and a gateway run as processes on
the local broker. Four tenants have keys of the same rate limit: three hostile ones and
a well-behaved one, the victim.

1. **Quiet**: the victim alone, paced one-token completions (at ``victim_fraction`` of
   the capacity measured first): its p99.
2. **Attack**: the hostile tenants (a process of their own, so the victim's figures are
   the gateway's, not the bench's) send a seeded corpus of ``calls`` calls, a fixed
   number open at once each, while the victim goes on exactly as before: oversized bodies
   (declared and chunked), deeply nested bodies, bodies full of unknown fields (valid
   calls otherwise), invalid UTF-8, slow writers and callers that never read their
   answer, streams that hang up after their first bytes, forged priorities, tags and
   tenant tags, forged feedback, wrong keys, and bursts past every limit; and a storm of
   ``storm`` (``calls`` / 5) streams opened at once that hang up after their first
   bytes. Beside them, forged cancels go to the cancels topic naming made-up request ids
   and guessed reply topics of the gateway.
3. **After**: one victim call, and every service process is still running.

Bodies over 64 KiB are sent as HTTP clients send large uploads (``Expect:
100-continue``), so a refusal can come before the body. Every answer is sorted by
status. A server error is an answer of 500 or above, or a call that got no answer at
all; not one: a hang-up by the bench itself (``-1``), and a large upload the gateway
refused midway and closed (``-2``: a body past the size cap, which the gateway stops
reading). The peak RSS is the gateway process's high-water mark (``VmHWM``), read at
the end.

The last line is JSON: ``peak_rss_mb``, ``server_errors``, ``victim_success_rate``,
``victim_p99_ms``, ``services_alive`` and the figures behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from graylane import serde
from graylane.app.bench.harness import (
    WorkerSpec,
    demo_model,
    fresh_topics,
    stack_env,
    start_router,
    start_worker,
)
from graylane.app.cli.demo import Service, free_port, start_service, stop_services
from graylane.kafka.seam import KafkaFactory
from graylane.settings import REPO_ROOT, Settings
from graylane.v1 import inference_pb2

__all__ = ["EdgeBenchConfig", "Hostile", "HostileCall", "corpus", "corpus_call", "main", "run"]

MODEL = "edge-bench"
_TAG = "bench-edge"
_TENANTS = ("mallory", "trudy", "eve")
_PROBE = "probe"
"""The tenant whose key measures the capacity first: its own, so the victim's token
bucket is full when the quiet phase starts, and with a limit far above the capacity."""
_PROBE_RATE_PER_S = 10_000.0
_NO_ANSWER = 0
"""The status of a call that got no answer."""
_HUNG_UP = -1
"""The status of a call the bench hung up on itself."""
_CUT = -2
"""An oversized upload the gateway refused and closed before the bench could read its
answer (HTTP allows a server to stop reading a body it refuses)."""


@dataclass(frozen=True, kw_only=True)
class EdgeBenchConfig:
    calls: int = 10_000
    """Hostile calls, all tenants together."""
    seed: int = 34
    concurrency: int = 8
    """Hostile calls open at once, per hostile tenant."""
    storm: int | None = None
    """Streams opened at once and hung up, beside the corpus (None: ``calls`` / 5)."""
    quiet_s: float = 20.0
    victim_fraction: float = 0.25
    """The victim's rate, as a share of the capacity measured first."""
    rate_per_s: float = 50.0
    burst: int = 100
    """The victim's key's limit (the gateway's defaults)."""
    hostile_rate_per_s: float = 5.0
    hostile_burst: int = 10
    """Each hostile key's limit: bursts go past it, and what gets through reaches the
    worker the victim shares."""


class Hostile(Enum):
    """One kind of hostile call."""

    OVERSIZED = "oversized"
    OVERSIZED_CHUNKED = "oversized_chunked"
    DEEP = "deep"
    FILLER = "unknown_fields"
    INVALID_UTF8 = "invalid_utf8"
    SLOW_WRITER = "slow_writer"
    NEVER_READS = "never_reads"
    STREAM_HANG_UP = "stream_hang_up"
    FORGED_PRIORITY = "forged_priority"
    FORGED_TAG = "forged_tag"
    FORGED_TENANT = "forged_tenant"
    FORGED_FEEDBACK = "forged_feedback"
    WRONG_KEY = "wrong_key"
    BURST = "burst"


@dataclass(frozen=True)
class HostileCall:
    kind: Hostile
    tenant: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    chunked: bool = False


def _keys(tenants: tuple[str, ...]) -> dict[str, str]:
    return {t: f"bench-{t}-{uuid.uuid4().hex}" for t in tenants}


def _completion(rng: random.Random, *, stream: bool = False, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "prompt": "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(4, 40))),
        "max_tokens": 1,
        "temperature": 0,
        "stream": stream,
        **extra,
    }


def _hostile(kind: Hostile, rng: random.Random) -> tuple[str, dict[str, str], bytes, bool]:
    """(path, extra headers, body, chunked) of one call of ``kind``."""
    chat = "/v1/chat/completions"
    completions = "/v1/completions"
    if kind is Hostile.OVERSIZED:
        return completions, {}, b"{" + b" " * (2 * 1024 * 1024) + b"}", False
    if kind is Hostile.OVERSIZED_CHUNKED:
        return completions, {}, b"[" + b"0," * (700 * 1024) + b"0]", True
    if kind is Hostile.DEEP:
        depth = rng.choice((40, 5_000, 200_000))
        return chat, {}, b"[" * depth + b"]" * depth, False
    if kind is Hostile.FILLER:
        filler: object = (
            [{}] * rng.randint(25_000, 100_000)
            if rng.random() < 0.5
            else ["x" * 60] * rng.randint(2_000, 9_000)
        )
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi", "junk": filler}],
            "max_tokens": 1,
            "x": filler,
        }
        return chat, {}, json.dumps(body).encode(), False
    if kind is Hostile.INVALID_UTF8:
        return (
            completions,
            {},
            b'{"model": "' + bytes(rng.randbytes(64)) + b'", "prompt": 1}',
            False,
        )
    if kind is Hostile.FORGED_PRIORITY:
        return completions, {"x-graylane-priority": "critical"}, _dump(_completion(rng)), False
    if kind is Hostile.FORGED_TAG:
        return completions, {"x-graylane-tag-cohort": "beta"}, _dump(_completion(rng)), False
    if kind is Hostile.FORGED_TENANT:
        return completions, {"x-graylane-tag-tenant": "victim"}, _dump(_completion(rng)), False
    if kind is Hostile.FORGED_FEEDBACK:
        forged = {"request_id": uuid.UUID(int=rng.getrandbits(128)).hex, "score": 1.0}
        return "/v1/feedback", {}, _dump(forged), False
    if kind is Hostile.STREAM_HANG_UP:
        return completions, {}, _dump(_completion(rng, stream=True)), False
    return completions, {}, _dump(_completion(rng)), False  # slow, never reads, burst, key


def _dump(body: object) -> bytes:
    return json.dumps(body).encode()


_VARIANTS = 8
"""Bodies per kind: calls reuse them, so the bench spends its CPU sending, not building."""


@functools.cache
def _variant(kind: Hostile, variant: int, seed: int) -> tuple[str, dict[str, str], bytes, bool]:
    return _hostile(kind, random.Random(f"{seed}:{kind.value}:{variant}"))


def corpus_call(index: int, seed: int) -> HostileCall:
    """Hostile call ``index`` of the corpus of ``seed`` (the same seed gives the same
    corpus; calls are made one at a time, so the corpus is never held whole)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choice(list(Hostile))
    tenant = rng.choice(_TENANTS)
    path, headers, body, chunked = _variant(kind, rng.randrange(_VARIANTS), seed)
    return HostileCall(kind, tenant, path, tuple(headers.items()), body, chunked)


def corpus(calls: int, seed: int) -> list[HostileCall]:
    """The first ``calls`` calls of the corpus of ``seed``."""
    return [corpus_call(i, seed) for i in range(calls)]


# -- raw HTTP: the bench needs to misbehave, which no HTTP library does ------------------


async def _send(
    port: int, call: HostileCall, key: str, *, timeout_s: float = 60.0
) -> tuple[int, float]:
    """(status, ms) of one call sent as ``call.kind`` says; ``_NO_ANSWER`` when none came."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, TimeoutError):
        return _NO_ANSWER, 0.0
    kind = call.kind
    careful = False
    try:
        head = [f"POST {call.path} HTTP/1.1", f"host: 127.0.0.1:{port}", "connection: close"]
        head.append(f"authorization: Bearer {'not-' + key if kind is Hostile.WRONG_KEY else key}")
        head.append("content-type: application/json")
        head += [f"{k}: {v}" for k, v in call.headers]
        if call.chunked:
            head.append("transfer-encoding: chunked")
        else:
            head.append(f"content-length: {len(call.body)}")
        careful = _careful(call)
        if careful:  # like curl with a large body: the answer may come before the body
            head.append("expect: 100-continue")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        if careful:
            line = await asyncio.wait_for(reader.readline(), timeout_s)
            if not line.startswith(b"HTTP/1.1 100"):
                return (int(line.split(b" ", 2)[1]) if line else _NO_ANSWER), 0.0
            await reader.readline()  # the blank line after the 100
        # The gateway may answer before it has read everything: its answer is read still.
        with contextlib.suppress(OSError):
            await _write_body(writer, call)
        if kind is Hostile.NEVER_READS:
            await asyncio.sleep(0.5)  # the answer waits in the socket, unread
            return _HUNG_UP, 0.0
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        if not line:
            return _NO_ANSWER, 0.0
        status = int(line.split(b" ", 2)[1])
        if kind is Hostile.STREAM_HANG_UP and status == 200:
            await asyncio.wait_for(reader.read(64), timeout_s)  # its first bytes, then gone
            return status, (time.perf_counter() - started) * 1e3
        await asyncio.wait_for(reader.read(), timeout_s)
        return status, (time.perf_counter() - started) * 1e3
    except (OSError, TimeoutError, ValueError, IndexError):
        return (_CUT if careful else _NO_ANSWER), 0.0
    finally:
        writer.close()


async def _write_body(writer: asyncio.StreamWriter, call: HostileCall) -> None:
    if call.chunked:
        for i in range(0, len(call.body), 65536):
            piece = call.body[i : i + 65536]
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
    elif call.kind is Hostile.SLOW_WRITER:
        for i in range(0, len(call.body), 8):
            writer.write(call.body[i : i + 8])
            await writer.drain()
            await asyncio.sleep(0.02)
    else:
        writer.write(call.body)
    await writer.drain()


_LARGE = 64 * 1024


def _careful(call: HostileCall) -> bool:
    """Whether the call is sent as HTTP clients send large uploads (``Expect:
    100-continue``; the gateway may refuse such an upload midway and close)."""
    return call.chunked or len(call.body) > _LARGE


@dataclass
class _Victim:
    statuses: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    sent_s: list[float] = field(default_factory=list)
    """When each answered call was sent, in seconds from the load's start."""

    def slowest(self, n: int = 5) -> list[tuple[float, float]]:
        """(sent at s, ms) of the ``n`` slowest answered calls, slowest first."""
        pairs = sorted(zip(self.latencies_ms, self.sent_s, strict=True), reverse=True)[:n]
        return [(round(at, 2), round(ms, 1)) for ms, at in pairs]

    def p99(self) -> float:
        return float(np.percentile(self.latencies_ms, 99)) if self.latencies_ms else 0.0

    def success(self) -> float:
        return sum(s == 200 for s in self.statuses) / max(1, len(self.statuses))


async def _victim_load(port: int, key: str, rate: float, stop: asyncio.Event) -> _Victim:
    """Paced one-token completions, one every 1/rate s (open loop) until ``stop``."""
    rng = random.Random(7)
    victim = _Victim()
    tasks: list[asyncio.Task[None]] = []

    async def one() -> None:
        call = HostileCall(Hostile.BURST, "victim", "/v1/completions", (), _dump(_completion(rng)))
        sent = time.monotonic() - started
        status, ms = await _send(port, call, key)
        victim.statuses.append(status)
        if status == 200:
            victim.latencies_ms.append(ms)
            victim.sent_s.append(sent)

    started = time.monotonic()
    i = 0
    while not stop.is_set():
        await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
        i += 1
    await asyncio.gather(*tasks)
    return victim


async def _capacity(port: int, key: str, seconds: float) -> float:
    """Victim-shaped calls/s of 8 closed-loop callers (on the probe's key, alone)."""
    rng = random.Random(3)
    done = 0
    end = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < end:
            call = HostileCall(Hostile.BURST, "v", "/v1/completions", (), _dump(_completion(rng)))
            if (await _send(port, call, key))[0] == 200:
                done += 1

    await asyncio.gather(*(caller() for _ in range(8)))
    return done / seconds


async def _forged_cancels(factory: KafkaFactory, count: int, seed: int) -> int:
    """Cancels of made-up request ids naming guessed gateway reply topics."""
    rng = random.Random(seed)
    producer = factory.producer(client_suffix="edge-forger")
    await producer.start()
    try:
        for i in range(count):
            cancel = inference_pb2.CancelRequest(
                request_id=uuid.UUID(int=rng.getrandbits(128)).hex,
                reply_topic=factory.layout.reply(f"gateway-bench-{i}"),
                model=MODEL,
            )
            await producer.send_and_wait(
                factory.layout.cancels(), serde.encode(cancel), key=cancel.request_id.encode()
            )
    finally:
        await producer.stop()
    return count


async def _attack(
    port: int, keys: dict[str, str], calls: int, seed: int, concurrency: int, storm: int
) -> tuple[Counter[int], Counter[str]]:
    """Every hostile tenant sends its share of the corpus, ``concurrency`` open at once;
    beside them, a storm of ``storm`` streams opened at once, hung up after their first
    bytes."""
    statuses: Counter[int] = Counter()
    by_kind: Counter[str] = Counter()
    queues: dict[str, list[int]] = {t: [] for t in _TENANTS}
    for i in range(calls):
        queues[_tenant_of(i, seed)].append(i)

    async def caller(mine: list[int], key: str) -> None:
        while mine:
            call = corpus_call(mine.pop(), seed)
            status, _ = await _send(port, call, key)
            statuses[status] += 1
            by_kind[f"{call.kind.value}:{status}"] += 1

    async def hang_up(i: int) -> None:
        rng = random.Random(f"{seed}:storm:{i}")
        tenant = _TENANTS[i % len(_TENANTS)]
        body = _dump(_completion(rng, stream=True))
        call = HostileCall(Hostile.STREAM_HANG_UP, tenant, "/v1/completions", (), body)
        status, _ = await _send(port, call, keys[tenant])
        statuses[status] += 1
        by_kind[f"storm:{status}"] += 1

    tasks = [hang_up(i) for i in range(storm)]
    for tenant, mine in queues.items():
        tasks += [caller(mine, keys[tenant]) for _ in range(concurrency)]
    await asyncio.gather(*tasks)
    return statuses, by_kind


def _tenant_of(index: int, seed: int) -> str:
    rng = random.Random(seed * 1_000_003 + index)
    rng.choice(list(Hostile))
    return rng.choice(_TENANTS)


def _attack_process(
    port: int, keys: dict[str, str], calls: int, seed: int, concurrency: int, storm: int
) -> tuple[dict[int, int], dict[str, int]]:
    """:func:`_attack` in a process of its own (the bench's victim keeps its loop)."""
    statuses, by_kind = asyncio.run(_attack(port, keys, calls, seed, concurrency, storm))
    return dict(statuses), dict(by_kind)


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _services(
    model: Path, env: dict[str, str], port: int, keys: dict[str, str], cfg: EdgeBenchConfig
) -> list[Service]:
    worker = WorkerSpec("v1", {"fp32": str(model)})
    limits = {
        "victim": (cfg.rate_per_s, cfg.burst),
        _PROBE: (_PROBE_RATE_PER_S, int(_PROBE_RATE_PER_S)),
    }
    entries = ",".join(
        "{}:infer:{}:{}:{}".format(
            key, tenant, *limits.get(tenant, (cfg.hostile_rate_per_s, cfg.hostile_burst))
        )
        for tenant, key in keys.items()
    )
    return [
        start_router(MODEL, "v1", env, _TAG),
        start_worker(worker, MODEL, env, _TAG),
        start_service(
            f"{_TAG}-gateway",
            ["gateway", "--port", str(port), "--replica", "bench"],
            REPO_ROOT / ".local" / "logs",
            {**env, "GRAYLANE_GATEWAY_KEYS": entries},
        ),
    ]


async def _wait_answered(port: int, key: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    rng = random.Random(1)
    while True:
        call = HostileCall(Hostile.BURST, "v", "/v1/completions", (), _dump(_completion(rng)))
        if (await _send(port, call, key, timeout_s=5))[0] == 200:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the gateway did not answer a completion")
        await asyncio.sleep(0.5)


async def _measure(
    settings: Settings, model: Path, cfg: EdgeBenchConfig, progress: Callable[[str], None]
) -> dict[str, object]:
    settings, factory = await fresh_topics(settings, "bedge", MODEL, ["v1"])
    port = free_port()
    keys = _keys(("victim", _PROBE, *_TENANTS))
    services = _services(model, stack_env(settings), port, keys, cfg)
    victim_key = keys["victim"]
    storm = cfg.calls // 5 if cfg.storm is None else cfg.storm
    try:
        progress("waiting for the router, the worker and the gateway")
        await _wait_answered(port, victim_key, 240)
        capacity = await _capacity(port, keys[_PROBE], 4.0)
        rate = max(2.0, min(cfg.rate_per_s * 0.5, capacity * cfg.victim_fraction))
        progress(f"capacity {capacity:.0f} calls/s; the victim calls {rate:.1f}/s")
        stop = asyncio.Event()
        quiet_task = asyncio.create_task(_victim_load(port, victim_key, rate, stop))
        await asyncio.sleep(cfg.quiet_s)
        stop.set()
        quiet = await quiet_task
        progress(f"quiet: p99 {quiet.p99():.1f} ms, success {quiet.success():.3f}")
        stop = asyncio.Event()
        victim_task = asyncio.create_task(_victim_load(port, victim_key, rate, stop))
        started = time.monotonic()
        cancels = asyncio.create_task(_forged_cancels(factory, max(10, cfg.calls // 10), cfg.seed))
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            counted = await loop.run_in_executor(
                pool,
                _attack_process,
                port,
                {t: keys[t] for t in _TENANTS},
                cfg.calls,
                cfg.seed,
                cfg.concurrency,
                storm,
            )
        statuses, by_kind = Counter(counted[0]), Counter(counted[1])
        forged_cancels = await cancels
        attack_s = time.monotonic() - started
        stop.set()
        during = await victim_task
        progress(
            f"attack: {cfg.calls} calls in {attack_s:.0f} s; victim p99 {during.p99():.1f} ms, "
            f"success {during.success():.3f}; its slowest calls (sent at s, ms): "
            + ", ".join(f"{at:g} s {ms:g} ms" for at, ms in during.slowest())
        )
        after = await _send(
            port,
            HostileCall(
                Hostile.BURST, "victim", "/v1/completions", (), _dump(_completion(random.Random(2)))
            ),
            victim_key,
        )
        alive = all(s.process.poll() is None for s in services) and after[0] == 200
        peak = _peak_rss_mb(services[-1].process.pid)
    finally:
        stop_services(services)
    server_errors = sum(n for s, n in statuses.items() if s >= 500 or s == _NO_ANSWER)
    server_errors += sum(1 for s in during.statuses if s >= 500 or s == _NO_ANSWER)
    table = sorted(by_kind.items())
    print(f"{'kind:status':>28} {'calls':>7}", flush=True)
    for name, n in table:
        print(f"{name:>28} {n:>7}", flush=True)
    p99_ratio = during.p99() / quiet.p99() if quiet.p99() else 0.0
    return {
        "hostile_calls": cfg.calls,
        "storm_streams": storm,
        "tenants": len(_TENANTS),
        "seed": cfg.seed,
        "forged_cancels": forged_cancels,
        "attack_s": round(attack_s, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "victim_rate_per_s": round(rate, 1),
        "victim_calls": len(during.statuses),
        "victim_quiet_p99_ms": round(quiet.p99(), 2),
        "victim_quiet_success_rate": round(quiet.success(), 4),
        "victim_statuses": {
            phase: {str(k): v for k, v in sorted(Counter(v.statuses).items())}
            for phase, v in (("quiet", quiet), ("attack", during))
        },
        "victim_slowest": during.slowest(),
        "victim_p99_over_quiet": round(p99_ratio, 2),
        "peak_rss_mb": round(peak, 1),
        "server_errors": server_errors,
        "victim_success_rate": round(during.success(), 4),
        "victim_p99_ms": round(during.p99(), 2),
        "services_alive": alive,
    }


def run(cfg: EdgeBenchConfig, progress: Callable[[str], None]) -> dict[str, object]:
    from graylane.deploy.kafka import broker as kafka_broker

    progress("starting the broker")
    kafka_broker.start()
    model = demo_model("tiny", kv_cache=True, progress=progress)
    return asyncio.run(_measure(Settings.from_env(), model, cfg, progress))


def main(cfg: EdgeBenchConfig) -> int:
    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    print(json.dumps(run(cfg, progress)), flush=True)
    return 0
