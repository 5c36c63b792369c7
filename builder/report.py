"""What a build did: one :class:`VariantReport` per artifact tried, in a :class:`BuildReport`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graylane.artifacts.manifest import CalibrationInfo
from graylane.artifacts.model_info import ModelInfo
from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.builder.validation import ValidationResult
from graylane.builder.variants import VariantStatus

__all__ = ["BuildReport", "VariantReport", "variants_ok"]


@dataclass(frozen=True)
class VariantReport:
    """One artifact the build tried to make."""

    precision: Precision
    backend: Backend
    status: VariantStatus
    reason: str | None = None
    artifact: ArtifactName | None = None
    folder: Path | None = None
    validation: ValidationResult | None = None
    servable: bool = False
    forced: bool = False
    compute_capability: str | None = None
    calibration: CalibrationInfo | None = None
    duration_s: float = 0.0


@dataclass(frozen=True)
class BuildReport:
    model: str
    version: str
    source: Path
    source_sha256: str
    store: Path
    variants: tuple[VariantReport, ...]
    tensorrt_note: str | None
    registered: bool
    duration_s: float
    model_info: ModelInfo | None = None
    notes: tuple[str, ...] = ()
    """What the build decided on its own (default validation data, skipped variants)."""

    @property
    def ok(self) -> bool:
        """Every ONNX Runtime variant was produced and is servable (or skipped as pointless)."""
        return variants_ok(self.variants)


def variants_ok(variants: tuple[VariantReport, ...] | list[VariantReport]) -> bool:
    """The build succeeded: each ONNX Runtime variant is servable or was skipped, and one exists."""
    onnx = [v for v in variants if v.backend is Backend.ONNXRUNTIME]
    return any(v.status is VariantStatus.PRODUCED for v in onnx) and all(
        (v.status is VariantStatus.PRODUCED and v.servable) or v.status is VariantStatus.SKIPPED
        for v in onnx
    )
