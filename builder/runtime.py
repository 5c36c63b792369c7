"""The builder's handle on the one ONNX Runtime adapter (:mod:`graylane.engine.onnxruntime`).

Validation, fp16 kernel probing and ``graylane bench variants`` run a variant
through exactly the session configuration a worker serves it with.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from graylane.engine.derived_inputs import derived_feeds, derived_input_names
from graylane.engine.errors import EngineError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.signature import DECODER_INPUTS, IOSignature

__all__ = [
    "OrtRunner",
    "VariantLoadError",
    "activations_per_prompt",
    "complete_feeds",
    "derived_inputs",
    "open_runner",
]

_IDS, _MASK = DECODER_INPUTS

VariantLoadError = EngineError
"""ONNX Runtime cannot load or run a variant on this machine (any engine error)."""


@dataclass(frozen=True)
class OrtRunner:
    """A loaded variant; call it with feeds to get named outputs."""

    engine: OnnxRuntimeEngine
    path: Path

    @property
    def derived_inputs(self) -> tuple[str, ...]:
        return derived_inputs(self.engine.io)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.run(complete_feeds(self.engine.io, feeds))


def derived_inputs(io: IOSignature) -> tuple[str, ...]:
    """Inputs of a token model that samples never carry: the worker derives them.

    ``position_ids`` (from the mask) and, for a decoder with past inputs, the past and
    ``use_cache_branch`` (:mod:`graylane.engine.derived_inputs`).
    """
    return derived_input_names(io)


def complete_feeds(io: IOSignature, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` plus each derived input they lack, filled as the worker fills it.

    With an empty past a decoder-with-past model is a plain forward over
    ``input_ids`` (a merged decoder runs its first-pass branch), and positions
    follow the attention mask, so samples and greedy checks made for the plain form
    fit it and see what a worker's forward pass sees.
    """
    full = dict(feeds)
    ids = full.get(_IDS)
    if ids is None or not derived_inputs(io):
        return full
    mask = full.get(_MASK)
    if mask is None:
        mask = np.ones(np.shape(ids), dtype=np.int64)
    for name, value in derived_feeds(io, np.asarray(mask)).items():
        full.setdefault(name, value)
    return full


def open_runner(path: Path, threads: int | None = None) -> OrtRunner:
    """Load ``path`` as the worker would (same session options and providers).

    The variant label is the folder name: variants are written to ``<work>/<precision>/``.
    """
    engine = OnnxRuntimeEngine.load(path, path.parent.name, intra_op_threads=threads)
    return OrtRunner(engine=engine, path=path)


def activations_per_prompt(
    model: onnx.ModelProto, activations: Sequence[str], prompts: Sequence[Sequence[int]]
) -> Iterator[dict[str, np.ndarray]]:
    """The named intermediate tensors of ``model``, one dict per prompt (token ids, one
    forward each, run as a worker runs the model): what calibration folds over (maxima
    for smoothing, ``X^T X`` for GPTQ), one prompt's worth held at a time."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in activations:
        probe.graph.output.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        )
    with tempfile.TemporaryDirectory(prefix="graylane-activations-") as tmp:
        path = Path(tmp) / "probe" / "model.onnx"
        path.parent.mkdir()
        onnx.save_model(probe, str(path), save_as_external_data=True)
        del probe
        runner = open_runner(path, threads=None)
        for ids in prompts:
            feed = np.asarray([list(ids)], dtype=np.int64)
            out = runner({_IDS: feed, _MASK: np.ones_like(feed)})
            yield {name: out[name] for name in activations}
        del runner
