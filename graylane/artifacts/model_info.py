"""What an ONNX model declares: IO signature, metadata, task, input vocabulary, quantization,
and the tokenizer that travels with it.

A worker decides which tasks a model supports and which token ids it accepts from
a :class:`ModelInfo` (recorded in the artifact manifest by the builder, or read from
the ONNX metadata), never from output names: an output called ``logits`` says
nothing about the input vocabulary of a token tagger.

The ONNX readers (:func:`read_model_info`, :func:`source_quantization`) look at
metadata, the embedding table behind the token input, and weight initializers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import onnx

from graylane.engine.signature import IOSignature

__all__ = [
    "TASK_KEY",
    "TOKENIZER_FILE",
    "VOCAB_KEY",
    "ModelInfo",
    "ModelTask",
    "SourceQuantization",
    "TokenizerFile",
    "embedding_vocab",
    "eos_from_hf_configs",
    "io_signature",
    "load_header",
    "max_positions_from_hf_config",
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
_PAST_PREFIX = "past_key_values."
_ID_PASSING_OPS = {"Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten"}
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
    WEIGHT_ONLY_8BIT = "weight-only-8bit"
    """``MatMulNBits`` with 8-bit weights (ONNX Runtime's weight-only quantization)."""
    WEIGHT_ONLY_4BIT = "weight-only-4bit"
    """``MatMulNBits`` with 4-bit (or fewer) weights."""


TOKENIZER_FILE = "tokenizer.json"
"""The Hugging Face ``tokenizers`` file a transformers export ships beside its model."""


@dataclass(frozen=True)
class TokenizerFile:
    """The tokenizer an artifact carries: a file in its folder (listed in its manifest)."""

    file: str
    sha256: str
    eos_token_id: int | None = None
    """The model's end-of-sequence token (generation stops there unless a request says
    otherwise); ``None``: unknown."""

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "eos_token_id": self.eos_token_id}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TokenizerFile:
        eos = raw.get("eos_token_id")
        return cls(str(raw["file"]), str(raw["sha256"]), None if eos is None else int(eos))


@dataclass(frozen=True)
class ModelInfo:
    task: ModelTask = ModelTask.GENERIC
    vocab_size: int | None = None
    """Ids of ``token_input`` must lie in ``[0, vocab_size)``; ``None``: unknown."""
    token_input: str | None = None
    quantization: SourceQuantization = SourceQuantization.NONE
    tokenizer: TokenizerFile | None = None
    """Text in and out of the model (``None``: token ids only, or the demo's own bytes)."""
    max_seq_len: int | None = None
    """Positions the model has (prompt plus generated tokens); ``None``: not declared."""

    @property
    def generates(self) -> bool:
        return self.task is ModelTask.CAUSAL_LM

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "task": self.task.value,
            "vocab_size": self.vocab_size,
            "token_input": self.token_input,
            "quantization": self.quantization.value,
        }
        if self.tokenizer is not None:
            raw["tokenizer"] = self.tokenizer.to_dict()
        if self.max_seq_len is not None:
            raw["max_seq_len"] = self.max_seq_len
        return raw

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelInfo:
        vocab = raw.get("vocab_size")
        tokenizer = raw.get("tokenizer")
        return cls(
            task=ModelTask(raw.get("task", ModelTask.GENERIC.value)),
            vocab_size=None if vocab is None else int(vocab),
            token_input=raw.get("token_input"),
            quantization=SourceQuantization(raw.get("quantization", "none")),
            tokenizer=None if tokenizer is None else TokenizerFile.from_dict(tokenizer),
            max_seq_len=None if raw.get("max_seq_len") is None else int(raw["max_seq_len"]),
        )


def eos_from_hf_configs(folder: Path, tokenizer: Path | None = None) -> int | None:
    """The end-of-sequence id a transformers export declares in ``folder``, if any.

    ``generation_config.json`` first (what ``generate`` stops on), then ``config.json``;
    a list of ids gives its first. Else the ``eos_token`` of ``tokenizer_config.json``
    looked up in ``tokenizer`` (a ``tokenizer.json``).
    """
    for name in ("generation_config.json", "config.json"):
        raw = _json_file(folder / name).get("eos_token_id")
        if isinstance(raw, list) and raw:
            raw = raw[0]
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            return raw
    token = _json_file(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(token, Mapping):
        token = token.get("content")
    if isinstance(token, str) and tokenizer is not None and tokenizer.is_file():
        added = _json_file(tokenizer).get("added_tokens", [])
        for entry in added if isinstance(added, list) else []:
            if isinstance(entry, Mapping) and entry.get("content") == token:
                found = entry.get("id")
                return found if isinstance(found, int) else None
    return None


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def max_positions_from_hf_config(folder: Path) -> int | None:
    """The positions a transformers model has, from the ``config.json`` in ``folder``.

    ``max_position_embeddings`` (Llama and most), ``n_positions`` / ``n_ctx`` (GPT-2).
    """
    config = _json_file(folder / "config.json")
    for key in _POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _json_file(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, Mapping) else {}


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
    """Rows of the embedding table the token input indexes (``Gather(table, ids)``), if any.

    The ids may pass through ops that only reshape or retype them first (transformers'
    GPT-2 flattens them with a ``Reshape``), and the ``Gather`` may sit in a subgraph
    (a merged decoder's branches) reading the outer graph's table.
    """
    graphs = _graphs(model.graph)
    tables = {i.name: i for g in graphs for i in g.initializer}
    nodes = [n for g in graphs for n in g.node]
    ids = {token_input}
    grown = True
    while grown:
        grown = False
        for node in nodes:
            if node.op_type in _ID_PASSING_OPS and node.input and node.input[0] in ids:
                new = set(node.output) - ids
                ids |= new
                grown = grown or bool(new)
    for node in nodes:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ids:
            table = tables.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph of its nodes (``If`` branches, loop bodies), depth first."""
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for sub in subgraphs:
                found.extend(_graphs(sub))
    return found


def source_quantization(model: onnx.ModelProto) -> SourceQuantization:
    """Whether the graph is already quantized, and how (reads op types and initializer types).

    Subgraphs count: a merged decoder holds all its compute in the branches of an ``If``.
    """
    graphs = _graphs(model.graph)
    nodes = [n for g in graphs for n in g.node]
    ops = {n.op_type for n in nodes}
    if ops & _DYNAMIC_OPS:
        return SourceQuantization.DYNAMIC
    if ops & _QLINEAR_OPS:
        return SourceQuantization.QOPERATOR
    nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
    if nbits:
        bits = min(_int_attribute(n, "bits", 4) for n in nbits)
        return (
            SourceQuantization.WEIGHT_ONLY_8BIT
            if bits >= 8
            else SourceQuantization.WEIGHT_ONLY_4BIT
        )
    int8_weights = {i.name for g in graphs for i in g.initializer if i.data_type in _INT8_TYPES}
    if any(n.op_type == "DequantizeLinear" and n.input[0] in int8_weights for n in nodes):
        return SourceQuantization.QDQ
    return SourceQuantization.NONE


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


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
    the ids. Without a declared task, a decoder exported with a KV cache
    (``past_key_values.*`` inputs, as transformers/Optimum write them) is a
    :attr:`ModelTask.CAUSAL_LM`, any other model :attr:`ModelTask.GENERIC`.
    """
    props = {p.key: p.value for p in model.metadata_props}
    meta_task, meta_vocab = _declared(props)
    token_input = token_input_name(model)
    vocab = vocab_size or meta_vocab
    if vocab is None and token_input is not None:
        vocab = embedding_vocab(model, token_input)
    cached = token_input is not None and any(
        v.name.startswith(_PAST_PREFIX) for v in model.graph.input
    )
    return ModelInfo(
        task=task or meta_task or (ModelTask.CAUSAL_LM if cached else ModelTask.GENERIC),
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
