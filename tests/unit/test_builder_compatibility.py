"""Engines refused on the wrong GPU or TensorRT version; the right one picked among several."""

from __future__ import annotations

import pytest

from graylane.artifacts.build_info import HardwareCompatibility
from graylane.artifacts.compatibility import (
    NoCompatibleEngineError,
    check_engine_compatibility,
    select_engine,
)
from graylane.artifacts.manifest import BuildHost, EngineTarget, Manifest
from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer
from graylane.engine.errors import IncompatibleEngineError
from graylane.engine.signature import IOSignature

HOST = BuildHost("h", "cpu", None, "3.11", "1.23", "1.32.0", None)


def _manifest(
    cc: str | None,
    trt: str = "10.13.0",
    level: HardwareCompatibility = HardwareCompatibility.NONE,
    backend: Backend = Backend.TENSORRT,
) -> Manifest:
    return Manifest(
        name=ArtifactName(
            "demo-gpt",
            backend,
            trt if backend is Backend.TENSORRT else "1.32.0",
            Precision.FP16,
            "default",
            SemVer(1, 2, 0),
        ),
        files=(),
        io=IOSignature((), ()),
        profiles=(),
        build_host=HOST,
        build_duration_s=1.0,
        source_onnx_sha256="0" * 64,
        source_git_commit=None,
        created_at="2026-01-01T00:00:00+00:00",
        servable=True,
        target=None if cc is None else EngineTarget(cc, trt, level),
    )


def test_matching_engine_passes() -> None:
    matching = _manifest("9.0")
    assert check_engine_compatibility(matching, "9.0", "10.13.0") is None  # raises when refused
    assert select_engine([matching], "9.0", "10.13.0") is matching


def test_wrong_compute_capability_is_refused_with_both_sides_named() -> None:
    with pytest.raises(IncompatibleEngineError) as info:
        check_engine_compatibility(_manifest("8.6"), "9.0", "10.13.0")
    assert (
        "engine built for compute capability 8.6 / TensorRT 10.13.0, "
        "this worker has 9.0 / 10.13.0" in str(info.value)
    )


def test_wrong_tensorrt_version_is_refused() -> None:
    with pytest.raises(IncompatibleEngineError, match=r"this worker has 9\.0 / 10\.14\.1"):
        check_engine_compatibility(_manifest("9.0"), "9.0", "10.14.1")


def test_ampere_plus_engine_runs_on_newer_gpus_only() -> None:
    portable = _manifest("8.6", level=HardwareCompatibility.AMPERE_PLUS)
    assert check_engine_compatibility(portable, "9.0", "10.13.0") is None  # raises when refused
    assert select_engine([portable], "9.0", "10.13.0") is portable
    with pytest.raises(IncompatibleEngineError, match="Ampere-plus"):
        check_engine_compatibility(portable, "7.5", "10.13.0")


def test_engine_without_target_is_refused() -> None:
    with pytest.raises(IncompatibleEngineError, match="no recorded compute capability"):
        check_engine_compatibility(_manifest(None), "9.0", "10.13.0")


def test_onnxruntime_artifacts_are_portable() -> None:
    onnx = _manifest(None, backend=Backend.ONNXRUNTIME)
    assert check_engine_compatibility(onnx, "7.0", "8.6.1") is None  # raises when refused


def test_select_engine_picks_the_matching_architecture() -> None:
    engines = [_manifest("8.0"), _manifest("8.6"), _manifest("9.0"), _manifest("8.9")]
    assert select_engine(engines, "9.0", "10.13.0").target == engines[2].target
    assert select_engine(engines, "8.6", "10.13.0").target == engines[1].target


def test_select_engine_prefers_exact_over_portable() -> None:
    portable = _manifest("8.0", level=HardwareCompatibility.AMPERE_PLUS)
    exact = _manifest("8.9")
    assert select_engine([portable, exact], "8.9", "10.13.0") is exact
    assert select_engine([portable, exact], "9.0", "10.13.0") is portable


def test_select_engine_lists_what_exists_when_nothing_fits() -> None:
    with pytest.raises(NoCompatibleEngineError) as info:
        select_engine([_manifest("8.6"), _manifest("9.0")], "12.0", "10.13.0")
    message = str(info.value)
    assert "compute capability 12.0 / TensorRT 10.13.0" in message
    assert "8.6" in message and "9.0" in message
