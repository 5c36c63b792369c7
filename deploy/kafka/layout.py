"""Pinned versions, on-disk layout and configured ports of the local Kafka broker.

Paths are computed on every call so tests can change the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from graylane.errors import GraylaneError

__all__ = [
    "CONTROLLER_PORT_OFFSET",
    "DEFAULT_PORT",
    "DOWNLOADED_RE",
    "HEAP_OPTS",
    "HERE",
    "HOST",
    "JVM_OPTS",
    "KAFKA_ARTIFACT",
    "KAFKA_VERSION",
    "LOG4J_FILE",
    "LOG4J_VERSION",
    "MAIN_CLASS",
    "MARKER_NAME",
    "NODE_ID",
    "POM_FILE",
    "REPO_ROOT",
    "SCALA_VERSION",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "STORAGE_TOOL_CLASS",
    "TEMPLATE_FILE",
    "VERSION_RE",
    "KafkaLocalError",
    "cache_dir",
    "config_dir",
    "configured_controller_port",
    "configured_port",
    "data_dir",
    "file_lock",
    "libs_dir",
    "local_dir",
    "logs_dir",
    "pid_file",
    "say",
    "server_log",
    "server_properties",
    "stdout_log",
]

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


class KafkaLocalError(GraylaneError):
    """Any failure of the local broker tooling, with a message meant for humans."""


def say(msg: str) -> None:
    """Print a progress line prefixed with [kafka]."""
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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created when missing) for the with-block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
