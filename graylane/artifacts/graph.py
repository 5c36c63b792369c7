"""Facts read from an ONNX file: digests, IO signature, decoder shape, metadata."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graylane.artifacts.digest import sha256_bytes, sha256_file

__all__ = [
    "DECODER_INPUTS",
    "DECODER_OUTPUT",
    "IOSignature",
    "TensorSpec",
    "io_signature",
    "load_header",
    "metadata_int",
    "sha256_bytes",
    "sha256_file",
]

DECODER_INPUTS = ("input_ids", "attention_mask")
DECODER_OUTPUT = "logits"


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, numpy dtype name, shape with dynamic dims as names."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class IOSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def is_decoder(self) -> bool:
        """True for a language-model graph: input_ids + attention_mask in, logits out."""
        names = {t.name for t in self.inputs}
        return set(DECODER_INPUTS) <= names and any(t.name == DECODER_OUTPUT for t in self.outputs)


def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
    dims: list[int | str] = []
    for i, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or f"dim{i}")
    return TensorSpec(name=value.name, dtype=dtype, shape=tuple(dims))


def io_signature(model: onnx.ModelProto) -> IOSignature:
    """Graph inputs (initializers excluded) and outputs."""
    initializers = {init.name for init in model.graph.initializer}
    return IOSignature(
        inputs=tuple(_tensor_spec(v) for v in model.graph.input if v.name not in initializers),
        outputs=tuple(_tensor_spec(v) for v in model.graph.output),
    )


def metadata_int(model: onnx.ModelProto, suffix: str) -> int | None:
    """An integer from ``metadata_props`` whose key is ``suffix`` or ends with ``.suffix``."""
    for prop in model.metadata_props:
        if prop.key == suffix or prop.key.endswith("." + suffix):
            try:
                return int(prop.value)
            except ValueError:
                return None
    return None


def load_header(path: Path) -> onnx.ModelProto:
    """The model without external weight data (enough for signature and metadata)."""
    return onnx.load(str(path), load_external_data=False)
