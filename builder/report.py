"""What a build did: one :class:`VariantReport` per artifact tried, in a :class:`BuildReport`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graylane.artifacts.manifest import CalibrationInfo
from graylane.artifacts.naming import ArtifactName, Backend, Precision
from graylane.builder.validation import ValidationResult
from graylane.builder.variants import VariantStatus

__all__ = ["BuildReport", "VariantReport"]


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

    @property
    def ok(self) -> bool:
        """Every ONNX Runtime variant was produced and is servable."""
        return all(
            v.status is VariantStatus.PRODUCED and v.servable
            for v in self.variants
            if v.backend is Backend.ONNXRUNTIME
        )
