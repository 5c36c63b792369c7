"""A Llama-family decoder as an ONNX graph, written with ``onnx.helper`` (no torch).

The graph takes and gives exactly what Hugging Face Optimum's ``text-generation-with-past``
export of a Llama model does, so the worker serves it as it serves such an export
(:func:`graylane.engine_worker.layouts.kv_cache_layout`):

- in: ``input_ids`` ``[batch, seq]``, ``attention_mask`` ``[batch, past + seq]``,
  ``position_ids`` ``[batch, seq]``, ``past_key_values.N.key|value``
  ``[batch, kv_heads, past, head_dim]`` (all int64 / float32);
- out: ``logits`` ``[batch, seq, vocab]``, ``present.N.key|value``
  ``[batch, kv_heads, past + seq, head_dim]``.

What it computes is transformers' ``LlamaForCausalLM`` (eager attention), step by step:
RMSNorm (``x / sqrt(mean(x²) + eps) * w``, the form ONNX Runtime fuses), rotary position
embeddings in the half-rotation form (``x·cos + rotate_half(x)·sin``, frequencies
``base^(-2i/d)`` in float32 as transformers computes them), grouped-query attention,
SwiGLU feed-forward, a final RMSNorm and the output head (the embedding table itself
when tied). The mask combines the caller's ``attention_mask`` (padding and holes in the
cache) with causality by column: a query at column ``past + i`` sees columns up to it.

Grouped-query attention never copies the cache: with ``g = heads / kv_heads`` query
heads per KV head (head ``h`` reads KV head ``h // g``, transformers' ``repeat_kv``
order), the queries ``[b, heads, s, d]`` are viewed as ``[b, kv_heads, g·s, d]`` and
multiplied with the KV heads as they are.

Every projection is a ``MatMul`` with a constant ``[in, out]`` weight, the form ONNX
Runtime's weight-only quantizer (``MatMulNBits``) rewrites; the tied output head is a
``Gemm`` (``transB``) over the embedding table, so the table is stored once, and stays in
float under weight-only quantization.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "LlamaConfig",
    "build_llama_decoder",
    "head_node_name",
    "layer_of_node",
    "past_key_name",
    "past_value_name",
]

OPSET = 18
_MASK_AXIS = "past_sequence_length + sequence_length"
_NEG = -1.0e4
"""Added to the scores of columns a query must not see: far below any real score, yet
finite in float16 too (a fully masked padding row stays a number)."""


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """The shape of a Llama-family decoder (transformers' ``LlamaConfig`` names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{self.num_attention_heads} attention heads are not a multiple of "
                f"{self.num_key_value_heads} KV heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd: rotary embeddings need pairs")

    @property
    def groups(self) -> int:
        """Query heads per KV head."""
        return self.num_attention_heads // self.num_key_value_heads

    def hf_config(self) -> dict[str, Any]:
        """transformers' ``config.json`` for this shape."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "use_cache": True,
        }


Weights = Callable[[str], np.ndarray]
"""A weight by its transformers name (``model.layers.0.self_attn.q_proj.weight``), float32,
``[out, in]`` for projections."""


def past_key_name(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value_name(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def head_node_name() -> str:
    """The output head's node (kept in float by every weight-only rung)."""
    return "lm_head"


def layer_of_node(name: str) -> int | None:
    """The decoder layer a projection node belongs to (``layers.3.mlp.up_proj`` -> 3)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return None


class _Graph:
    """Nodes and initializers with unique, readable names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(
        self, op_type: str, inputs: Sequence[str], name: str, *, node: str = "", **attrs: Any
    ) -> str:
        self._count += 1
        out = f"{name}/{op_type}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=node or out, **attrs))
        return out

    def named(self, op_type: str, inputs: Sequence[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attrs))
        return output


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def build_llama_decoder(
    config: LlamaConfig, weights: Weights, *, metadata: dict[str, str] | None = None
) -> onnx.ModelProto:
    """The decoder-with-past graph of ``config`` with ``weights`` (see the module doc)."""
    g = _Graph()
    c = config
    f32 = np.float32
    one = g.const("const.one_i64", _i64(1))
    zero = g.const("const.zero_i64", _i64(0))
    g.const("const.axis_last", _i64(-1))
    g.const("const.eps", np.array(c.rms_norm_eps, dtype=f32))
    g.const("const.two", np.array(2.0, dtype=f32))
    g.const("const.neg", np.array(_NEG, dtype=f32))
    g.const("const.zero_f", np.array(0.0, dtype=f32))
    g.const("const.scale", np.array(1.0 / np.sqrt(c.head_dim), dtype=f32))
    g.const("shape.split_heads", _i64(0, 0, c.num_attention_heads, c.head_dim))
    g.const("shape.split_kv_heads", _i64(0, 0, c.num_key_value_heads, c.head_dim))
    g.const("shape.grouped", _i64(0, c.num_key_value_heads, -1, c.head_dim))
    g.const("shape.heads", _i64(0, c.num_attention_heads, -1, c.head_dim))
    g.const("shape.merge_heads", _i64(0, 0, c.num_attention_heads * c.head_dim))
    g.const("shape.rows", _i64(-1, c.hidden_size))
    g.const("repeats.groups", _i64(1, 1, c.groups, 1))

    # Embedding: the table is also the tied output head.
    table = g.const("model.embed_tokens.weight", weights("model.embed_tokens.weight"))
    hidden = g.op("Gather", [table, "input_ids"], "embed", axis=0)

    # Rotary tables for these positions: [b, 1, s, d] cos and sin (transformers' float32).
    inv_freq = 1.0 / (
        f32(c.rope_theta)
        ** (np.arange(0, c.head_dim, 2, dtype=np.int64).astype(f32) / f32(c.head_dim))
    )
    g.const("rope.inv_freq", inv_freq.astype(f32))
    positions = g.op("Cast", ["position_ids"], "rope", to=TensorProto.FLOAT)
    positions = g.op("Unsqueeze", [positions, "const.axis_last"], "rope")
    freqs = g.op("Mul", [positions, "rope.inv_freq"], "rope")
    angles = g.op("Concat", [freqs, freqs], "rope", axis=-1)
    angles = g.op("Unsqueeze", [angles, one], "rope")
    cos = g.op("Cos", [angles], "rope")
    sin = g.op("Sin", [angles], "rope")

    mask_bias = _mask_bias(g, c, one)
    for layer in range(c.num_hidden_layers):
        hidden = _block(g, c, weights, layer, hidden, cos, sin, mask_bias)

    hidden = _rms_norm(g, hidden, "model.norm", weights("model.norm.weight"))
    rows = g.op("Reshape", [hidden, "shape.rows"], "lm_head")
    if c.tie_word_embeddings:
        logits2d = g.op("Gemm", [rows, table], "lm_head", node=head_node_name(), transB=1)
    else:
        head = g.const("lm_head.weight", weights("lm_head.weight").T)
        logits2d = g.op("MatMul", [rows, head], "lm_head", node=head_node_name())
    out_shape = g.op(
        "Concat",
        [
            g.op(
                "Slice",
                [g.op("Shape", ["input_ids"], "lm_head"), zero, g.const("const.two_i64", _i64(2))],
                "lm_head",
            ),
            g.const("const.vocab", _i64(c.vocab_size)),
        ],
        "lm_head",
        axis=0,
    )
    g.named("Reshape", [logits2d, out_shape], "logits")
    return _model(g, c, metadata or {})


def _mask_bias(g: _Graph, c: LlamaConfig, one: str) -> str:
    """``[b, 1, g·s, total]``: 0 where a query may look, a large negative elsewhere."""
    scalar_zero = g.const("const.scalar_zero", np.array(0, dtype=np.int64))
    scalar_one = g.const("const.scalar_one", np.array(1, dtype=np.int64))
    ids_shape = g.op("Shape", ["input_ids"], "mask")
    seq = g.op("Gather", [ids_shape, scalar_one], "mask", axis=0)  # scalar s
    mask_shape = g.op("Shape", ["attention_mask"], "mask")
    total = g.op("Gather", [mask_shape, scalar_one], "mask", axis=0)  # scalar past + s
    past = g.op("Sub", [total, seq], "mask")
    columns = g.op("Range", [scalar_zero, total, scalar_one], "mask")  # [total]
    rows = g.op("Range", [past, total, scalar_one], "mask")  # [s]: each query's column
    rows = g.op("Unsqueeze", [rows, one], "mask")  # [s, 1]
    causal = g.op("LessOrEqual", [columns, rows], "mask")  # [s, total]
    keep = g.op("Cast", ["attention_mask"], "mask", to=TensorProto.BOOL)  # [b, total]
    keep = g.op("Unsqueeze", [keep, g.const("const.axes_1_2", _i64(1, 2))], "mask")
    allowed = g.op("And", [causal, keep], "mask")  # [b, 1, s, total]
    bias = g.op("Where", [allowed, "const.zero_f", "const.neg"], "mask")
    if c.groups > 1:
        bias = g.op("Tile", [bias, "repeats.groups"], "mask")  # [b, 1, g·s, total]
    return bias


def _rms_norm(g: _Graph, x: str, prefix: str, weight: np.ndarray) -> str:
    w = g.const(f"{prefix}.weight", weight.astype(np.float32))
    squared = g.op("Pow", [x, "const.two"], prefix)
    mean = g.op("ReduceMean", [squared, "const.axis_last"], prefix, keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [mean, "const.eps"], prefix)], prefix)
    return g.op("Mul", [g.op("Div", [x, root], prefix), w], prefix)


def _linear(g: _Graph, x: str, node: str, weight: np.ndarray) -> str:
    w = g.const(f"{node}.weight", np.ascontiguousarray(weight.T.astype(np.float32)))
    return g.op("MatMul", [x, w], node, node=node)


def _rotate(g: _Graph, x: str, cos: str, sin: str, prefix: str, half: int) -> str:
    """``x·cos + rotate_half(x)·sin`` on ``[b, heads, s, d]``."""
    first, second = f"{prefix}/first", f"{prefix}/second"
    g.nodes.append(
        helper.make_node(
            "Split",
            [x, g.const(f"{prefix}.split", _i64(half, half))],
            [first, second],
            name=f"{prefix}/Split",
            axis=-1,
        )
    )
    rotated = g.op("Concat", [g.op("Neg", [second], prefix), first], prefix, axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos], prefix), g.op("Mul", [rotated, sin], prefix)], prefix)


def _block(
    g: _Graph,
    c: LlamaConfig,
    weights: Weights,
    layer: int,
    hidden: str,
    cos: str,
    sin: str,
    mask_bias: str,
) -> str:
    hf = f"model.layers.{layer}"
    name = f"layers.{layer}"
    perm = [0, 2, 1, 3]
    x = _rms_norm(g, hidden, f"{name}.input_layernorm", weights(f"{hf}.input_layernorm.weight"))
    q = _linear(g, x, f"{name}.self_attn.q_proj", weights(f"{hf}.self_attn.q_proj.weight"))
    k = _linear(g, x, f"{name}.self_attn.k_proj", weights(f"{hf}.self_attn.k_proj.weight"))
    v = _linear(g, x, f"{name}.self_attn.v_proj", weights(f"{hf}.self_attn.v_proj.weight"))
    attn = f"{name}.attn"
    q = g.op("Transpose", [g.op("Reshape", [q, "shape.split_heads"], attn)], attn, perm=perm)
    k = g.op("Transpose", [g.op("Reshape", [k, "shape.split_kv_heads"], attn)], attn, perm=perm)
    v = g.op("Transpose", [g.op("Reshape", [v, "shape.split_kv_heads"], attn)], attn, perm=perm)
    half = c.head_dim // 2
    q = _rotate(g, q, cos, sin, f"{attn}.rope_q", half)
    k = _rotate(g, k, cos, sin, f"{attn}.rope_k", half)
    keys = g.named("Concat", [past_key_name(layer), k], f"present.{layer}.key", axis=2)
    values = g.named("Concat", [past_value_name(layer), v], f"present.{layer}.value", axis=2)
    grouped = g.op("Reshape", [q, "shape.grouped"], attn)  # [b, kv, g·s, d]
    scores = g.op("MatMul", [grouped, g.op("Transpose", [keys], attn, perm=[0, 1, 3, 2])], attn)
    scores = g.op("Add", [g.op("Mul", [scores, "const.scale"], attn), mask_bias], attn)
    probs = g.op("Softmax", [scores], attn, axis=-1)
    context = g.op("MatMul", [probs, values], attn)  # [b, kv, g·s, d]
    context = g.op("Reshape", [context, "shape.heads"], attn)  # [b, heads, s, d]
    context = g.op("Transpose", [context], attn, perm=perm)
    context = g.op("Reshape", [context, "shape.merge_heads"], attn)
    out = _linear(g, context, f"{name}.self_attn.o_proj", weights(f"{hf}.self_attn.o_proj.weight"))
    hidden = g.op("Add", [hidden, out], name)

    x = _rms_norm(
        g,
        hidden,
        f"{name}.post_attention_layernorm",
        weights(f"{hf}.post_attention_layernorm.weight"),
    )
    gate = _linear(g, x, f"{name}.mlp.gate_proj", weights(f"{hf}.mlp.gate_proj.weight"))
    up = _linear(g, x, f"{name}.mlp.up_proj", weights(f"{hf}.mlp.up_proj.weight"))
    mlp = f"{name}.mlp"
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], mlp)], mlp)
    down = _linear(
        g,
        g.op("Mul", [act, up], mlp),
        f"{name}.mlp.down_proj",
        weights(f"{hf}.mlp.down_proj.weight"),
    )
    return g.op("Add", [hidden, down], name)


def _model(g: _Graph, c: LlamaConfig, metadata: dict[str, str]) -> onnx.ModelProto:
    kv = c.num_key_value_heads
    d = c.head_dim
    inputs = [
        helper.make_tensor_value_info(
            "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", _MASK_AXIS]
        ),
        helper.make_tensor_value_info(
            "position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", c.vocab_size]
        )
    ]
    for layer in range(c.num_hidden_layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{layer}.{kind}",
                    TensorProto.FLOAT,
                    ["batch_size", kv, "past_sequence_length", d],
                )
            )
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{layer}.{kind}", TensorProto.FLOAT, ["batch_size", kv, _MASK_AXIS, d]
                )
            )
    graph = helper.make_graph(g.nodes, "llama-decoder", inputs, outputs, g.initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="graylane"
    )
    model.ir_version = 9
    helper.set_model_props(model, metadata)
    return model
