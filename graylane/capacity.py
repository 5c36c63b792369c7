"""Measured capacity: an engine's service time per variant and batch size, on one host.

``graylane calibrate`` measures a :class:`CapacityProfile` and stores it under the
artifact directory (``capacity/<model>@<version>.json``) with the host it was
measured on. Loads in the demo and the benchmarks are fractions of
:func:`measured_capacity`, never fixed rates. The measurement takes any
:class:`~graylane.engine.protocol.InferenceEngine`; nothing here loads one.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from graylane.clock import now_ms
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import TensorSpec
from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_BATCHES",
    "BatchPoint",
    "CapacityError",
    "CapacityProfile",
    "VariantCapacity",
    "load_profile",
    "measure_variant",
    "measured_capacity",
    "profile_of",
    "profile_path",
    "rung_capacities",
    "save_profile",
    "synthetic_feeds",
    "this_host",
]

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8)


class CapacityError(GraylaneError, ValueError):
    """A capacity profile is malformed or asks for what was not measured."""


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """Median engine milliseconds for one batch of ``batch`` rows."""

    batch: int
    service_ms: float

    @property
    def rps(self) -> float:
        return self.batch * 1000.0 / self.service_ms if self.service_ms > 0 else 0.0


@dataclass(frozen=True, slots=True)
class VariantCapacity:
    variant: str
    seq_len: int
    points: tuple[BatchPoint, ...]

    def rps(self, batch: int | None = None) -> float:
        """Requests/s at ``batch`` rows per call; ``None``: at the best measured size."""
        if not self.points:
            raise CapacityError(f"variant {self.variant!r} has no measurements")
        if batch is None:
            return max(p.rps for p in self.points)
        for point in self.points:
            if point.batch == batch:
                return point.rps
        raise CapacityError(f"variant {self.variant!r} was not measured at batch {batch}")


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    model: str
    version: str
    host: str
    measured_at_unix_ms: int
    threads: int
    variants: tuple[VariantCapacity, ...]

    def variant(self, name: str) -> VariantCapacity:
        for v in self.variants:
            if v.variant == name:
                return v
        raise CapacityError(f"{self.model}/{self.version} has no calibration for {name!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CapacityProfile:
        try:
            raw = json.loads(text)
            variants = tuple(
                VariantCapacity(
                    v["variant"],
                    int(v["seq_len"]),
                    tuple(BatchPoint(int(p["batch"]), float(p["service_ms"])) for p in v["points"]),
                )
                for v in raw["variants"]
            )
            return cls(
                model=raw["model"],
                version=raw["version"],
                host=raw["host"],
                measured_at_unix_ms=int(raw["measured_at_unix_ms"]),
                threads=int(raw.get("threads", 0)),
                variants=variants,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CapacityError(f"malformed capacity profile: {exc}") from None


def this_host() -> str:
    return socket.gethostname()


def profile_path(artifact_dir: Path, model: str, version: str) -> Path:
    return artifact_dir / "capacity" / f"{model}@{version}.json"


def save_profile(artifact_dir: Path, profile: CapacityProfile) -> Path:
    path = profile_path(artifact_dir, profile.model, profile.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.to_json())
    tmp.replace(path)
    return path


def load_profile(artifact_dir: Path, model: str, version: str) -> CapacityProfile | None:
    path = profile_path(artifact_dir, model, version)
    return CapacityProfile.from_json(path.read_text()) if path.exists() else None


def measured_capacity(
    artifact_dir: Path,
    model: str,
    version: str,
    variant: str = "fp32",
    batch: int | None = None,
    *,
    host: str | None = None,
) -> float | None:
    """Requests/s of ``variant`` as calibrated on ``host`` (default: this one).

    ``None`` when the model was never calibrated here: a figure from another
    machine says nothing about this one.
    """
    profile = load_profile(artifact_dir, model, version)
    if profile is None or profile.host != (host or this_host()):
        return None
    try:
        return profile.variant(variant).rps(batch)
    except CapacityError:
        return None


def rung_capacities(
    profile: CapacityProfile, ladder: Sequence[str]
) -> tuple[tuple[str, float], ...]:
    """(variant, requests/s at its best measured batch) of the ladder's calibrated rungs,
    for :attr:`~graylane.rollouts.qos_policy.QosPolicy.rung_capacity_rps`."""
    calibrated = {v.variant: v for v in profile.variants if v.points}
    return tuple(
        sorted((name, round(calibrated[name].rps(), 3)) for name in ladder if name in calibrated)
    )


def synthetic_feeds(
    inputs: Sequence[TensorSpec], batch: int, seq_len: int
) -> dict[str, np.ndarray]:
    """Inputs of the right types: token ids, all-ones masks, zeros; batch x seq_len."""
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = [batch] + [d if isinstance(d, int) else seq_len for d in spec.shape[1:]]
        if "mask" in spec.name:
            feeds[spec.name] = np.ones(shape, dtype=spec.dtype)
        elif spec.dtype.kind in "iu":
            size = int(np.prod(shape))
            feeds[spec.name] = (np.arange(size) % 97 + 3).reshape(shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def measure_variant(
    engine: InferenceEngine,
    variant: str,
    *,
    seq_len: int = 64,
    batches: Sequence[int] = DEFAULT_BATCHES,
    seconds_per_point: float = 2.0,
    feeds_for: Mapping[int, Mapping[str, np.ndarray]] | None = None,
) -> VariantCapacity:
    """Median engine time per batch size (one warm-up call each, then timed calls)."""
    points: list[BatchPoint] = []
    for batch in batches:
        feeds = (feeds_for or {}).get(batch) or synthetic_feeds(engine.io.inputs, batch, seq_len)
        engine.run(feeds)
        times: list[float] = []
        start = time.perf_counter()
        while not times or time.perf_counter() - start < seconds_per_point:
            t0 = time.perf_counter()
            engine.run(feeds)
            times.append((time.perf_counter() - t0) * 1000.0)
        points.append(BatchPoint(batch, float(np.median(times))))
    return VariantCapacity(variant, seq_len, tuple(points))


def profile_of(
    model: str, version: str, variants: Sequence[VariantCapacity], *, threads: int = 0
) -> CapacityProfile:
    return CapacityProfile(
        model=model,
        version=version,
        host=this_host(),
        measured_at_unix_ms=now_ms(),
        threads=threads,
        variants=tuple(variants),
    )
