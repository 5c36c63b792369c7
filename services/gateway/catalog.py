"""What the gateway can say about models: which are served, and their tensors.

A model is served when its ingress topic exists (``<p>.requests.<model>``); its
versions are the version topics that exist (``<p>.requests.<model>.<version>``).
:func:`served_models` reads that from topic names (pure); :class:`ModelDirectory`
asks the cluster now and then (see there).

Input and output signatures (for the Open Inference Protocol's model metadata) come
from ONNX files named at start-up (``--signature MODEL[@VERSION]=PATH``), else from
the registry: the manifest of the version's servable ONNX artifact (the stable
version when none is named). :class:`SignatureBook` caches what it read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from graylane.artifacts.manifest import read_manifest
from graylane.artifacts.model_info import io_signature, load_header
from graylane.artifacts.naming import Backend
from graylane.engine.signature import IOSignature
from graylane.topics import TopicLayout

__all__ = ["ModelDirectory", "SignatureBook", "served_models"]

log = logging.getLogger(__name__)


def served_models(topics: Iterable[str], layout: TopicLayout) -> dict[str, tuple[str, ...]]:
    """Model -> its versions (sorted), for every ingress topic among ``topics``."""
    head = f"{layout.prefix}.requests."
    models: dict[str, set[str]] = {}
    versions: dict[str, set[str]] = {}
    for topic in topics:
        if not topic.startswith(head):
            continue
        model, dot, version = topic[len(head) :].partition(".")
        if not model:
            continue
        if dot:
            versions.setdefault(model, set()).add(version)
        else:
            models.setdefault(model, set())
    return {m: tuple(sorted(versions.get(m, ()))) for m in sorted(models)}


class ModelDirectory:
    """Served models, from the cluster's topic list.

    The list is kept ``ttl_s`` seconds; an older one is still answered while one refresh
    runs in the background, and concurrent callers share one refresh (a cluster's full
    metadata can take tens of milliseconds to decode: never once per call). A model
    missing from the list is looked up again (it may be new), at most once per
    ``miss_refresh_s``: calls naming models that do not exist cost a dictionary lookup.
    """

    def __init__(
        self,
        layout: TopicLayout,
        topics: Callable[[], Awaitable[set[str]]],
        *,
        ttl_s: float = 30.0,
        miss_refresh_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self._topics = topics
        self.ttl_s = ttl_s
        self.miss_refresh_s = miss_refresh_s
        self._clock = clock
        self._cached: dict[str, tuple[str, ...]] | None = None
        self._at = 0.0
        self._pending: asyncio.Future[dict[str, tuple[str, ...]]] | None = None

    async def _fetch(self) -> dict[str, tuple[str, ...]]:
        try:
            found = served_models(await self._topics(), self.layout)
            self._cached, self._at = found, self._clock()
            return found
        finally:
            self._pending = None

    def _refreshing(self) -> asyncio.Future[dict[str, tuple[str, ...]]]:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fetch())
            self._pending.add_done_callback(_log_failure)
        return self._pending

    async def models(self) -> dict[str, tuple[str, ...]]:
        if self._cached is None:
            return await asyncio.shield(self._refreshing())
        if self._clock() - self._at >= self.ttl_s:
            self._refreshing()  # answered from the older list meanwhile
        return self._cached

    async def versions(self, model: str) -> tuple[str, ...] | None:
        """The model's versions; None when the model is not served."""
        found = (await self.models()).get(model)
        if found is None and self._clock() - self._at >= self.miss_refresh_s:
            found = (await asyncio.shield(self._refreshing())).get(model)
        return found


def _log_failure(done: asyncio.Future[dict[str, tuple[str, ...]]]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("could not list the served models: %s", done.exception())


class SignatureBook:
    """Tensor signatures per (model, version), from ONNX files or the registry."""

    def __init__(self, files: Mapping[tuple[str, str], Path], db_url: str | None = None) -> None:
        self._files = dict(files)
        self._db_url = db_url
        self._cache: dict[tuple[str, str], IOSignature | None] = {}

    def signature(self, model: str, version: str = "") -> IOSignature | None:
        """The signature of ``model`` at ``version`` ("" = any / stable); None if unknown."""
        key = (model, version)
        if key not in self._cache:
            self._cache[key] = self._read(model, version)
        return self._cache[key]

    def _read(self, model: str, version: str) -> IOSignature | None:
        path = self._files.get((model, version)) or self._files.get((model, ""))
        if path is not None:
            return io_signature(load_header(path))
        if self._db_url is None:
            return None
        try:
            return _registry_signature(self._db_url, model, version)
        except Exception as exc:  # an absent or older registry: no metadata, not a failure
            log.warning("no signature of %s %s from the registry: %s", model, version or "", exc)
            return None


def _registry_signature(db_url: str, model: str, version: str) -> IOSignature | None:
    from graylane.registry.repository import open_registry

    registry = open_registry(db_url, read_only=True)
    try:
        if not version:
            stable = registry.get_stable(model)
            if stable is None:
                return None
            version = str(stable.version)
        for art in registry.list_artifacts(model, version):
            if art.servable and art.backend is Backend.ONNXRUNTIME:
                return read_manifest(Path(art.path)).io
        return None
    finally:
        registry.engine.dispose()
