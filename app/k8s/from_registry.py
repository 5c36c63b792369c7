"""A :class:`WorkerPlan` from what the registry holds for one model version."""

from __future__ import annotations

from graylane.app.k8s.workers import (
    CPU_RESOURCES,
    GPU_RESOURCES,
    GpuArch,
    WorkerPlan,
    pick_image,
)
from graylane.artifacts.naming import Backend
from graylane.errors import GraylaneError
from graylane.registry import Registry, target_for
from graylane.topics import TopicLayout

__all__ = ["NothingToDeploy", "plan_from_registry"]


class NothingToDeploy(GraylaneError, LookupError):
    """The registry holds no servable artifact of the version for the requested target."""


def plan_from_registry(
    registry: Registry,
    model: str,
    version: str,
    *,
    gpu: GpuArch | None = None,
    layout: TopicLayout,
    **options: object,
) -> WorkerPlan:
    """CPU: the servable ONNX Runtime variants. GPU: the TensorRT engines built for the
    architecture (ONNX Runtime variants of other precisions ride along); the image is named
    after the best-precision artifact of the kind the worker runs."""
    info = registry.get_version(model, version)  # raises UnknownVersion
    servable = [a for a in registry.list_artifacts(model, version) if a.servable]
    onnx = [a for a in servable if a.backend is Backend.ONNXRUNTIME]
    if gpu is None:
        primary = onnx
    else:
        target = target_for(gpu.compute_capability)
        primary = [a for a in servable if a.backend is Backend.TENSORRT and a.target == target]
    if not primary:
        kind = (
            "ONNX Runtime" if gpu is None else f"TensorRT ({gpu.name}, sm{gpu.compute_capability})"
        )
        raise NothingToDeploy(f"{model} {info.version}: no servable {kind} artifact registered")
    variants = sorted({a.precision.value for a in primary} | {a.precision.value for a in onnx})
    return WorkerPlan(
        model=model,
        version=str(info.version),
        image_name=pick_image([a.name for a in primary]),
        variants=tuple(variants),
        gpu=gpu,
        resources=CPU_RESOURCES if gpu is None else GPU_RESOURCES,
        layout=layout,
        **options,  # type: ignore[arg-type]
    )
