"""ONNX Runtime sessions for building, validating and benchmarking variants (CPU)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

__all__ = ["OrtRunner", "VariantLoadError", "cache_inputs", "empty_past", "open_runner"]


class VariantLoadError(RuntimeError):
    """ONNX Runtime cannot load or run a variant on this machine."""


@dataclass(frozen=True)
class OrtRunner:
    """A loaded session; call it with feeds to get named outputs."""

    session: ort.InferenceSession
    path: Path

    @property
    def cache_inputs(self) -> dict[str, tuple[int, int, str]]:
        types = {"tensor(float16)": "float16", "tensor(float)": "float32"}
        return cache_inputs(
            [(a.name, a.shape, types.get(a.type, "float32")) for a in self.session.get_inputs()]
        )

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        try:
            values = self.session.run(names, empty_past(feeds, self.cache_inputs))
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise VariantLoadError(f"{self.path.name}: inference failed: {exc}") from None
        return {n: np.asarray(v) for n, v in zip(names, values, strict=True)}


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
    """Open ``path`` on the CPU execution provider with quiet logging."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    try:
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise VariantLoadError(f"{path.name}: ONNX Runtime cannot load it: {exc}") from None
    return OrtRunner(session=session, path=path)
