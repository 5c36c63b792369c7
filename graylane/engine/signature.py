"""The one description of an engine's or a graph's inputs and outputs.

Used by the engines (feed checking), the builder (samples, profiles) and the
artifact manifests (JSON), so a signature read from an ONNX file, from a loaded
session or from a manifest compares equal when it describes the same tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from graylane.engine.errors import BadDtype, BadShape, MissingInput, UnexpectedInput

if TYPE_CHECKING:
    import onnx

__all__ = ["DECODER_INPUTS", "DECODER_OUTPUT", "Dim", "IOSignature", "TensorSpec"]

Dim = int | str | None
"""A dimension: a fixed size, a named dynamic axis (``"batch"``), or unknown (``None``)."""

DECODER_INPUTS = ("input_ids", "attention_mask")
DECODER_OUTPUT = "logits"


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of one input or output.

    ``dtype`` may be given as a numpy dtype or its name (``"int64"``); it is
    always stored as a :class:`numpy.dtype`.
    """

    name: str
    dtype: np.dtype[np.generic]
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def dtype_name(self) -> str:
        """The numpy name of the element type, as written in manifests (``"float32"``)."""
        return self.dtype.name

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

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON form."""
        return {"name": self.name, "dtype": self.dtype_name, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TensorSpec:
        shape = tuple(d if d is None or isinstance(d, str) else int(d) for d in raw["shape"])
        return cls(str(raw["name"]), np.dtype(str(raw["dtype"])), shape)


@dataclass(frozen=True)
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
        """The input called ``name``; :class:`KeyError` if there is none."""
        return _find(self.inputs, name)

    def output(self, name: str) -> TensorSpec:
        """The output called ``name``; :class:`KeyError` if there is none."""
        return _find(self.outputs, name)

    def find_input(self, name: str) -> TensorSpec | None:
        """The input called ``name``, or ``None``."""
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def is_decoder(self) -> bool:
        """True for a language-model graph: input_ids + attention_mask in, logits out."""
        return set(DECODER_INPUTS) <= set(self.input_names) and DECODER_OUTPUT in self.output_names

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto) -> IOSignature:
        """Graph inputs (initializers excluded) and outputs; unnamed dynamic axes get ``dimN``."""
        initializers = {init.name for init in model.graph.initializer}
        return cls(
            inputs=tuple(_onnx_spec(v) for v in model.graph.input if v.name not in initializers),
            outputs=tuple(_onnx_spec(v) for v in model.graph.output),
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON form."""
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> IOSignature:
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in raw["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in raw["outputs"]),
        )

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Contiguous arrays for exactly these inputs, or a typed input error.

        Raises :class:`MissingInput`, :class:`UnexpectedInput`, :class:`BadDtype`
        or :class:`BadShape`. Dtypes must match exactly: casting silently (float64
        to float32, int32 ids to int64) would hide a client bug and could change
        results between variants.
        """
        expected = set(self.input_names)
        missing = sorted(expected - set(feeds))
        extra = sorted(set(feeds) - expected)
        if missing:
            raise MissingInput(f"missing input(s) {missing}; the model takes {sorted(expected)}")
        if extra:
            raise UnexpectedInput(
                f"unexpected input(s) {extra}; the model takes {sorted(expected)}"
            )
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            arr = np.asarray(feeds[spec.name])
            if arr.dtype != spec.dtype:
                raise BadDtype(f"input {spec.name!r} is {arr.dtype}; the model wants {spec.dtype}")
            if not spec.accepts(tuple(int(d) for d in arr.shape)):
                dims = ["?" if not isinstance(d, int) else str(d) for d in spec.shape]
                raise BadShape(
                    f"input {spec.name!r} has shape {list(arr.shape)}; "
                    f"the model wants [{', '.join(dims)}]"
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
                raise BadShape(
                    f"axis {dim!r} is {first[0]} in {first[1]!r} but {size} in {spec.name!r}"
                )


def _find(specs: tuple[TensorSpec, ...], name: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(name)


def _onnx_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    from onnx import helper

    tensor_type = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    dims: list[Dim] = []
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or f"dim{i}")
    return TensorSpec(value.name, dtype, tuple(dims))
