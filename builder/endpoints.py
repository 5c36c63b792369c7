"""A version engine servers serve: endpoints → model digests → probes → manifests → registry.

An :class:`~graylane.builder.spec.EngineSpec` names no ONNX file: each precision variant
of the version is an endpoint of an OpenAI-compatible engine server (llama.cpp's
``llama-server``, vLLM, TensorRT-LLM's ``trtllm-serve``, SGLang), best first. Nothing is
produced or validated against a reference; :func:`register_endpoints` records what
serves each variant. Each endpoint becomes an artifact whose manifest is all of it (the
URL, the served model, the slots, the digest of the model file the engine loaded, the
variant's place on the ladder), signed like any artifact and registered under the
version. Model files are hashed where they lie and never copied into the store.

The version's source digest is the first variant's model digest, or, when the spec
gives none for it, a digest of the variants as the spec states them.

With ``probe`` each endpoint must answer ``GET <url>/health`` and ``GET
<url>/v1/models`` (listing the variant's ``served_model`` when it names one). One that
does not is reported failed and not published; the others are published and
registered, and the report is not ok (``graylane build`` exits 2).

With ``engine.evaluation`` the endpoints that answered are scored on an evaluation set,
the first rung the reference (:mod:`~graylane.builder.rung_quality`): a rung that costs
more than ``max_drop`` is refused like a failed probe, and the registered rungs' scores
are recorded as their measured quality.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from graylane.artifacts.manifest import (
    EndpointInfo,
    Manifest,
    ProbeInfo,
    read_manifest,
    with_files,
)
from graylane.artifacts.model_info import ModelInfo, ModelTask
from graylane.artifacts.naming import ArtifactName, Precision
from graylane.artifacts.verify import sha256_file
from graylane.builder.build import BuildError, BuildReport, VariantReport, register_build
from graylane.builder.host import build_host, git_commit
from graylane.builder.progress import ProgressSink
from graylane.builder.rung_quality import ScoredRungs, rung_refusal, score_rungs
from graylane.builder.spec import EndpointVariantSpec, EngineSpec
from graylane.builder.store import ArtifactExistsError, ArtifactStore
from graylane.builder.variants import VariantStatus
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError
from graylane.evaluation.sets import EvalSetError
from graylane.registry.repository import Registry

__all__ = [
    "PROBE_TIMEOUT_S",
    "EndpointProbeError",
    "HttpGet",
    "http_get",
    "model_digests",
    "probe_endpoint",
    "register_endpoints",
    "version_digest",
]

PROBE_TIMEOUT_S = 5.0
"""Seconds each probe request may take."""

_MAX_BODY = 1 << 20

HttpGet = Callable[[str, float], tuple[int, bytes]]
"""``(url, timeout_s) -> (status, body)``; raises :class:`OSError` when nothing answers."""

_REPO_ROOT = Path(__file__).resolve().parent.parent

_MODEL_INFO = ModelInfo(task=ModelTask.CAUSAL_LM)
"""What an engine server serves: generations (it tokenizes itself)."""


class EndpointProbeError(GraylaneError):
    """An engine endpoint did not answer its probe as a serving engine does."""


def register_endpoints(
    spec: EngineSpec,
    progress: ProgressSink,
    artifacts: ArtifactStore,
    registry: Registry | None,
    *,
    get: HttpGet | None = None,
) -> BuildReport:
    """Publish one manifest-only artifact per endpoint of ``spec`` and register them.

    ``spec.force`` replaces artifacts already published or registered under the same
    names; ``get`` is the probe's HTTP seam (default: :func:`http_get`).
    """
    started = time.perf_counter()
    engine = spec.engine
    names = {
        v.precision: ArtifactName(
            spec.model, engine.backend, engine.version, v.precision, engine.strategy, spec.version
        )
        for v in engine.variants
    }
    existing = [str(n) for n in names.values() if artifacts.exists(n)]
    if existing and not spec.force:
        raise ArtifactExistsError(
            f"already registered: {', '.join(existing)}; bump the version or pass --force"
        )
    evaluated = engine.evaluation is not None
    progress.begin(1 + (len(engine.variants) if engine.probe else 0) + int(evaluated) + 2)
    try:
        progress.step("model files")
        digests = model_digests(spec)
        source_sha256 = version_digest(spec, digests)
        known = sum(bool(d) for d in digests.values())
        progress.done(f"model digests: {known} of {len(digests)} variant(s) known")
        probes: dict[Precision, ProbeInfo | None] = {}
        failures: dict[Precision, str] = {}
        for variant in engine.variants:
            if not engine.probe:
                probes[variant.precision] = None
                continue
            progress.step(f"probing {variant.precision.value} at {variant.url}")
            try:
                probes[variant.precision] = probe_endpoint(
                    variant.url, variant.served_model, get=get or http_get
                )
            except EndpointProbeError as exc:
                failures[variant.precision] = str(exc)
                progress.done(f"{variant.precision.value}: {exc}", ok=False)
            else:
                progress.done(f"{variant.precision.value}: answers at {variant.url}")
        scored = _score(spec, failures, progress) if evaluated else None
        reports, published = _publish(
            spec, names, digests, source_sha256, probes, failures, artifacts, progress, scored
        )
        registered = _register(spec, registry, source_sha256, published, artifacts, progress)
        if registered and registry is not None and scored is not None:
            records = [r.quality for r in reports if r.quality is not None and r.servable]
            if records:
                registry.record_rung_quality(spec.model, spec.version, records)
    finally:
        progress.end()
    notes = [] if engine.probe else ["endpoints not probed (engine.probe or --probe checks them)"]
    if scored is not None:
        notes.append(_scored_note(scored))
    if failures:
        passed = len(engine.variants) - len(failures)
        notes.append(
            f"not published: {', '.join(p.value for p in failures)} (the probe or the "
            "evaluation failed)"
            + ("" if not passed else "; the others are registered" if registered else "")
        )
    return BuildReport(
        model=spec.model,
        version=str(spec.version),
        source=None,
        source_sha256=source_sha256,
        store=artifacts.root,
        variants=tuple(reports),
        tensorrt_note=None,
        registered=registered,
        duration_s=time.perf_counter() - started,
        model_info=_MODEL_INFO,
        notes=tuple(notes),
    )


def _score(spec: EngineSpec, failures: dict[Precision, str], progress: ProgressSink) -> ScoredRungs:
    """Score the rungs that answered their probe; refuse (in ``failures``) those that cost
    more than the spec allows. A set that cannot be read fails the build."""
    evaluation = spec.engine.evaluation
    assert evaluation is not None
    progress.step(f"scoring the rungs on {evaluation.set_path.name}")
    try:
        scored = score_rungs(spec, failures)
    except EvalSetError as exc:
        raise BuildError(f"engine.evaluation.set: {exc}") from None
    reference = scored.summaries.get(scored.reference)
    for precision, summary in scored.summaries.items():
        refusal = rung_refusal(reference, summary, evaluation.max_drop, scored.set_name)
        if refusal is not None:
            failures[precision] = refusal
    figures = ", ".join(f"{p.value} {s.mean:.3f}" for p, s in scored.summaries.items())
    refused = [p.value for p in scored.summaries if p in failures]
    progress.done(
        f"{scored.items} items: {figures}"
        + (f"; refused: {', '.join(refused)}" if refused else ""),
        ok=not refused,
    )
    return scored


def _scored_note(scored: ScoredRungs) -> str:
    reference = scored.summaries.get(scored.reference)
    parts = []
    for precision, s in scored.summaries.items():
        cost = (
            "reference"
            if precision is scored.reference
            else f"cost {reference.mean - s.mean:+.3f}"
            if reference is not None
            else "no reference"
        )
        parts.append(f"{precision.value} {s.mean:.3f} ({s.ci_low:.3f}..{s.ci_high:.3f}, {cost})")
    return f"evaluated on {scored.set_name} ({scored.items} items): " + "; ".join(parts)


def _publish(
    spec: EngineSpec,
    names: dict[Precision, ArtifactName],
    digests: dict[Precision, str],
    source_sha256: str,
    probes: dict[Precision, ProbeInfo | None],
    failures: dict[Precision, str],
    artifacts: ArtifactStore,
    progress: ProgressSink,
    scored: ScoredRungs | None = None,
) -> tuple[list[VariantReport], list[Path]]:
    """Publish each endpoint that did not fail its probe; (reports, published folders)."""
    progress.step("publishing endpoint manifests")
    engine = spec.engine
    host = build_host(probe_gpu=False)
    commit = git_commit(_REPO_ROOT)
    reports: list[VariantReport] = []
    published: list[Path] = []
    for rung, variant in enumerate(engine.variants):
        precision = variant.precision
        if precision in failures:
            reports.append(
                VariantReport(precision, engine.backend, VariantStatus.FAILED, failures[precision])
            )
            continue
        endpoint = _endpoint_info(variant, rung, engine.ladder, digests[precision], probes)
        manifest = Manifest(
            name=names[precision],
            files=(),
            io=IOSignature(inputs=(), outputs=()),
            profiles=(),
            build_host=host,
            build_duration_s=0.0,
            source_onnx_sha256=source_sha256,
            source_git_commit=commit,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            servable=True,
            notes=(
                f"served by {engine.backend.value} {engine.version} at {variant.url}; "
                "not validated against a reference (the engine server's own variant)",
            ),
            model_info=_MODEL_INFO,
            endpoint=endpoint,
        )
        folder = artifacts.publish(
            names[precision], [], partial(with_files, manifest), replace=spec.force
        )
        published.append(folder)
        reports.append(
            VariantReport(
                precision=precision,
                backend=engine.backend,
                status=VariantStatus.PRODUCED,
                artifact=names[precision],
                folder=folder,
                servable=True,
                endpoint=endpoint,
                quality=None if scored is None else scored.record(precision),
            )
        )
    progress.done(
        f"published {len(published)} endpoint manifest(s) to {artifacts.root}", ok=not failures
    )
    return reports, published


def _endpoint_info(
    variant: EndpointVariantSpec,
    rung: int,
    ladder: tuple[str, ...],
    digest: str,
    probes: dict[Precision, ProbeInfo | None],
) -> EndpointInfo:
    return EndpointInfo(
        url=variant.url,
        served_model=variant.served_model,
        model_file=variant.model_file.name if variant.model_file is not None else "",
        model_sha256=digest,
        slots=variant.slots,
        rung=rung,
        ladder=ladder,
        probe=probes.get(variant.precision),
    )


def _register(
    spec: EngineSpec,
    registry: Registry | None,
    source_sha256: str,
    published: list[Path],
    artifacts: ArtifactStore,
    progress: ProgressSink,
) -> bool:
    """Register the published endpoints (those whose probe passed); registered?"""
    progress.step("registering")
    if registry is None or not published:
        progress.done(
            "registry: skipped" if registry is None else "registry: no endpoint to register",
            ok=registry is None,
        )
        return False
    register_build(
        registry,
        spec.model,
        spec.version,
        source_sha256,
        [(read_manifest(folder), folder) for folder in published],
        replace=spec.force,
        store=artifacts.root,
    )
    progress.done(f"registered {len(published)} endpoint variant(s) in the model registry")
    return True


# -- model digests and the version's source digest ---------------------------------------------


def model_digests(spec: EngineSpec) -> dict[Precision, str]:
    """Per variant, the sha256 of the model file its engine loaded (``""``: unknown).

    A ``model_file`` is hashed where it lies; with ``model_sha256`` too, it must match.
    """
    digests: dict[Precision, str] = {}
    for i, variant in enumerate(spec.engine.variants):
        where = f"engine.variants[{i}]"
        digest = variant.model_sha256 or ""
        if variant.model_file is not None:
            if not variant.model_file.is_file():
                raise BuildError(f"{where}.model_file: {variant.model_file} does not exist")
            digest = sha256_file(variant.model_file)
            if variant.model_sha256 is not None and digest != variant.model_sha256:
                raise BuildError(
                    f"{where}: {variant.model_file} has sha256 {digest}, the spec's "
                    f"model_sha256 is {variant.model_sha256}; which file does the engine load?"
                )
        digests[variant.precision] = digest
    return digests


def version_digest(spec: EngineSpec, digests: dict[Precision, str]) -> str:
    """The version's source digest: the first variant's model digest, else a digest of
    the variants as the spec states them (engine, endpoints, model digests)."""
    first = digests.get(spec.engine.variants[0].precision, "")
    if first:
        return first
    engine = spec.engine
    statement = {
        "backend": engine.backend.value,
        "version": engine.version,
        "strategy": engine.strategy,
        "variants": [
            {
                "precision": v.precision.value,
                "url": v.url,
                "served_model": v.served_model,
                "model_sha256": digests.get(v.precision, ""),
            }
            for v in engine.variants
        ],
    }
    return hashlib.sha256(json.dumps(statement, sort_keys=True).encode()).hexdigest()


# -- the probe ---------------------------------------------------------------------------------


def probe_endpoint(
    url: str,
    served_model: str = "",
    *,
    get: HttpGet | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> ProbeInfo:
    """Check that ``url`` answers ``/health`` and lists models at ``/v1/models`` (among
    them ``served_model`` when given); what it listed, or :class:`EndpointProbeError`."""
    fetch = get or http_get
    status, _ = _get(fetch, f"{url}/health", timeout_s)
    if status != 200:
        loading = " (still loading its model?)" if status == 503 else ""
        raise EndpointProbeError(f"{url}/health answered {status}{loading}")
    status, body = _get(fetch, f"{url}/v1/models", timeout_s)
    if status != 200:
        raise EndpointProbeError(f"{url}/v1/models answered {status}")
    models = _model_ids(body)
    if models is None:
        raise EndpointProbeError(
            f"{url}/v1/models did not answer an OpenAI model list ({{'data': [{{'id': ...}}]}})"
        )
    if not models:
        raise EndpointProbeError(f"{url}/v1/models lists no model")
    if served_model and served_model not in models:
        raise EndpointProbeError(
            f"{url}/v1/models lists {list(models)}, not the spec's served_model {served_model!r}"
        )
    return ProbeInfo(checked_at=datetime.now(UTC).isoformat(timespec="seconds"), models=models)


def _get(fetch: HttpGet, url: str, timeout_s: float) -> tuple[int, bytes]:
    try:
        return fetch(url, timeout_s)
    except urllib.error.URLError as exc:
        raise EndpointProbeError(f"{url}: no answer ({exc.reason})") from None
    except (OSError, http.client.HTTPException) as exc:
        raise EndpointProbeError(f"{url}: no answer ({exc})") from None


def _model_ids(body: bytes) -> tuple[str, ...] | None:
    """The ids of an OpenAI ``/v1/models`` answer; ``None`` when it is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    ids = [item.get("id") for item in data if isinstance(item, dict)]
    if not all(isinstance(i, str) for i in ids):
        return None
    return tuple(str(i) for i in ids)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Engine servers sit beside the build host: a proxy configured for the internet would
only stand between them (the worker calls them directly too)."""


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """``GET url`` without a proxy; an HTTP error status is an answer, not an exception."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with _DIRECT.open(request, timeout=timeout_s) as answer:
            return int(answer.status), answer.read(_MAX_BODY)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(_MAX_BODY)
