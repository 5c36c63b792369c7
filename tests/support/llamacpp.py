"""Fixtures for tests that need a real engine server: llama.cpp's ``llama-server`` on
SmolLM2-135M-Instruct (registered for every test by ``tests/conftest.py``).

* ``smollm2_gguf``: the verified Q4_1 GGUF the model ships as (session);
* ``smollm2_q4_0_gguf``: the QoS ladder's lower rung, Q4_0: the fastest here (session);
* ``smollm2_q2k_gguf``: Q2_K, the smallest file (for this model Q4_0 with a q3_K
  ``ffn_down``: faster than Q4_1, a little slower than Q4_0; session);
* ``start_llama_server``: starts a :class:`LlamaServer` and waits until it is healthy;
  every server it started is stopped when the test ends.

The binaries must have been built (``make engines``; ``make test`` does it first): a
build takes minutes, longer than a test may, so a missing build fails the test with that
advice instead of starting one. The model and its rungs are fetched and made on demand.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from graylane.artifacts.naming import Precision
from graylane.deploy.engines import build as engines_build
from graylane.deploy.engines import layout as engines_layout
from graylane.deploy.engines import llamacpp
from graylane.deploy.engines.server import LlamaServer

__all__ = [
    "StartLlamaServer",
    "smollm2_gguf",
    "smollm2_q2k_gguf",
    "smollm2_q4_0_gguf",
    "start_llama_server",
]


class StartLlamaServer(Protocol):
    def __call__(
        self,
        model: Path,
        *,
        port: int = 0,
        threads: int = 1,
        slots: int = 4,
        ctx: int = 4096,
        extra_args: Sequence[str] = (),
    ) -> LlamaServer: ...


def _rung(precision: Precision) -> Path:
    if not engines_build.is_built():
        pytest.fail(
            f"llama.cpp {engines_layout.LLAMA_CPP_VERSION} is not built in "
            f"{engines_layout.engine_dir()}: "
            "run `make engines` once (python deploy/engines/llamacpp.py setup)"
        )
    return llamacpp.model(precision)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct as shipped: Q4_1, 98 MB, sha256-verified."""
    return _rung(Precision.Q4_1)


@pytest.fixture(scope="session")
def smollm2_q4_0_gguf() -> Path:
    """The QoS ladder's lower rung: Q4_0 (requantized from Q4_1), 1.4-1.8x Q4_1's decode
    speed here (see ``llamacpp.LOWER_RUNG``)."""
    return _rung(llamacpp.LOWER_RUNG)


@pytest.fixture(scope="session")
def smollm2_q2k_gguf() -> Path:
    """Q2_K (requantized from Q4_1): 88 MB, faster than Q4_1 but a little slower than Q4_0;
    its greedy answers drift further (it repeats itself sooner)."""
    return _rung(Precision.Q2_K)


@pytest.fixture
def start_llama_server(tmp_path: Path) -> Iterator[StartLlamaServer]:
    """``start_llama_server(model, threads=1, slots=4, ...)`` -> a healthy server; its log in
    the test's ``tmp_path``. All of them are stopped when the test ends."""
    servers: list[LlamaServer] = []

    def start(
        model: Path,
        *,
        port: int = 0,
        threads: int = 1,
        slots: int = 4,
        ctx: int = 4096,
        extra_args: Sequence[str] = (),
    ) -> LlamaServer:
        server = LlamaServer(
            model,
            port=port,
            threads=threads,
            slots=slots,
            ctx=ctx,
            extra_args=extra_args,
            log_path=tmp_path / f"llama-server-{len(servers)}.log",
        )
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()
