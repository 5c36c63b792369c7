"""Facts read from an ONNX file: digests, IO signature, decoder shape, metadata.

The signature types are the engine layer's (:mod:`graylane.engine.signature`),
re-exported here for the builder's convenience.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from graylane.artifacts.digest import sha256_bytes, sha256_file
from graylane.engine.signature import DECODER_INPUTS, DECODER_OUTPUT, IOSignature, TensorSpec

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


def io_signature(model: onnx.ModelProto) -> IOSignature:
    """Graph inputs (initializers excluded) and outputs."""
    return IOSignature.from_onnx(model)


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
