"""Artifact manifests: what an artifact holds, how it was built, how well it validated.

A manifest is written as ``manifest.json`` next to the model files. Reading one
back gives the same frozen :class:`Manifest`; :func:`manifest_to_dict` and
:func:`manifest_from_dict` are the only places that know the JSON layout.

An artifact of an engine-server backend (llama.cpp, vLLM, ...) holds no model file:
its manifest alone names the endpoint that serves the variant (:class:`EndpointInfo`),
the digest of the model file that server loaded and the variant's place on the
version's QoS ladder. It is signed and verified like any other artifact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from graylane.artifacts.build_info import (
    CalibrationMethod,
    ComparisonReport,
    GroupSensitivity,
    HardwareCompatibility,
    InputShapeRange,
    Metrics,
    OutputComparison,
    PartialQuantization,
    ShapeProfile,
    Tolerance,
    WeightOnlyQuantization,
)
from graylane.artifacts.model_info import ModelInfo
from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer, parse_artifact_name
from graylane.engine.server import EngineEndpoint
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError

__all__ = [
    "MANIFEST_FILE",
    "SCHEMA_VERSION",
    "BuildHost",
    "CalibrationInfo",
    "EndpointInfo",
    "EngineTarget",
    "FileDigest",
    "GpuInfo",
    "Manifest",
    "ManifestError",
    "ProbeInfo",
    "ValidationInfo",
    "manifest_from_dict",
    "manifest_to_dict",
    "partial_from_dict",
    "partial_to_dict",
    "read_manifest",
    "with_files",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
SCHEMA_VERSION = 1


class ManifestError(GraylaneError, ValueError):
    """A manifest file is missing, unreadable or not of a known layout."""


@dataclass(frozen=True)
class FileDigest:
    """One file of the artifact, relative to its folder."""

    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str


@dataclass(frozen=True)
class BuildHost:
    hostname: str
    cpu: str
    gpu: GpuInfo | None
    python: str
    onnx: str
    onnxruntime: str
    tensorrt: str | None


@dataclass(frozen=True)
class CalibrationInfo:
    method: CalibrationMethod
    samples: int
    data_digest: str
    cache_key: str
    cache_hit: bool
    duration_s: float
    percentile: float | None = None


@dataclass(frozen=True)
class EngineTarget:
    """The GPU architecture and TensorRT version a compiled engine is bound to."""

    compute_capability: str
    tensorrt_version: str
    hardware_compatibility: HardwareCompatibility = HardwareCompatibility.NONE


@dataclass(frozen=True)
class ProbeInfo:
    """What an engine endpoint answered when the build probed it."""

    checked_at: str
    """ISO-8601 UTC time of the probe."""
    models: tuple[str, ...]
    """The model ids its ``/v1/models`` listed."""


@dataclass(frozen=True, kw_only=True)
class EndpointInfo:
    """The engine server that serves an engine-backend variant (its backend and engine
    version are the artifact name's)."""

    url: str
    """Base URL of the server (the OpenAI routes are under ``<url>/v1``)."""
    served_model: str = ""
    """The ``model`` of each call; empty: the first model the server lists."""
    model_file: str = ""
    """The model file's name as the spec gave it (informational: it lies on the server's host)."""
    model_sha256: str = ""
    """Digest of the model file the server loaded; empty: not known to the build."""
    slots: int
    """Calls in flight at once."""
    rung: int
    """Place on the version's QoS ladder, 0 the best."""
    ladder: tuple[str, ...]
    """Every variant of the version, best first, as the build named them."""
    probe: ProbeInfo | None = None
    """``None``: not probed at build time."""


@dataclass(frozen=True)
class ValidationInfo:
    passed: bool
    tolerance: Tolerance
    metrics: Metrics | None
    failures: tuple[str, ...] = ()
    error: str | None = None
    comparison: ComparisonReport | None = None
    data: str | None = None
    """What the variant was judged on (a prompts file, recorded requests, or random
    tokens, labelled as the fallback they are)."""


@dataclass(frozen=True)
class Manifest:
    name: ArtifactName
    files: tuple[FileDigest, ...]
    io: IOSignature
    profiles: tuple[ShapeProfile, ...]
    build_host: BuildHost
    build_duration_s: float
    source_onnx_sha256: str
    source_git_commit: str | None
    created_at: str
    servable: bool
    forced: bool = False
    calibration: CalibrationInfo | None = None
    target: EngineTarget | None = None
    validation: ValidationInfo | None = None
    notes: tuple[str, ...] = ()
    model_info: ModelInfo | None = None
    """Task, input vocabulary and source quantization (``None`` in older manifests)."""
    partial_quantization: PartialQuantization | None = None
    endpoint: EndpointInfo | None = None
    """The engine server serving this variant (engine-server backends only; no files)."""
    weight_only: WeightOnlyQuantization | None = None
    """How a weight-only variant's weights were quantized (``int8-weight-only``, ``int4``)."""

    @property
    def model(self) -> str:
        return self.name.model

    @property
    def version(self) -> SemVer:
        return self.name.version

    @property
    def precision(self) -> Precision:
        return self.name.precision

    @property
    def strategy(self) -> str:
        return self.name.strategy

    @property
    def backend(self) -> Backend:
        return self.name.backend

    @property
    def backend_version(self) -> str:
        return self.name.backend_version

    def engine_endpoint(self) -> EngineEndpoint | None:
        """The endpoint a worker calls for this variant (``None``: a model file artifact)."""
        e = self.endpoint
        if e is None:
            return None
        return EngineEndpoint(
            variant=self.precision.value,
            url=e.url,
            backend=self.backend,
            engine_version=self.backend_version,
            served_model=e.served_model,
            model_sha256=e.model_sha256,
            slots=e.slots,
        )


# ---------------------------------------------------------------- JSON layout


def manifest_to_dict(m: Manifest) -> dict[str, Any]:
    cal = m.calibration
    val = m.validation
    host = m.build_host
    return {
        "schema": SCHEMA_VERSION,
        "name": str(m.name),
        "model": m.model,
        "version": str(m.version),
        "precision": m.precision.value,
        "strategy": m.strategy,
        "backend": m.backend.value,
        "backend_version": m.backend_version,
        "files": [{"path": f.path, "sha256": f.sha256, "bytes": f.bytes} for f in m.files],
        "io": m.io.to_dict(),
        "profiles": [
            {
                "name": p.name,
                "shapes": {
                    s.input: {"min": list(s.min), "opt": list(s.opt), "max": list(s.max)}
                    for s in p.shapes
                },
            }
            for p in m.profiles
        ],
        "calibration": None
        if cal is None
        else {
            "method": cal.method.value,
            "samples": cal.samples,
            "data_digest": cal.data_digest,
            "cache_key": cal.cache_key,
            "cache_hit": cal.cache_hit,
            "duration_s": round(cal.duration_s, 3),
            "percentile": cal.percentile,
        },
        "target": None
        if m.target is None
        else {
            "compute_capability": m.target.compute_capability,
            "tensorrt_version": m.target.tensorrt_version,
            "hardware_compatibility": m.target.hardware_compatibility.value,
        },
        "build_host": {
            "hostname": host.hostname,
            "cpu": host.cpu,
            "gpu": None
            if host.gpu is None
            else {"name": host.gpu.name, "compute_capability": host.gpu.compute_capability},
            "python": host.python,
            "onnx": host.onnx,
            "onnxruntime": host.onnxruntime,
            "tensorrt": host.tensorrt,
        },
        "build_duration_s": round(m.build_duration_s, 3),
        "source": {"onnx_sha256": m.source_onnx_sha256, "git_commit": m.source_git_commit},
        "validation": None
        if val is None
        else {
            "passed": val.passed,
            "tolerance": {
                "max_abs": val.tolerance.max_abs,
                "min_cosine": val.tolerance.min_cosine,
                "min_top1_agreement": val.tolerance.min_top1_agreement,
                "min_token_agreement": val.tolerance.min_token_agreement,
                "max_accuracy_drop": val.tolerance.max_accuracy_drop,
            },
            "metrics": None
            if val.metrics is None
            else {
                "max_abs": val.metrics.max_abs,
                "mean_rel": val.metrics.mean_rel,
                "cosine": val.metrics.cosine,
                "top1_agreement": val.metrics.top1_agreement,
                "rows": val.metrics.rows,
                "token_agreement": val.metrics.token_agreement,
                "token_agreement_overall": val.metrics.token_agreement_overall,
                "accuracy": val.metrics.accuracy,
                "reference_accuracy": val.metrics.reference_accuracy,
            },
            "failures": list(val.failures),
            "error": val.error,
            "comparison": _comparison_to_dict(val.comparison),
            "data": val.data,
        },
        "servable": m.servable,
        "forced": m.forced,
        "notes": list(m.notes),
        "model_info": None if m.model_info is None else m.model_info.to_dict(),
        "partial_quantization": partial_to_dict(m.partial_quantization),
        "endpoint": _endpoint_to_dict(m.endpoint),
        "weight_only": None if m.weight_only is None else m.weight_only.to_dict(),
        "created_at": m.created_at,
    }


def _endpoint_to_dict(e: EndpointInfo | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "url": e.url,
        "served_model": e.served_model,
        "model_file": e.model_file,
        "model_sha256": e.model_sha256,
        "slots": e.slots,
        "rung": e.rung,
        "ladder": list(e.ladder),
        "probe": None
        if e.probe is None
        else {"checked_at": e.probe.checked_at, "models": list(e.probe.models)},
    }


def _endpoint_from_dict(raw: Mapping[str, Any] | None) -> EndpointInfo | None:
    if raw is None:
        return None
    probe = raw.get("probe")
    return EndpointInfo(
        url=str(raw["url"]),
        served_model=str(raw.get("served_model", "")),
        model_file=str(raw.get("model_file", "")),
        model_sha256=str(raw.get("model_sha256", "")),
        slots=int(raw["slots"]),
        rung=int(raw["rung"]),
        ladder=tuple(str(v) for v in raw["ladder"]),
        probe=None
        if probe is None
        else ProbeInfo(
            checked_at=str(probe["checked_at"]), models=tuple(str(m) for m in probe["models"])
        ),
    )


def _comparison_to_dict(c: ComparisonReport | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "engine": c.engine,
        "baseline": c.baseline,
        "candidate": c.candidate,
        "iterations": c.iterations,
        "outputs": [
            {
                "name": o.name,
                "max_abs": o.max_abs,
                "max_rel": o.max_rel,
                "mean_abs": o.mean_abs,
                "passed": o.passed,
            }
            for o in c.outputs
        ],
    }


def _comparison_from_dict(raw: Mapping[str, Any] | None) -> ComparisonReport | None:
    if raw is None:
        return None
    return ComparisonReport(
        engine=str(raw["engine"]),
        baseline=str(raw["baseline"]),
        candidate=str(raw["candidate"]),
        iterations=int(raw["iterations"]),
        outputs=tuple(
            OutputComparison(
                name=str(o["name"]),
                max_abs=float(o["max_abs"]),
                max_rel=float(o["max_rel"]),
                mean_abs=float(o["mean_abs"]),
                passed=None if o.get("passed") is None else bool(o["passed"]),
            )
            for o in raw["outputs"]
        ),
    )


def _opt_float(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def manifest_from_dict(raw: Mapping[str, Any]) -> Manifest:
    """Rebuild a :class:`Manifest`; raises :class:`ManifestError` on a foreign layout."""
    if raw.get("schema") != SCHEMA_VERSION:
        raise ManifestError(
            f"manifest schema {raw.get('schema')!r} is not supported (expected {SCHEMA_VERSION})"
        )
    try:
        host = raw["build_host"]
        gpu = host.get("gpu")
        cal = raw.get("calibration")
        target = raw.get("target")
        val = raw.get("validation")
        metrics = None if val is None else val.get("metrics")
        return Manifest(
            name=parse_artifact_name(raw["name"]),
            files=tuple(
                FileDigest(path=f["path"], sha256=f["sha256"], bytes=int(f["bytes"]))
                for f in raw["files"]
            ),
            io=IOSignature.from_dict(raw["io"]),
            profiles=tuple(
                ShapeProfile(
                    name=p["name"],
                    shapes=tuple(
                        InputShapeRange(
                            input=k,
                            min=tuple(v["min"]),
                            opt=tuple(v["opt"]),
                            max=tuple(v["max"]),
                        )
                        for k, v in p["shapes"].items()
                    ),
                )
                for p in raw["profiles"]
            ),
            build_host=BuildHost(
                hostname=host["hostname"],
                cpu=host["cpu"],
                gpu=None if gpu is None else GpuInfo(gpu["name"], gpu["compute_capability"]),
                python=host["python"],
                onnx=host["onnx"],
                onnxruntime=host["onnxruntime"],
                tensorrt=host.get("tensorrt"),
            ),
            build_duration_s=float(raw["build_duration_s"]),
            source_onnx_sha256=raw["source"]["onnx_sha256"],
            source_git_commit=raw["source"].get("git_commit"),
            created_at=raw["created_at"],
            servable=bool(raw["servable"]),
            forced=bool(raw.get("forced", False)),
            calibration=None
            if cal is None
            else CalibrationInfo(
                method=CalibrationMethod(cal["method"]),
                samples=int(cal["samples"]),
                data_digest=cal["data_digest"],
                cache_key=cal["cache_key"],
                cache_hit=bool(cal["cache_hit"]),
                duration_s=float(cal["duration_s"]),
                percentile=_opt_float(cal.get("percentile")),
            ),
            target=None
            if target is None
            else EngineTarget(
                compute_capability=target["compute_capability"],
                tensorrt_version=target["tensorrt_version"],
                hardware_compatibility=HardwareCompatibility(
                    target.get("hardware_compatibility", "none")
                ),
            ),
            validation=None
            if val is None
            else ValidationInfo(
                passed=bool(val["passed"]),
                tolerance=Tolerance(**{k: _opt_float(v) for k, v in val["tolerance"].items()}),
                metrics=None
                if metrics is None
                else Metrics(
                    max_abs=float(metrics["max_abs"]),
                    mean_rel=float(metrics["mean_rel"]),
                    cosine=float(metrics["cosine"]),
                    top1_agreement=float(metrics["top1_agreement"]),
                    rows=int(metrics["rows"]),
                    token_agreement=_opt_float(metrics.get("token_agreement")),
                    token_agreement_overall=_opt_float(metrics.get("token_agreement_overall")),
                    accuracy=_opt_float(metrics.get("accuracy")),
                    reference_accuracy=_opt_float(metrics.get("reference_accuracy")),
                ),
                failures=tuple(val.get("failures", ())),
                error=val.get("error"),
                comparison=_comparison_from_dict(val.get("comparison")),
                data=val.get("data"),
            ),
            notes=tuple(raw.get("notes", ())),
            model_info=None
            if raw.get("model_info") is None
            else ModelInfo.from_dict(raw["model_info"]),
            partial_quantization=partial_from_dict(raw.get("partial_quantization")),
            endpoint=_endpoint_from_dict(raw.get("endpoint")),
            weight_only=WeightOnlyQuantization.from_dict(raw.get("weight_only")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"manifest is malformed: {type(exc).__name__}: {exc}") from None


def with_files(manifest: Manifest, files: tuple[FileDigest, ...]) -> Manifest:
    """``manifest`` listing ``files`` (for :meth:`ArtifactStore.publish`)."""
    return replace(manifest, files=files)


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest_to_dict(manifest), indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{folder} has no {MANIFEST_FILE}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{path}: the top level is not an object")
    return manifest_from_dict(raw)


# -- the ``partial_quantization`` section to and from JSON-ready dicts


def partial_to_dict(p: PartialQuantization | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "full_failures": list(p.full_failures),
        "full_top1_agreement": p.full_top1_agreement,
        "quantizable_nodes": p.quantizable_nodes,
        "node_budget": p.node_budget,
        "kept_float": list(p.kept_float),
        "passed": p.passed,
        "trials": p.trials,
        "sensitivity": [
            {
                "group": s.group,
                "nodes": list(s.nodes),
                "top1_agreement": s.top1_agreement,
                "cosine": s.cosine,
            }
            for s in p.sensitivity
        ],
        "fp32_ms": p.fp32_ms,
        "variant_ms": p.variant_ms,
        "full_ms": p.full_ms,
        "speedup_vs_fp32": p.speedup_vs_fp32,
        "stopped_by": p.stopped_by,
        "duration_s": p.duration_s,
    }


def partial_from_dict(raw: Mapping[str, Any] | None) -> PartialQuantization | None:
    if raw is None:
        return None
    return PartialQuantization(
        full_failures=tuple(str(f) for f in raw["full_failures"]),
        full_top1_agreement=_opt_float(raw.get("full_top1_agreement")),
        quantizable_nodes=int(raw["quantizable_nodes"]),
        node_budget=int(raw["node_budget"]),
        kept_float=tuple(str(n) for n in raw["kept_float"]),
        passed=bool(raw["passed"]),
        trials=int(raw["trials"]),
        sensitivity=tuple(
            GroupSensitivity(
                group=str(s["group"]),
                nodes=tuple(str(n) for n in s["nodes"]),
                top1_agreement=float(s["top1_agreement"]),
                cosine=float(s["cosine"]),
            )
            for s in raw.get("sensitivity", ())
        ),
        fp32_ms=_opt_float(raw.get("fp32_ms")),
        variant_ms=_opt_float(raw.get("variant_ms")),
        full_ms=_opt_float(raw.get("full_ms")),
        stopped_by=raw.get("stopped_by"),
        duration_s=_opt_float(raw.get("duration_s")),
    )
