"""Loading a worker's engine variants: from explicit ONNX paths, or through the registry.

Through the registry, every file is checked against its manifest's sha256 (and the
manifest against the registry's record) before anything is loaded: a tampered
artifact is refused with an error naming the file. TensorRT engines are used only
when this host has TensorRT and a GPU, and only the one built for this GPU's compute
capability and TensorRT version; ONNX Runtime variants are portable. A model that
carries its tokenizer (``tokenizer.json``, listed and verified with the artifact's
files) is loaded with it (:attr:`LoadedVariants.tokenizer`).

When the settings name trusted public keys, each artifact's signature is checked as
well (:mod:`graylane.artifacts.signing`): an unsigned, tampered or foreign-signed
artifact is refused (:attr:`LoadedVariants.refused`) and never loaded; the others are
served. Without trusted keys signatures are not checked (and the worker says so),
unless the settings require signatures: then loading refuses to begin
(:class:`~graylane.artifacts.signing.TrustedKeyError`, naming where it looked).

An artifact folder filled by ``graylane artifacts fetch --backend ...`` lacks the other
backends' artifacts on purpose: those named in its :class:`FetchRecord` are skipped
with the reason it gives; any other missing artifact is still refused.

A variant an engine server serves (llama.cpp, vLLM, TensorRT-LLM, SGLang) is an artifact
holding only its manifest: it is verified the same way (the manifest's sha256 against
the registry, its signature against the trusted keys) and comes back as an
:class:`~graylane.engine.server.EngineEndpoint` in :attr:`LoadedVariants.endpoints`, in
the order of the version's QoS ladder. A version may have only such variants: it then
loads no engine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from graylane.artifacts.build_info import ShapeProfile
from graylane.artifacts.compatibility import select_engine
from graylane.artifacts.decoder_axes import correct_mask_axis, mask_axis_conflict
from graylane.artifacts.fetch import FetchRecord
from graylane.artifacts.manifest import Manifest
from graylane.artifacts.model_info import (
    ModelInfo,
    max_positions_from_hf_config,
    read_model_info,
)
from graylane.artifacts.naming import Backend
from graylane.artifacts.signing import ArtifactSignatureError, RefusedArtifact, verify_signature
from graylane.artifacts.verify import verify_artifact
from graylane.engine.errors import IncompatibleEngineError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine.server import EndpointError, EngineEndpoint
from graylane.engine.tensorrt import gpu_compute_capability, tensorrt_version
from graylane.errors import GraylaneError
from graylane.models.hf_tokenizer import HfTokenizer, find_tokenizer
from graylane.registry.records import ArtifactInfo
from graylane.registry.repository import open_registry
from graylane.settings import Settings

__all__ = [
    "MAX_SEQ_KEYS",
    "LoadedVariants",
    "NoServableVariant",
    "load_from_paths",
    "load_from_registry",
    "model_file",
    "onnx_max_seq_len",
    "onnx_model_info",
]

log = logging.getLogger(__name__)

MAX_SEQ_KEYS = ("graylane.demo.max_seq_len", "max_seq_len", "graylane.max_seq_len")


def load_from_paths(
    paths: Mapping[str, Path], *, model: str, intra_op_threads: int | None = None
) -> dict[str, InferenceEngine]:
    """One ONNX Runtime engine per named variant file.

    A merged decoder whose mask is declared as wide as its ids (an unbuilt export) is
    loaded with the axis corrected, as a build would publish it
    (:mod:`graylane.artifacts.decoder_axes`).
    """
    return {
        variant: _load_onnx(path, variant, model, intra_op_threads)
        for variant, path in paths.items()
    }


def _load_onnx(
    path: Path, variant: str, model: str, intra_op_threads: int | None
) -> OnnxRuntimeEngine:
    if mask_axis_conflict(onnx.load(str(path), load_external_data=False)) is None:
        return OnnxRuntimeEngine.load(path, variant, name=model, intra_op_threads=intra_op_threads)
    graph = onnx.load(str(path))
    correction = correct_mask_axis(graph)
    if correction is not None:
        log.info("%s: %s", path, correction.note())
    return OnnxRuntimeEngine.load(
        graph.SerializeToString(), variant, name=model, intra_op_threads=intra_op_threads
    )


def onnx_max_seq_len(path: Path) -> int | None:
    """The maximum sequence length recorded in an ONNX file's metadata, if any."""
    proto = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    for key in MAX_SEQ_KEYS:
        if key in meta and meta[key].isdigit():
            return int(meta[key])
    return None


def onnx_model_info(path: Path) -> ModelInfo:
    """Task and input vocabulary an ONNX file declares in its metadata (or its embedding),
    and the positions of a transformers export (its ``config.json``)."""
    info = read_model_info(onnx.load(str(path), load_external_data=False))
    return replace(info, max_seq_len=max_positions_from_hf_config(path.parent))


_MODEL_SUFFIXES = (".onnx", ".plan", ".engine")


class NoServableVariant(GraylaneError):
    """The registry holds no variant of this version that this worker can serve."""


@dataclass(frozen=True)
class LoadedVariants:
    engines: dict[str, InferenceEngine]
    fp32_path: Path | None
    skipped: dict[str, str] = field(default_factory=dict)
    """Artifact name -> why it was not loaded."""
    model_info: ModelInfo | None = None
    """The declared task and input vocabulary (from the manifests; ``None`` in older ones)."""
    profiles: tuple[ShapeProfile, ...] = ()
    """The build's shape profiles (every artifact of a version shares them)."""
    tokenizer: HfTokenizer | None = None
    """The model's own tokenizer, from an artifact's folder (``None``: it carries none)."""
    refused: tuple[RefusedArtifact, ...] = ()
    """Artifacts whose signature did not verify against the trusted keys (not loaded)."""
    endpoints: tuple[EngineEndpoint, ...] = ()
    """The variants engine servers serve, best first (the version's ladder order)."""


def model_file(folder: Path, manifest: Manifest) -> Path:
    for entry in manifest.files:
        if entry.path.endswith(_MODEL_SUFFIXES):
            return folder / entry.path
    raise NoServableVariant(f"{manifest.name}: the manifest lists no model file")


def load_from_registry(
    settings: Settings,
    model: str,
    version: str,
    *,
    intra_op_threads: int | None = None,
) -> LoadedVariants:
    keys = settings.verifying_keys()  # told to verify but no key: refuse before anything
    # Read-only: a worker never migrates nor writes the registry (the control plane does).
    registry = open_registry(settings.db_url, read_only=True)
    try:
        artifacts = registry.list_artifacts(model, version)
    finally:
        registry.engine.dispose()
    skipped: dict[str, str] = {}
    refused: list[RefusedArtifact] = []
    if not keys:
        log.warning(
            "no trusted keys configured: artifact signatures of %s %s are not verified",
            model,
            version,
        )
    fetched = FetchRecord.read(settings.artifact_dir, model, version)
    engines: dict[str, InferenceEngine] = {}
    fp32_path: Path | None = None
    onnx: dict[str, tuple[ArtifactInfo, Path, Manifest]] = {}
    plans: dict[str, list[tuple[ArtifactInfo, Path, Manifest]]] = {}
    served: dict[str, tuple[ArtifactInfo, Path, Manifest]] = {}
    for art in artifacts:
        if not art.servable:
            skipped[str(art.name)] = "not servable (failed validation and not forced)"
            continue
        folder = settings.artifact_dir / art.path  # store-relative (an absolute one as is)
        why_not_here = fetched.left_out.get(art.path) if fetched else None
        if why_not_here is not None and not folder.exists():
            skipped[str(art.name)] = f"not fetched into this pod: {why_not_here}"
            continue
        manifest = verify_artifact(folder, art.manifest_sha256)
        if keys:
            try:
                verify_signature(folder, keys)
            except ArtifactSignatureError as exc:
                log.error("refused %s: %s", art.name, exc)
                refused.append(RefusedArtifact(str(art.name), exc.reason, str(exc)))
                skipped[str(art.name)] = str(exc)
                continue
        entry = (art, folder, manifest)
        if art.backend.is_engine_server:
            served[art.precision.value] = entry  # later registrations win
        elif art.backend is Backend.TENSORRT:
            plans.setdefault(art.precision.value, []).append(entry)
        else:
            onnx[art.precision.value] = entry  # later registrations win
    cc, trt = gpu_compute_capability(), tensorrt_version()
    for precision, candidates in plans.items():
        if cc is None or trt is None:
            for art, _, _ in candidates:
                skipped[str(art.name)] = "TensorRT engine: no GPU/TensorRT on this worker"
            continue
        try:
            chosen = select_engine([m for _, _, m in candidates], f"{cc[0]}.{cc[1]}", trt)
        except IncompatibleEngineError as exc:
            for art, _, _ in candidates:
                skipped[str(art.name)] = str(exc)
            continue
        from graylane.engine.tensorrt import TensorRTEngine

        folder = next(f for _, f, m in candidates if m is chosen)
        engines[precision] = TensorRTEngine.load(model_file(folder, chosen), precision, name=model)
    for precision, (_, folder, manifest) in onnx.items():
        path = model_file(folder, manifest)
        if precision == "fp32":
            fp32_path = path
        if precision in engines:
            continue  # a TensorRT engine of this precision serves instead
        engines[precision] = OnnxRuntimeEngine.load(
            path, precision, name=model, intra_op_threads=intra_op_threads
        )
    endpoints = _endpoints(served, skipped)
    if not engines and not endpoints:
        raise NoServableVariant(
            f"no servable variant of {model} {version}: "
            + ("; ".join(f"{k}: {v}" for k, v in skipped.items()) or "nothing registered")
        )
    for name, why in skipped.items():
        log.warning("skipped %s: %s", name, why)
    ordered = dict(sorted(engines.items(), key=lambda kv: kv[0] != "fp32"))
    if fp32_path is None and onnx:
        _, folder, manifest = next(iter(onnx.values()))
        fp32_path = model_file(folder, manifest)
    entries = [*onnx.values(), *(e for c in plans.values() for e in c), *served.values()]
    info = next((m.model_info for _, _, m in entries if m.model_info is not None), None)
    profiles = next((m.profiles for _, _, m in entries if m.profiles), ())
    folder = fp32_path.parent if fp32_path is not None else entries[0][1]
    return LoadedVariants(
        ordered,
        fp32_path,
        skipped,
        model_info=info,
        profiles=profiles,
        tokenizer=find_tokenizer(folder, info),
        refused=tuple(refused),
        endpoints=endpoints,
    )


def _endpoints(
    served: Mapping[str, tuple[ArtifactInfo, Path, Manifest]], skipped: dict[str, str]
) -> tuple[EngineEndpoint, ...]:
    """The verified engine-server variants, in ladder order (a manifest that names no
    usable endpoint is skipped, with why)."""
    ranked: list[tuple[int, EngineEndpoint]] = []
    for art, _, manifest in served.values():
        try:
            endpoint = manifest.engine_endpoint()
        except EndpointError as exc:
            skipped[str(art.name)] = str(exc)
            continue
        if endpoint is None or manifest.endpoint is None:
            skipped[str(art.name)] = "an engine-server artifact whose manifest names no endpoint"
            continue
        ranked.append((manifest.endpoint.rung, endpoint))
    return tuple(e for _, e in sorted(ranked, key=lambda r: (r[0], r[1].variant)))
