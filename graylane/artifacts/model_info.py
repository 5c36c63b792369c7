"""What an ONNX model declares: IO signature, metadata, task, input vocabulary, quantization.

A worker decides which tasks a model supports and which token ids it accepts from
a :class:`ModelInfo` (recorded in the artifact manifest by the builder, or read from
the ONNX metadata), never from output names: an output called ``logits`` says
nothing about the input vocabulary of a token tagger.

The ONNX readers (:func:`read_model_info`, :func:`source_quantization`) look at
metadata, the embedding table behind the token input, and weight initializers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import onnx

from graylane.engine.signature import IOSignature

__all__ = [
    "TASK_KEY",
    "VOCAB_KEY",
    "ModelInfo",
    "ModelTask",
    "SourceQuantization",
    "embedding_vocab",
    "io_signature",
    "load_header",
    "metadata_int",
    "read_model_info",
    "source_quantization",
    "token_input_name",
]

TASK_KEY = "graylane.task"
"""ONNX ``metadata_props`` key declaring the task (a :class:`ModelTask` value)."""
VOCAB_KEY = "graylane.vocab_size"
"""ONNX ``metadata_props`` key declaring the size of the token input's vocabulary."""
_DEMO_PREFIX = "graylane.demo."
"""The demo GPT records itself under this prefix: a causal LM with a declared vocabulary."""
_TOKEN_INPUT = "input_ids"
_QLINEAR_OPS = {"QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul", "QGemm"}
_DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul"}
_INT8_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}


class ModelTask(Enum):
    """What requests a model can serve."""

    CAUSAL_LM = "causal-lm"
    """Next-token logits: forward and greedy generation."""
    TOKEN_CLASSIFICATION = "token-classification"
    """One label distribution per input token: forward only."""
    GENERIC = "generic"
    """Any tensors in, tensors out: forward only."""


class SourceQuantization(Enum):
    """How the source ONNX graph was already quantized before the build."""

    NONE = "none"
    QDQ = "qdq"
    """``DequantizeLinear`` on int8 weights (static QDQ, or weight-only)."""
    QOPERATOR = "qoperator"
    """``QLinear*`` operators on int8 tensors."""
    DYNAMIC = "dynamic"
    """``DynamicQuantizeLinear`` / ``MatMulInteger``: activations quantized at run time."""


@dataclass(frozen=True)
class ModelInfo:
    task: ModelTask = ModelTask.GENERIC
    vocab_size: int | None = None
    """Ids of ``token_input`` must lie in ``[0, vocab_size)``; ``None``: unknown."""
    token_input: str | None = None
    quantization: SourceQuantization = SourceQuantization.NONE

    @property
    def generates(self) -> bool:
        return self.task is ModelTask.CAUSAL_LM

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.value,
            "vocab_size": self.vocab_size,
            "token_input": self.token_input,
            "quantization": self.quantization.value,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelInfo:
        vocab = raw.get("vocab_size")
        return cls(
            task=ModelTask(raw.get("task", ModelTask.GENERIC.value)),
            vocab_size=None if vocab is None else int(vocab),
            token_input=raw.get("token_input"),
            quantization=SourceQuantization(raw.get("quantization", "none")),
        )


def token_input_name(model: onnx.ModelProto) -> str | None:
    """``input_ids`` if the graph takes it, else its only rank-2 integer input, else ``None``."""
    initializers = {i.name for i in model.graph.initializer}
    candidates = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        t = value.type.tensor_type
        if t.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and (
            len(t.shape.dim) == 2
        ):
            candidates.append(value.name)
    if _TOKEN_INPUT in candidates:
        return _TOKEN_INPUT
    return candidates[0] if len(candidates) == 1 else None


def embedding_vocab(model: onnx.ModelProto, token_input: str) -> int | None:
    """Rows of the embedding table the token input indexes (``Gather(table, ids)``), if any."""
    tables = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == token_input:
            table = tables.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def source_quantization(model: onnx.ModelProto) -> SourceQuantization:
    """Whether the graph is already quantized, and how (reads op types and initializer types)."""
    ops = {n.op_type for n in model.graph.node}
    if ops & _DYNAMIC_OPS:
        return SourceQuantization.DYNAMIC
    if ops & _QLINEAR_OPS:
        return SourceQuantization.QOPERATOR
    int8_weights = {i.name for i in model.graph.initializer if i.data_type in _INT8_TYPES}
    if any(
        n.op_type == "DequantizeLinear" and n.input[0] in int8_weights for n in model.graph.node
    ):
        return SourceQuantization.QDQ
    return SourceQuantization.NONE


def _declared(props: Mapping[str, str]) -> tuple[ModelTask | None, int | None]:
    task: ModelTask | None = None
    if TASK_KEY in props:
        try:
            task = ModelTask(props[TASK_KEY])
        except ValueError:
            task = None
    elif any(k.startswith(_DEMO_PREFIX) for k in props):
        task = ModelTask.CAUSAL_LM
    raw_vocab = props.get(VOCAB_KEY, props.get(_DEMO_PREFIX + "vocab_size", ""))
    vocab = int(raw_vocab) if raw_vocab.isdigit() and int(raw_vocab) > 0 else None
    return task, vocab


def read_model_info(
    model: onnx.ModelProto, *, task: ModelTask | None = None, vocab_size: int | None = None
) -> ModelInfo:
    """The model's info: ``task``/``vocab_size`` given by a spec win over the ONNX metadata.

    Without a declared vocabulary, the embedding table behind the token input bounds
    the ids. Without a declared task, the model is :attr:`ModelTask.GENERIC`.
    """
    props = {p.key: p.value for p in model.metadata_props}
    meta_task, meta_vocab = _declared(props)
    token_input = token_input_name(model)
    vocab = vocab_size or meta_vocab
    if vocab is None and token_input is not None:
        vocab = embedding_vocab(model, token_input)
    return ModelInfo(
        task=task or meta_task or ModelTask.GENERIC,
        vocab_size=vocab if token_input is not None else None,
        token_input=token_input,
        quantization=source_quantization(model),
    )


# -- reading an ONNX file: IO signature, metadata, header


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
