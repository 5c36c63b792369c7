"""Loading engine variants: from explicit ONNX paths, or through the registry."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnx

from graylane.artifacts.model_info import ModelInfo, read_model_info
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine

MAX_SEQ_KEYS = ("graylane.demo.max_seq_len", "max_seq_len", "graylane.max_seq_len")


def load_from_paths(
    paths: Mapping[str, Path], *, model: str, intra_op_threads: int | None = None
) -> dict[str, InferenceEngine]:
    """One ONNX Runtime engine per named variant file."""
    return {
        variant: OnnxRuntimeEngine.load(
            path, variant, name=model, intra_op_threads=intra_op_threads
        )
        for variant, path in paths.items()
    }


def onnx_max_seq_len(path: Path) -> int | None:
    """The maximum sequence length recorded in an ONNX file's metadata, if any."""
    proto = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    for key in MAX_SEQ_KEYS:
        if key in meta and meta[key].isdigit():
            return int(meta[key])
    return None


def onnx_model_info(path: Path) -> ModelInfo:
    """Task and input vocabulary an ONNX file declares in its metadata (or its embedding)."""
    return read_model_info(onnx.load(str(path), load_external_data=False))
