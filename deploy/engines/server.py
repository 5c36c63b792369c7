"""One ``llama-server`` process, for tests, the demo and benchmarks.

:class:`LlamaServer` starts the cached binary on a GGUF, waits until ``GET /health`` answers
200, and stops, kills or restarts it on the same port. Always on: Prometheus ``/metrics``,
``/slots``, continuous batching, ``-np`` slots sharing ``-c`` tokens of context (each slot
gets ``ctx / slots``). It binds to loopback only and writes its output to a log file.

A server never outlives the process that started it: it is SIGKILLed when its
:class:`LlamaServer` is garbage-collected or the interpreter exits, and on Linux the kernel
SIGKILLs it when the starting process dies (``PR_SET_PDEATHSIG``; set only when started from
the main thread, because the signal follows the *thread* that forked the child).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from graylane.artifacts.naming import Backend
from graylane.deploy.engines.layout import binary_path, engine_version
from graylane.engine.server import DEFAULT_SLOTS, EngineEndpoint
from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_CTX",
    "HOST",
    "LlamaServer",
    "LlamaServerError",
    "server_command",
    "server_env",
]

HOST = "127.0.0.1"
DEFAULT_CTX = 4096
"""Context tokens across all slots (``-c``): 1024 per slot with the default 4 slots."""
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0

_LISTENING_RE = re.compile(rb"listening on https?://\S+:(\d+)")
# Environment the server reads as settings: dropped, so only the command line decides.
_SETTING_ENV_PREFIXES = ("LLAMA_ARG_", "AIP_")
_PR_SET_PDEATHSIG = 1
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


class LlamaServerError(GraylaneError):
    """``llama-server`` did not start, did not become healthy, or is not running."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_command(
    model: Path,
    *,
    binary: Path,
    port: int,
    threads: int,
    slots: int,
    ctx: int,
    alias: str,
    host: str = HOST,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``llama-server`` command line (``port`` 0: the server picks a free port)."""
    if not _is_loopback(host):
        raise LlamaServerError(f"llama-server binds to loopback only, not {host!r}")
    if threads < 1 or slots < 1:
        raise LlamaServerError(f"threads and slots must be at least 1 ({threads}, {slots})")
    if ctx < slots:
        raise LlamaServerError(f"ctx {ctx} is less than one token per slot ({slots} slots)")
    if not 0 <= port < 65536:
        raise LlamaServerError(f"port {port} is out of range")
    return [
        str(binary),
        "--model",
        str(model),
        "--alias",
        alias,
        "--host",
        host,
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(ctx),
        "--cont-batching",
        "--metrics",
        "--slots",
        "--no-webui",
        # Browsers may call it from localhost pages only (the default is any origin).
        "--cors-origins",
        "localhost",
        *extra_args,
    ]


def server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ours without ``LLAMA_ARG_*`` / ``AIP_*`` settings."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if not k.startswith(_SETTING_ENV_PREFIXES)}


_prctl: Callable[..., int] | None = None


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGKILL the child when we die (Linux, main
    thread only); None elsewhere."""
    global _prctl
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    if _prctl is None:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork, not in the child
    prctl, parent = _prctl, os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # we died before the prctl: nobody will send it
            os._exit(1)

    return preexec


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill the server if it still runs (the finalizer: garbage collection or exit)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


class LlamaServer:
    """One ``llama-server`` process on one GGUF model.

    ``port=0`` lets the server pick a free port on the first start (read from its log);
    :meth:`restart` keeps the port. ``log_path`` defaults to a new temporary file, kept
    after the server stops so a failure can be read.
    """

    def __init__(
        self,
        model: Path,
        *,
        port: int = 0,
        threads: int = 1,
        slots: int = DEFAULT_SLOTS,
        ctx: int = DEFAULT_CTX,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        host: str = HOST,
        alias: str | None = None,
        binary: Path | None = None,
    ) -> None:
        self.model = Path(model)
        self.threads = threads
        self.slots = slots
        self.ctx = ctx
        self.extra_args = tuple(extra_args)
        self.host = host
        self.alias = alias or self.model.name.removesuffix(".gguf")
        self.binary = binary or binary_path("llama-server")
        self._port = port
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], LlamaServer] | None = None
        self.command  # noqa: B018 - validates the settings now, not at start

    # -- what it is ------------------------------------------------------------------------
    @property
    def command(self) -> list[str]:
        """The command line of the next start."""
        return server_command(
            self.model,
            binary=self.binary,
            port=self._port,
            threads=self.threads,
            slots=self.slots,
            ctx=self.ctx,
            alias=self.alias,
            host=self.host,
            extra_args=self.extra_args,
        )

    @property
    def port(self) -> int:
        """The port (0 until a server started with ``port=0`` has said which it took)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL, ``http://127.0.0.1:PORT`` (the OpenAI routes are under ``/v1``)."""
        if not self._port:
            raise LlamaServerError("the server has no port yet: start it first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"llama-server-{self.alias}-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        return self._log_path

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def endpoint(self, variant: str) -> EngineEndpoint:
        """This server as a version's variant (``q4_1``, ``q2_k``, ...) for a worker."""
        return EngineEndpoint(
            variant=variant,
            url=self.url,
            backend=Backend.LLAMACPP,
            engine_version=engine_version(),
            served_model=self.alias,
            slots=self.slots,
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return f"({self.log_path} cannot be read)"
        return "\n".join(text.splitlines()[-lines:])

    # -- life cycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server and wait until ``GET /health`` answers 200; the base URL.

        A running server is left as it is.
        """
        if self.is_running():
            return self.url
        if not os.access(self.binary, os.X_OK):
            raise LlamaServerError(
                f"{self.binary} is not built: run `make engines` "
                "(python deploy/engines/llamacpp.py setup)"
            )
        if not self.model.is_file():
            raise LlamaServerError(f"model {self.model} does not exist")
        cmd = self.command
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} $ {' '.join(cmd)}\n".encode())
            log.flush()
            offset = log.tell()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(),
                preexec_fn=_die_with_parent(),  # only a prctl, see the function
            )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _reap, proc)
        try:
            self._wait_healthy(proc, offset, timeout_s)
        except BaseException:
            self._finish(proc, signal.SIGKILL, 5.0)
            raise
        return self.url

    def _wait_healthy(self, proc: subprocess.Popen[bytes], offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise LlamaServerError(
                    f"llama-server exited with {proc.returncode} while starting "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            # Its own "listening on" line first: a fixed port may answer for another server.
            listening = self._logged_port(offset)
            if listening:
                self._port = listening
                if self._health() == 200:
                    return
            if time.monotonic() > deadline:
                raise LlamaServerError(
                    f"llama-server was not healthy within {timeout_s:.0f} s "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _logged_port(self, offset: int) -> int:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                m = _LISTENING_RE.search(fh.read())
        except OSError:
            return 0
        return int(m.group(1)) if m else 0

    def _health(self) -> int:
        try:
            with _LOCAL.open(f"{self.url}/health", timeout=2.0) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)  # 503 while the model loads
        except (OSError, ValueError):
            return 0

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, up to ``timeout_s`` for a clean exit, then SIGKILL; the exit status."""
        if self._proc is None:
            return None
        return self._finish(self._proc, signal.SIGTERM, timeout_s)

    def kill(self) -> int | None:
        """SIGKILL at once (a crash, for tests that break the engine under load)."""
        if self._proc is None:
            return None
        return self._finish(self._proc, signal.SIGKILL, 5.0)

    def _finish(self, proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> int | None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        return proc.returncode

    def restart(
        self, timeout_s: float = START_TIMEOUT_S, stop_timeout_s: float = STOP_TIMEOUT_S
    ) -> str:
        """Stop the server if it runs, then start it again on the same port."""
        self.stop(stop_timeout_s)
        return self.start(timeout_s)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid} on port {self._port}" if self.is_running() else "stopped"
        return f"LlamaServer({self.model.name}, {state})"
