"""The builder's handle on the one ONNX Runtime adapter (:mod:`graylane.engine.onnxruntime`).

Validation, fp16 kernel probing and ``graylane bench variants`` run a variant
through exactly the session configuration a worker serves it with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.engine.errors import EngineError
from graylane.engine.onnxruntime import OnnxRuntimeEngine

__all__ = ["OrtRunner", "VariantLoadError", "cache_inputs", "empty_past", "open_runner"]

VariantLoadError = EngineError
"""ONNX Runtime cannot load or run a variant on this machine (any engine error)."""


@dataclass(frozen=True)
class OrtRunner:
    """A loaded variant; call it with feeds to get named outputs."""

    engine: OnnxRuntimeEngine
    path: Path

    @property
    def cache_inputs(self) -> dict[str, tuple[int, int, str]]:
        return cache_inputs([(t.name, t.shape, t.dtype.name) for t in self.engine.io.inputs])

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.run(empty_past(feeds, self.cache_inputs))


def empty_past(
    feeds: Mapping[str, np.ndarray], cache_inputs: Mapping[str, tuple[int, int, str]]
) -> dict[str, np.ndarray]:
    """``feeds`` plus an empty past for each missing ``past_key_values.*`` input.

    ``cache_inputs`` maps each such input to (heads, head_dim, numpy dtype name).
    With a past of length 0 a decoder-with-past model is a plain forward over
    ``input_ids``, so samples and greedy checks made for the plain form fit it.
    """
    full = dict(feeds)
    ids = full.get("input_ids")
    if ids is None:
        return full
    for name, (heads, head_dim, dtype) in cache_inputs.items():
        if name not in full:
            full[name] = np.zeros((ids.shape[0], heads, 0, head_dim), dtype=dtype)
    return full


def cache_inputs(
    inputs: Sequence[tuple[str, Sequence[object], str]],
) -> dict[str, tuple[int, int, str]]:
    """Fixed (heads, head_dim, dtype) of each ``past_key_values.*`` among (name, shape, dtype)."""
    found: dict[str, tuple[int, int, str]] = {}
    for name, shape, dtype in inputs:
        if name.startswith("past_key_values.") and len(shape) == 4:
            heads, head_dim = shape[1], shape[3]
            if isinstance(heads, int) and isinstance(head_dim, int):
                found[name] = (heads, head_dim, dtype)
    return found


def open_runner(path: Path, threads: int | None = None) -> OrtRunner:
    """Load ``path`` as the worker would (same session options and providers).

    The variant label is the folder name: variants are written to ``<work>/<precision>/``.
    """
    engine = OnnxRuntimeEngine.load(path, path.parent.name, intra_op_threads=threads)
    return OrtRunner(engine=engine, path=path)
