"""Engine servers: the OpenAI-compatible servers a version may be served by.

LLM teams serve models with engines built for it (TensorRT-LLM's ``trtllm-serve``,
vLLM, SGLang, llama.cpp's ``llama-server``). Each speaks the OpenAI HTTP API with
streaming and batches continuously on its own. A Graylane worker can serve its version
through such a server instead of a local engine: it still consumes the version topic,
and each ``GENERATE`` becomes a streamed call to the server (see
:mod:`graylane.engine_worker.engine_server`).

An :class:`EngineEndpoint` is one precision variant of a version served that way: where
the server listens, which engine it is, which model file it loaded and how many calls
it serves at once. A version's variants may each be an endpoint (an FP16 and an FP8
engine; a Q4 and a Q2 GGUF), so the QoS ladder steps between them as between ONNX
variants. The registry records them (an artifact per endpoint); the worker takes them
from the registry or its command line.

Pure module: data only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from graylane.artifacts.naming import Backend
from graylane.errors import GraylaneError

__all__ = ["DEFAULT_SLOTS", "EndpointError", "EngineEndpoint", "parse_endpoint_url"]

DEFAULT_SLOTS = 4
"""Calls in flight to one endpoint when none is stated (``llama-server -np 4``)."""


class EndpointError(GraylaneError, ValueError):
    """An engine endpoint is described wrongly."""


def parse_endpoint_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an ``http(s)://host[:port][/path]``
    base URL (the OpenAI routes are under ``<url>/v1``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(
            f"engine endpoint {url!r} is not an http(s) base URL such as http://127.0.0.1:8000"
        )
    if parts.query or parts.fragment:
        raise EndpointError(f"engine endpoint {url!r} must not carry a query or fragment")
    try:
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise EndpointError(f"engine endpoint {url!r}: {exc}") from None
    return url.rstrip("/")


@dataclass(frozen=True, kw_only=True)
class EngineEndpoint:
    """One precision variant of a version, served by an engine server."""

    variant: str
    """The variant's name on the QoS ladder (its precision: ``fp16``, ``q4_1``, ...)."""
    url: str
    """Base URL of the server (``http://127.0.0.1:8000``; the API is under ``/v1``)."""
    backend: Backend
    """Which engine it is: decides where its load signals are read
    (:mod:`graylane.engine_worker.engine_load`)."""
    engine_version: str = ""
    served_model: str = ""
    """The ``model`` of each call: the engine's served model name, or a LoRA adapter's
    id (an adapter canary shares the engine pool). Empty: the first model the server
    lists at ``/v1/models``."""
    model_sha256: str = ""
    """Digest of the model file the engine loaded (recorded by the builder)."""
    slots: int = DEFAULT_SLOTS
    """Calls in flight at once: the engine's parallel sequences (``-np``, ``max_num_seqs``)."""

    def __post_init__(self) -> None:
        if not self.backend.is_engine_server:
            raise EndpointError(
                f"{self.backend.value} is not an engine server "
                f"(one of {[b.value for b in Backend if b.is_engine_server]})"
            )
        if not self.variant:
            raise EndpointError("an engine endpoint needs its variant's name")
        if self.slots < 1:
            raise EndpointError(f"slots must be at least 1, got {self.slots}")
        object.__setattr__(self, "url", parse_endpoint_url(self.url))
