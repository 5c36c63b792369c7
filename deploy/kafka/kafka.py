#!/usr/bin/env python3
"""Local single-node Apache Kafka broker (KRaft, no Docker) for Graylane tests and demos.

Usage::

    python deploy/kafka/kafka.py fetch     # download the broker jars once (Maven Central)
    python deploy/kafka/kafka.py start     # format storage once, start in background, wait ready
    python deploy/kafka/kafka.py status    # "Apache Kafka 4.0.1 running on 127.0.0.1:9092 (pid N)"
    python deploy/kafka/kafka.py stop      # SIGTERM, wait up to 30 s, then SIGKILL
    python deploy/kafka/kafka.py logs [-n 50] [-f]
    python deploy/kafka/kafka.py reset     # stop and delete the broker data (topics, offsets)

Importable (stdlib only)::

    from graylane.deploy.kafka import kafka
    kafka.start()            # -> "127.0.0.1:9092"; no-op when already running
    kafka.bootstrap()        # -> "127.0.0.1:9092"
    kafka.is_running()
    kafka.stop()

Layout:
  * jars:  ${GRAYLANE_CACHE_DIR:-~/.cache/graylane}/kafka-<version>/libs   (shared between clones)
  * state: ${GRAYLANE_LOCAL_DIR:-<repo>/.local}/kafka/{config,data,logs,kafka.pid}

Environment: GRAYLANE_KAFKA_PORT (9092), GRAYLANE_KAFKA_CONTROLLER_PORT (port + 1000),
GRAYLANE_CACHE_DIR, GRAYLANE_LOCAL_DIR, JAVA_HOME (else `java` from PATH), MVN (else `mvn`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# --------------------------------------------------------------------------------------------
# Pinned versions: the ONE place to change them (the pom takes them as properties).
# --------------------------------------------------------------------------------------------
KAFKA_VERSION = "4.0.1"
SCALA_VERSION = "2.13"
# Same Log4j 2 line as the official Kafka 4.0 distribution.
LOG4J_VERSION = "2.24.3"
KAFKA_ARTIFACT = f"org.apache.kafka:kafka_{SCALA_VERSION}:{KAFKA_VERSION}"

HOST = "127.0.0.1"
DEFAULT_PORT = 9092
CONTROLLER_PORT_OFFSET = 1000
NODE_ID = 1
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
HEAP_OPTS = ["-Xms256m", "-Xmx512m"]
JVM_OPTS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
POM_FILE = HERE / "pom.xml"
TEMPLATE_FILE = HERE / "server.properties.template"
LOG4J_FILE = HERE / "log4j2.properties"

MARKER_NAME = ".graylane-fetch-complete.json"
VERSION_RE = re.compile(r"Kafka version: (\S+)")
DOWNLOADED_RE = re.compile(r"Downloaded from [^:\s]+: (\S+)")


class KafkaLocalError(RuntimeError):
    """Any failure of the local broker tooling, with a message meant for humans."""


def _say(msg: str) -> None:
    print(f"[kafka] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Paths (computed on every call so tests can change the environment)
# --------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("GRAYLANE_CACHE_DIR") or str(Path.home() / ".cache" / "graylane")
    return Path(base).expanduser() / f"kafka-{KAFKA_VERSION}"


def libs_dir() -> Path:
    return cache_dir() / "libs"


def local_dir() -> Path:
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "kafka"


def config_dir() -> Path:
    return local_dir() / "config"


def data_dir() -> Path:
    return local_dir() / "data"


def logs_dir() -> Path:
    return local_dir() / "logs"


def pid_file() -> Path:
    return local_dir() / "kafka.pid"


def server_properties() -> Path:
    return config_dir() / "server.properties"


def server_log() -> Path:
    return logs_dir() / "server.log"


def stdout_log() -> Path:
    return logs_dir() / "kafkaServer.out"


def configured_port() -> int:
    return _env_port("GRAYLANE_KAFKA_PORT", DEFAULT_PORT)


def configured_controller_port(port: int) -> int:
    return _env_port("GRAYLANE_KAFKA_CONTROLLER_PORT", port + CONTROLLER_PORT_OFFSET)


def _env_port(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise KafkaLocalError(f"{name}={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise KafkaLocalError(f"{name}={value} is out of range")
    return value


# --------------------------------------------------------------------------------------------
# Minimal Kafka wire protocol (ApiVersions v0 and Metadata v4), enough for a readiness probe.
#   request  = int32 size | int16 api_key | int16 api_version | int32 correlation_id
#              | string client_id (int16 length + utf-8) | body
#   response = int32 size | int32 correlation_id | body       (header v0: no tagged fields)
# --------------------------------------------------------------------------------------------
API_METADATA = 3
API_VERSIONS = 18
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


def probe(host: str = HOST, port: int | None = None, timeout: float = 5.0) -> ClusterMetadata:
    """Ask a broker for ApiVersions (v0) then Metadata (v4) over one raw TCP connection.

    Returns the cluster metadata; raises OSError (nothing listening) or ProtocolError.
    """
    port = port if port is not None else bootstrap_port()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        ranges = parse_api_versions_response(_roundtrip(sock, encode_api_versions_request(1)), 1)
        meta = {r.api_key: r for r in ranges}.get(API_METADATA)
        if meta is None or not meta.min_version <= METADATA_PROBE_VERSION <= meta.max_version:
            raise ProtocolError(f"broker does not support Metadata v{METADATA_PROBE_VERSION}")
        return parse_metadata_response(_roundtrip(sock, encode_metadata_request(2)), 2)


def _is_ready(port: int) -> bool:
    try:
        md = probe(HOST, port, timeout=3.0)
    except (OSError, ProtocolError):
        return False
    return any(b.node_id == NODE_ID and b.port == port for b in md.brokers)


# --------------------------------------------------------------------------------------------
# fetch
# --------------------------------------------------------------------------------------------
def _which_mvn() -> str:
    mvn = os.environ.get("MVN") or shutil.which("mvn")
    if not mvn:
        raise KafkaLocalError(
            "Maven (`mvn`) is needed once to download the Kafka jars from Maven Central; "
            "install it (Debian: apt-get install -y maven) or set MVN=/path/to/mvn"
        )
    return mvn


def _read_marker() -> dict[str, object] | None:
    marker = cache_dir() / MARKER_NAME
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched() -> bool:
    marker = _read_marker()
    if not marker or marker.get("kafka") != KAFKA_VERSION or marker.get("log4j") != LOG4J_VERSION:
        return False
    jars = marker.get("jars")
    if not isinstance(jars, list) or not jars:
        return False
    libs = libs_dir()
    return all((libs / str(j)).is_file() and (libs / str(j)).stat().st_size > 0 for j in jars)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch(force: bool = False) -> Path:
    """Download kafka_2.13 + runtime deps + Log4j 2 binding into the cache; returns libs dir.

    Idempotent: returns at once when the completion marker lists jars that are all present.
    """
    if not force and is_fetched():
        return libs_dir()
    cache = cache_dir()
    with _file_lock(cache.parent / f".kafka-{KAFKA_VERSION}.lock"):
        if not force and is_fetched():  # another process finished while we waited
            return libs_dir()
        return _fetch_locked(cache)


def _fetch_locked(cache: Path) -> Path:
    mvn = _which_mvn()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / MARKER_NAME).unlink(missing_ok=True)
    pom = cache / "pom.xml"
    shutil.copyfile(POM_FILE, pom)
    staging = cache / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    _say(f"fetch: resolving {KAFKA_ARTIFACT} + log4j {LOG4J_VERSION} from Maven Central")
    _say(f"fetch: into {cache / 'libs'}")
    cmd = [
        mvn,
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
        f"-Dkafka.version={KAFKA_VERSION}",
        f"-Dlog4j.version={LOG4J_VERSION}",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cache,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    transcript: list[str] = []
    downloads = 0
    for line in proc.stdout:
        line = line.rstrip("\n")
        transcript.append(line)
        if DOWNLOADED_RE.search(line):
            downloads += 1
            if downloads % 50 == 0:
                _say(f"fetch: {downloads} files downloaded so far (Maven plugins + Kafka jars)")
        elif "copy-dependencies" in line and "---" in line:
            _say("fetch: running maven-dependency-plugin:copy-dependencies")
    rc = proc.wait()
    if rc != 0:
        tail = "\n".join(transcript[-40:])
        raise KafkaLocalError(f"`{' '.join(cmd)}` failed (exit {rc}):\n{tail}")
    jars = sorted(p.name for p in staging.glob("*.jar"))
    if not any(j.startswith(f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}") for j in jars):
        raise KafkaLocalError(f"Maven finished but kafka_{SCALA_VERSION} is missing in {staging}")
    libs = libs_dir()
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    size = sum((libs / j).stat().st_size for j in jars)
    marker = {
        "kafka": KAFKA_VERSION,
        "scala": SCALA_VERSION,
        "log4j": LOG4J_VERSION,
        "jars": jars,
        "bytes": size,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = cache / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(cache / MARKER_NAME)
    _say(
        f"fetch: {len(jars)} jars, {size / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s "
        f"({downloads} files downloaded)"
    )
    return libs


# --------------------------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------------------------
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (reaps it if it is our own child)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X")


def _is_our_broker(pid: int) -> bool:
    args = _cmdline(pid)
    return MAIN_CLASS in args and str(server_properties()) in args


def _read_pid() -> int | None:
    try:
        text = pid_file().read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _scan_for_broker() -> int | None:
    """Find our broker without a pid file (e.g. the file was deleted while it ran)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if pid != os.getpid() and _is_our_broker(pid) and _alive(pid):
                return pid
    return None


def running_pid(cleanup: bool = True) -> int | None:
    """The pid of the broker started from this checkout, or None.

    A stale pid file (process gone, zombie, or pid reused by something that is not this
    broker) is removed when `cleanup` is true.
    """
    pid = _read_pid()
    if pid is not None and _alive(pid) and _is_our_broker(pid):
        return pid
    if pid_file().exists() and cleanup:
        why = "unreadable" if pid is None else f"pid {pid} is not a running Kafka broker"
        _say(f"removing stale pid file {pid_file()} ({why})")
        pid_file().unlink(missing_ok=True)
    found = _scan_for_broker()
    if found is not None and cleanup:
        pid_file().write_text(f"{found}\n")
    return found


def is_running() -> bool:
    return running_pid() is not None


def _properties_port(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(r"^advertised\.listeners=PLAINTEXT://[^:\s]+:(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def bootstrap_port() -> int:
    """Port of the running broker, else the configured one."""
    if running_pid(cleanup=False) is not None:
        port = _properties_port(server_properties())
        if port is not None:
            return port
    return configured_port()


def bootstrap() -> str:
    """bootstrap.servers for clients, e.g. "127.0.0.1:9092"."""
    return f"{HOST}:{bootstrap_port()}"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(data.splitlines()[-lines:])


def logged_version(since: int = 0) -> str | None:
    """Last "Kafka version: X" the broker logged (AppInfoParser, at startup)."""
    try:
        with open(server_log(), "rb") as fh:
            fh.seek(since)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = VERSION_RE.findall(text)
    return found[-1] if found else None


# --------------------------------------------------------------------------------------------
# start / stop
# --------------------------------------------------------------------------------------------
def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise KafkaLocalError(
            "no `java` found (Kafka 4.0 needs Java 17+); set JAVA_HOME or install "
            "openjdk-17-jre-headless"
        )
    return java


def _check_java(java: str) -> None:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m:
        major = int(m.group(1))
        if major == 1 and m.group(2):
            major = int(m.group(2))
        if major < 17:
            raise KafkaLocalError(f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java 17+")


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0


def _write_config(port: int, controller_port: int) -> None:
    config_dir().mkdir(parents=True, exist_ok=True)
    text = string.Template(TEMPLATE_FILE.read_text()).substitute(
        port=port, controller_port=controller_port, data_dir=str(data_dir())
    )
    tmp = server_properties().with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(server_properties())


def _jvm_base(java: str, libs: Path) -> list[str]:
    return [
        java,
        f"-Dlog4j2.configurationFile={LOG4J_FILE}",
        f"-Dkafka.logs.dir={logs_dir()}",
        "-cp",
        f"{libs}/*",
    ]


def new_cluster_id() -> str:
    """A Kafka Uuid string: 16 random bytes, URL-safe base64 without padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not cid.startswith("-"):
            return cid


def _format_storage(java: str, libs: Path) -> None:
    if (data_dir() / "meta.properties").exists():
        return
    data_dir().mkdir(parents=True, exist_ok=True)
    cluster_id = new_cluster_id()
    _say(f"formatting KRaft storage in {data_dir()} (cluster id {cluster_id})")
    cmd = [
        *_jvm_base(java, libs),
        "-Xmx256m",
        STORAGE_TOOL_CLASS,
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(server_properties()),
        "--ignore-formatted",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if out.returncode != 0 or not (data_dir() / "meta.properties").exists():
        raise KafkaLocalError(
            f"formatting the storage failed (exit {out.returncode}):\n{out.stdout}{out.stderr}"
        )
    for line in out.stdout.splitlines():
        if line.strip():
            _say(f"  {line.strip()}")


def start(port: int | None = None, timeout: float = START_TIMEOUT_S) -> str:
    """Start the broker in the background (no-op when already running); returns bootstrap."""
    with _file_lock(local_dir() / ".lock"):
        return _start_locked(port, timeout)


def _start_locked(port: int | None, timeout: float) -> str:
    wanted = port if port is not None else configured_port()
    pid = running_pid()
    if pid is not None:
        running_port = _properties_port(server_properties())
        if running_port != wanted:
            raise KafkaLocalError(
                f"the broker is already running on port {running_port} (pid {pid}); "
                f"stop it first to use port {wanted}"
            )
        if not _wait_ready(pid, wanted, timeout):
            raise KafkaLocalError(
                f"the broker process {pid} is alive but does not answer on {HOST}:{wanted}\n"
                + _tail(server_log())
            )
        _say(f"already running: {_describe(pid, wanted)}")
        return f"{HOST}:{wanted}"

    controller_port = configured_controller_port(wanted)
    if controller_port == wanted:
        raise KafkaLocalError("the broker and controller ports must differ")
    for p, role in ((wanted, "broker"), (controller_port, "controller")):
        if _port_in_use(p):
            raise KafkaLocalError(
                f"{role} port {HOST}:{p} is already in use by another process (not the broker "
                f"of this checkout); free it or set "
                f"{'GRAYLANE_KAFKA_PORT' if role == 'broker' else 'GRAYLANE_KAFKA_CONTROLLER_PORT'}"
            )

    libs = fetch()
    java = _java()
    _check_java(java)
    for d in (config_dir(), data_dir(), logs_dir()):
        d.mkdir(parents=True, exist_ok=True)
    _write_config(wanted, controller_port)
    _format_storage(java, libs)

    log_offset = server_log().stat().st_size if server_log().exists() else 0
    cmd = [
        *_jvm_base(java, libs),
        *HEAP_OPTS,
        *JVM_OPTS,
        MAIN_CLASS,
        str(server_properties()),
    ]
    _say(
        f"starting Apache Kafka {KAFKA_VERSION} on {HOST}:{wanted} (controller :{controller_port})"
    )
    t0 = time.monotonic()
    with open(stdout_log(), "ab") as out:
        out.write(f"\n===== start {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=local_dir(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    pid_file().write_text(f"{proc.pid}\n")

    if not _wait_ready(proc.pid, wanted, timeout):
        exited = proc.poll()
        reason = (
            f"exited with code {exited}"
            if exited is not None
            else f"did not answer within {timeout:.0f} s"
        )
        # Capture the tails first: stopping the broker would bury them under shutdown lines.
        details = (
            f"--- {server_log()} (tail) ---\n{_tail(server_log())}\n"
            f"--- {stdout_log()} (tail) ---\n{_tail(stdout_log(), 20)}"
        )
        if exited is None:
            reason += f"; stopped it ({_terminate(proc.pid, grace=10.0)})"
        pid_file().unlink(missing_ok=True)
        raise KafkaLocalError(f"Kafka broker {reason}.\n{details}")
    elapsed = time.monotonic() - t0
    version = _wait_logged_version(log_offset)
    if version is not None and version != KAFKA_VERSION:
        _say(f"WARNING: broker logged version {version}, expected {KAFKA_VERSION}")
    _say(f"{_describe(proc.pid, wanted, version)}, ready in {elapsed:.1f} s")
    return f"{HOST}:{wanted}"


def _wait_ready(pid: int, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return False
        if _is_ready(port):
            return True
        time.sleep(0.25)
    return False


def _wait_logged_version(offset: int) -> str | None:
    # The version line is logged early in startup, so it is normally already there.
    for _ in range(20):
        version = logged_version(offset) or logged_version(0)
        if version:
            return version
        time.sleep(0.1)
    return None


def _describe(pid: int, port: int, version: str | None = None) -> str:
    version = version or logged_version() or KAFKA_VERSION
    return f"Apache Kafka {version} running on {HOST}:{port} (pid {pid})"


def _terminate(pid: int, grace: float) -> str:
    """SIGTERM, wait `grace` seconds, then SIGKILL. Returns how it ended."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return "clean shutdown"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    return f"killed (no clean shutdown within {grace:.0f} s)"


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker; True if one was running. No-op (False) when it is not running."""
    with _file_lock(local_dir() / ".lock"):
        pid = running_pid()
        if pid is None:
            _say("not running")
            return False
        _say(f"stopping pid {pid} (SIGTERM, up to {timeout:.0f} s)")
        t0 = time.monotonic()
        how = _terminate(pid, timeout)
        if _alive(pid):
            raise KafkaLocalError(f"pid {pid} survived SIGKILL")
        pid_file().unlink(missing_ok=True)
        _say(f"stopped: {how} in {time.monotonic() - t0:.1f} s")
        return True


def status() -> tuple[bool, str]:
    """(healthy, one-line description)."""
    pid = running_pid(cleanup=False)
    if pid is None:
        return False, f"Apache Kafka {KAFKA_VERSION} not running"
    port = _properties_port(server_properties()) or configured_port()
    if _is_ready(port):
        return True, _describe(pid, port)
    return False, f"pid {pid} is alive but does not answer on {HOST}:{port} (starting or hung)"


def reset() -> None:
    """Stop the broker and delete its data (topics, offsets, cluster id); logs are kept."""
    stop()
    shutil.rmtree(data_dir(), ignore_errors=True)
    _say(f"deleted {data_dir()}")


def logs(lines: int = 50, follow: bool = False) -> None:
    path = server_log()
    print(_tail(path, lines), flush=True)
    if not follow:
        return
    with contextlib.suppress(KeyboardInterrupt):
        pos = path.stat().st_size if path.exists() else 0
        while True:
            time.sleep(0.5)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size < pos:  # rolled over
                pos = 0
            if size > pos:
                with open(path, "rb") as fh:
                    fh.seek(pos)
                    sys.stdout.write(fh.read(size - pos).decode("utf-8", "replace"))
                    sys.stdout.flush()
                pos = size


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kafka.py", description=f"Local Apache Kafka {KAFKA_VERSION} broker (KRaft, no Docker)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download the broker jars into the cache (once)")
    p_fetch.add_argument("--force", action="store_true", help="download again")
    p_start = sub.add_parser("start", help="start in the background and wait until it answers")
    p_start.add_argument("--port", type=int, default=None, help="default $GRAYLANE_KAFKA_PORT/9092")
    p_start.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    p_stop = sub.add_parser("stop", help="SIGTERM, wait for a clean shutdown, then SIGKILL")
    p_stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S)
    sub.add_parser("status", help="exit 0 when running and answering, else 1")
    sub.add_parser("bootstrap", help="print bootstrap.servers")
    p_logs = sub.add_parser("logs", help="tail the broker log")
    p_logs.add_argument("-n", "--lines", type=int, default=50)
    p_logs.add_argument("-f", "--follow", action="store_true")
    sub.add_parser("reset", help="stop and delete the broker data")
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            if not args.force and is_fetched():
                _say(f"fetch: already complete in {libs_dir()}")
            else:
                fetch(force=args.force)
        elif args.command == "start":
            start(port=args.port, timeout=args.timeout)
        elif args.command == "stop":
            stop(timeout=args.timeout)
        elif args.command == "status":
            ok, line = status()
            print(line)
            return 0 if ok else 1
        elif args.command == "bootstrap":
            print(bootstrap())
        elif args.command == "logs":
            logs(args.lines, args.follow)
        elif args.command == "reset":
            reset()
    except KafkaLocalError as exc:
        print(f"[kafka] ERROR: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
