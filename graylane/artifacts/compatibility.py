"""Which compiled engine may run on which GPU. Pure logic over manifests.

Raises the engine layer's :class:`~graylane.engine.errors.IncompatibleEngineError`, the
same class a TensorRT engine raises on load (:class:`NoCompatibleEngineError` is one).
"""

from __future__ import annotations

from collections.abc import Iterable

from graylane.artifacts.build_info import HardwareCompatibility
from graylane.artifacts.manifest import Manifest
from graylane.artifacts.naming import Backend
from graylane.engine.errors import IncompatibleEngineError

__all__ = [
    "NoCompatibleEngineError",
    "check_engine_compatibility",
    "select_engine",
]

_AMPERE = (8, 0)


class NoCompatibleEngineError(IncompatibleEngineError):
    """None of the candidate engines fits this worker."""


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise IncompatibleEngineError(f"compute capability {text!r} is not MAJOR.MINOR") from None


def _target_text(manifest: Manifest) -> str:
    if manifest.target is None:
        return "no recorded GPU target"
    return f"compute capability {manifest.target.compute_capability} / TensorRT " + (
        manifest.target.tensorrt_version
    )


def check_engine_compatibility(manifest: Manifest, gpu_cc: str, trt_version: str) -> None:
    """Raise :class:`IncompatibleEngineError` unless the engine can run here.

    ONNX Runtime artifacts are portable and always pass. A TensorRT plan needs the
    exact TensorRT version it was built with, and the same compute capability
    unless it was built hardware-compatible (Ampere-plus: any 8.0+ GPU).
    """
    if manifest.backend is not Backend.TENSORRT:
        return
    target = manifest.target
    if target is None:
        raise IncompatibleEngineError(
            f"{manifest.name}: TensorRT engine has no recorded compute capability / TensorRT "
            "version; rebuild it"
        )
    here = f"this worker has {gpu_cc} / {trt_version}"
    built = f"engine built for compute capability {target.compute_capability} / TensorRT " + (
        f"{target.tensorrt_version}"
    )
    if target.tensorrt_version != trt_version:
        raise IncompatibleEngineError(f"{manifest.name}: {built}, {here}")
    level = target.hardware_compatibility
    if level is HardwareCompatibility.AMPERE_PLUS:
        if _cc(gpu_cc) < _AMPERE:
            raise IncompatibleEngineError(
                f"{manifest.name}: {built} (Ampere-plus compatible: needs 8.0 or newer), {here}"
            )
        return
    if _cc(target.compute_capability) != _cc(gpu_cc):
        raise IncompatibleEngineError(f"{manifest.name}: {built}, {here}")


def select_engine(manifests: Iterable[Manifest], gpu_cc: str, trt_version: str) -> Manifest:
    """The engine built for this GPU among several architectures.

    An engine built for exactly this compute capability wins over a
    hardware-compatible one; among equals, the first given wins.
    """
    candidates = [m for m in manifests if m.backend is Backend.TENSORRT]
    exact: list[Manifest] = []
    portable: list[Manifest] = []
    for manifest in candidates:
        try:
            check_engine_compatibility(manifest, gpu_cc, trt_version)
        except IncompatibleEngineError:
            continue
        target = manifest.target
        if target is not None and _cc(target.compute_capability) == _cc(gpu_cc):
            exact.append(manifest)
        else:
            portable.append(manifest)
    if exact or portable:
        return (exact or portable)[0]
    available = ", ".join(_target_text(m) for m in candidates) or "none"
    raise NoCompatibleEngineError(
        f"no TensorRT engine fits this worker (compute capability {gpu_cc} / TensorRT "
        f"{trt_version}); available: {available}"
    )
