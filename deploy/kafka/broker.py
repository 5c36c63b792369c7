"""Start, stop, status and reset of the local single-node KRaft broker (a JVM child process)."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import string
import subprocess
import sys
import time
import uuid
from pathlib import Path

from graylane.deploy.kafka.layout import (
    HEAP_OPTS,
    HOST,
    JVM_OPTS,
    KAFKA_VERSION,
    LOG4J_FILE,
    MAIN_CLASS,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    STORAGE_TOOL_CLASS,
    TEMPLATE_FILE,
    KafkaLocalError,
    config_dir,
    configured_controller_port,
    configured_port,
    data_dir,
    file_lock,
    local_dir,
    logs_dir,
    pid_file,
    say,
    server_log,
    server_properties,
    stdout_log,
)
from graylane.deploy.kafka.maven import fetch
from graylane.deploy.kafka.probe import is_ready
from graylane.deploy.kafka.process import (
    alive,
    logged_version,
    properties_port,
    running_pid,
    tail,
    terminate,
    track_child,
)
from graylane.deploy.kafka.secure import (
    ADMIN,
    configured_secure,
    load_users,
    secure_properties,
    strip_replaced,
)

__all__ = ["logs", "new_cluster_id", "reset", "start", "status", "stop", "write_config"]


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


def write_config(port: int, controller_port: int) -> None:
    """Render server.properties from the template (atomically replaced).

    In secured mode (``GRAYLANE_KAFKA_SECURE=1``) the listeners become SASL_PLAINTEXT and the
    StandardAuthorizer is on; see :mod:`graylane.deploy.kafka.secure`.
    """
    config_dir().mkdir(parents=True, exist_ok=True)
    text = string.Template(TEMPLATE_FILE.read_text()).substitute(
        port=port, controller_port=controller_port, data_dir=str(data_dir())
    )
    if configured_secure():
        text = strip_replaced(text) + secure_properties(port, controller_port, load_users())
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
    say(f"formatting KRaft storage in {data_dir()} (cluster id {cluster_id})")
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
            say(f"  {line.strip()}")


def start(port: int | None = None, timeout: float = START_TIMEOUT_S) -> str:
    """Start the broker in the background (no-op when already running); returns bootstrap."""
    with file_lock(local_dir() / ".lock"):
        return _start_locked(port, timeout)


def _start_locked(port: int | None, timeout: float) -> str:
    wanted = port if port is not None else configured_port()
    pid = running_pid()
    if pid is not None:
        running_port = properties_port(server_properties())
        if running_port != wanted:
            raise KafkaLocalError(
                f"the broker is already running on port {running_port} (pid {pid}); "
                f"stop it first to use port {wanted}"
            )
        if not _wait_ready(pid, wanted, timeout):
            raise KafkaLocalError(
                f"the broker process {pid} is alive but does not answer on {HOST}:{wanted}\n"
                + tail(server_log())
            )
        say(f"already running: {_describe(pid, wanted)}")
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
    write_config(wanted, controller_port)
    _format_storage(java, libs)

    log_offset = server_log().stat().st_size if server_log().exists() else 0
    cmd = [
        *_jvm_base(java, libs),
        *HEAP_OPTS,
        *JVM_OPTS,
        MAIN_CLASS,
        str(server_properties()),
    ]
    mode = " secured (SASL/PLAIN + ACLs)" if configured_secure() else ""
    say(
        f"starting Apache Kafka {KAFKA_VERSION}{mode} on {HOST}:{wanted} "
        f"(controller :{controller_port})"
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
    track_child(proc)
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
            f"--- {server_log()} (tail) ---\n{tail(server_log())}\n"
            f"--- {stdout_log()} (tail) ---\n{tail(stdout_log(), 20)}"
        )
        if exited is None:
            reason += f"; stopped it ({terminate(proc.pid, grace=10.0)})"
        pid_file().unlink(missing_ok=True)
        raise KafkaLocalError(f"Kafka broker {reason}.\n{details}")
    elapsed = time.monotonic() - t0
    version = _wait_logged_version(log_offset)
    if version is not None and version != KAFKA_VERSION:
        say(f"WARNING: broker logged version {version}, expected {KAFKA_VERSION}")
    say(f"{_describe(proc.pid, wanted, version)}, ready in {elapsed:.1f} s")
    return f"{HOST}:{wanted}"


def _probe_login() -> tuple[str, str] | None:
    """The admin login for the readiness probe when the broker runs secured."""
    if not configured_secure():
        return None
    admin = load_users()[ADMIN]
    return admin.username, admin.password


def _wait_ready(pid: int, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return False
        if is_ready(port, _probe_login()):
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


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker; True if one was running. No-op (False) when it is not running."""
    with file_lock(local_dir() / ".lock"):
        pid = running_pid()
        if pid is None:
            say("not running")
            return False
        say(f"stopping pid {pid} (SIGTERM, up to {timeout:.0f} s)")
        t0 = time.monotonic()
        how = terminate(pid, timeout)
        if alive(pid):
            raise KafkaLocalError(f"pid {pid} survived SIGKILL")
        pid_file().unlink(missing_ok=True)
        say(f"stopped: {how} in {time.monotonic() - t0:.1f} s")
        return True


def status() -> tuple[bool, str]:
    """(healthy, one-line description)."""
    pid = running_pid(cleanup=False)
    if pid is None:
        return False, f"Apache Kafka {KAFKA_VERSION} not running"
    port = properties_port(server_properties()) or configured_port()
    if is_ready(port, _probe_login()):
        return True, _describe(pid, port)
    return False, f"pid {pid} is alive but does not answer on {HOST}:{port} (starting or hung)"


def reset() -> None:
    """Stop the broker and delete its data (topics, offsets, cluster id); logs are kept."""
    stop()
    shutil.rmtree(data_dir(), ignore_errors=True)
    say(f"deleted {data_dir()}")


def logs(lines: int = 50, follow: bool = False) -> None:
    """Print the tail of the broker log; with `follow`, keep printing until Ctrl-C."""
    path = server_log()
    print(tail(path, lines), flush=True)
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
