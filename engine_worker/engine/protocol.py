"""The seam between the worker and an inference runtime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from graylane.engine_worker.engine.errors import InvalidInputError

Dim = int | str | None
"""A dimension: a fixed size, a named dynamic axis (``"batch"``), or unknown (``None``)."""


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """Name, element type and shape of one engine input or output."""

    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_dynamic(self, axis: int) -> bool:
        return not isinstance(self.shape[axis], int)

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether a concrete ``shape`` fits: same rank, fixed dims equal."""
        if len(shape) != len(self.shape):
            return False
        return all(not isinstance(d, int) or d == s for d, s in zip(self.shape, shape, strict=True))


@dataclass(frozen=True, kw_only=True)
class IOSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def input(self, name: str) -> TensorSpec:
        return _find(self.inputs, name)

    def output(self, name: str) -> TensorSpec:
        return _find(self.outputs, name)

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Contiguous arrays for exactly these inputs, or :class:`InvalidInputError`.

        Dtypes must match exactly: casting silently (float64 to float32, int32 ids to
        int64) would hide a client bug and could change results between variants.
        """
        expected = set(self.input_names)
        if set(feeds) != expected:
            missing = sorted(expected - set(feeds))
            extra = sorted(set(feeds) - expected)
            raise InvalidInputError(f"inputs do not match: missing {missing}, extra {extra}")
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            arr = np.asarray(feeds[spec.name])
            if arr.dtype != spec.dtype:
                raise InvalidInputError(
                    f"input {spec.name!r}: dtype {arr.dtype}, expected {spec.dtype}"
                )
            if not spec.accepts(tuple(arr.shape)):
                raise InvalidInputError(
                    f"input {spec.name!r}: shape {tuple(arr.shape)} does not fit {spec.shape}"
                )
            out[spec.name] = np.ascontiguousarray(arr)
        _check_named_dims(self.inputs, out)
        return out


def _check_named_dims(specs: tuple[TensorSpec, ...], arrays: Mapping[str, np.ndarray]) -> None:
    """Axes that share a name (``"batch"``, ``"seq"``) must share a size across inputs."""
    sizes: dict[str, tuple[int, str]] = {}
    for spec in specs:
        for axis, dim in enumerate(spec.shape):
            if not isinstance(dim, str):
                continue
            size = int(arrays[spec.name].shape[axis])
            first = sizes.setdefault(dim, (size, spec.name))
            if first[0] != size:
                raise InvalidInputError(
                    f"axis {dim!r} is {first[0]} in {first[1]!r} but {size} in {spec.name!r}"
                )


def _find(specs: tuple[TensorSpec, ...], name: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(name)


@runtime_checkable
class InferenceEngine(Protocol):
    """A loaded engine variant that runs one batch at a time.

    ``run`` may be called from a worker thread; implementations release the GIL
    while computing. Errors are :class:`~graylane.engine_worker.engine.errors.EngineError`.
    """

    @property
    def name(self) -> str:
        """Model name (or file stem) this engine was loaded from."""
        ...

    @property
    def variant(self) -> str:
        """Precision variant label as in the artifact name, e.g. ``fp32`` or ``int8``."""
        ...

    @property
    def io(self) -> IOSignature: ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...
