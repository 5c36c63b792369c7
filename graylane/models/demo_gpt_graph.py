"""The demo GPT's ONNX graph writer: one private helper per transformer block.

Builds the graph for :func:`graylane.models.demo_gpt.build_demo_gpt`, in the plain
form (``input_ids`` + ``attention_mask`` -> ``logits``) or the decoder-with-past form
(``past_key_values.{i}.key|value`` in, ``present.{i}.key|value`` out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graylane.models.demo_gpt import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    MASK_BIAS,
    GptConfig,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

_NEG = -1.0e4

__all__ = ["build_graph"]


class _Graph:
    """Collects nodes and initializers with unique, readable names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        self._count += 1
        out = f"{name}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out


class _Weights:
    """Draws parameters in a fixed order from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return self._rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _linear(g: _Graph, w: _Weights, x: str, prefix: str, d_in: int, d_out: int, std: float) -> str:
    weight = g.const(f"{prefix}.weight", w.normal((d_in, d_out), std))
    bias = g.const(f"{prefix}.bias", np.zeros(d_out, dtype=np.float32))
    return g.op("Add", [g.op("MatMul", [x, weight], f"{prefix}.matmul"), bias], f"{prefix}.add")


def _layer_norm(g: _Graph, x: str, prefix: str, d: int, eps: float) -> str:
    scale = g.const(f"{prefix}.weight", np.ones(d, dtype=np.float32))
    bias = g.const(f"{prefix}.bias", np.zeros(d, dtype=np.float32))
    return g.op("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=eps)


def _attention(
    g: _Graph, w: _Weights, cfg: GptConfig, x: str, bias: str, prefix: str, layer: int | None
) -> str:
    """Self-attention; with ``layer`` it reads that layer's past keys/values and writes present."""
    d, h, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
    qkv = _linear(g, w, x, f"{prefix}.qkv", d, 3 * d, cfg.weight_std)
    split = g.const(f"{prefix}.split", _i64(d, d, d))
    names = [f"{prefix}.{part}" for part in ("q", "k", "v")]
    g.nodes.append(helper.make_node("Split", [qkv, split], names, name=f"{prefix}.split", axis=-1))
    heads = g.const(f"{prefix}.heads_shape", _i64(0, 0, h, hd))
    q = g.op(
        "Transpose",
        [g.op("Reshape", [names[0], heads], f"{prefix}.q4")],
        f"{prefix}.qt",
        perm=[0, 2, 1, 3],
    )
    if layer is None:
        k = g.op(
            "Transpose",
            [g.op("Reshape", [names[1], heads], f"{prefix}.k4")],
            f"{prefix}.kt",
            perm=[0, 2, 3, 1],
        )
        v = g.op(
            "Transpose",
            [g.op("Reshape", [names[2], heads], f"{prefix}.v4")],
            f"{prefix}.vt",
            perm=[0, 2, 1, 3],
        )
    else:
        k, v = _cached_kv(g, names[1], names[2], heads, prefix, layer)
    scale = g.const(f"{prefix}.scale", np.array(1.0 / math.sqrt(hd), dtype=np.float32))
    scores = g.op("Mul", [g.op("MatMul", [q, k], f"{prefix}.qk"), scale], f"{prefix}.scaled")
    probs = g.op(
        "Softmax", [g.op("Add", [scores, bias], f"{prefix}.masked")], f"{prefix}.probs", axis=-1
    )
    ctx = g.op(
        "Transpose",
        [g.op("MatMul", [probs, v], f"{prefix}.ctx")],
        f"{prefix}.ctxt",
        perm=[0, 2, 1, 3],
    )
    merged = g.op(
        "Reshape", [ctx, g.const(f"{prefix}.merge_shape", _i64(0, 0, d))], f"{prefix}.merge"
    )
    return _linear(g, w, merged, f"{prefix}.out", d, d, cfg.weight_std)


def _cached_kv(g: _Graph, k: str, v: str, heads: str, prefix: str, layer: int) -> tuple[str, str]:
    """Keys [b, h, hd, past+seq] and values [b, h, past+seq, hd] including the past.

    ``present.*`` are Identity copies of the concatenated tensors, so no graph
    output is also consumed inside the graph (float16 conversion with kept IO
    types cannot handle that).
    """
    k4 = g.op("Reshape", [k, heads], f"{prefix}.k4")
    new_k = g.op("Transpose", [k4], f"{prefix}.kh", perm=[0, 2, 1, 3])
    v4 = g.op("Reshape", [v, heads], f"{prefix}.v4")
    new_v = g.op("Transpose", [v4], f"{prefix}.vh", perm=[0, 2, 1, 3])
    full: list[str] = []
    for past, new, present in (
        (past_key_name(layer), new_k, present_key_name(layer)),
        (past_value_name(layer), new_v, present_value_name(layer)),
    ):
        joined = g.op("Concat", [past, new], f"{prefix}.cat", axis=2)
        g.nodes.append(helper.make_node("Identity", [joined], [present], name=present))
        full.append(joined)
    keys = g.op("Transpose", [full[0]], f"{prefix}.kt", perm=[0, 1, 3, 2])
    return keys, full[1]


def _mlp(g: _Graph, w: _Weights, cfg: GptConfig, x: str, prefix: str) -> str:
    up = _linear(g, w, x, f"{prefix}.fc_in", cfg.d_model, cfg.d_mlp, cfg.weight_std)
    # Exact GELU: 0.5 * x * (1 + erf(x / sqrt(2))).
    inv_sqrt2 = g.const(f"{prefix}.inv_sqrt2", np.array(1.0 / math.sqrt(2.0), dtype=np.float32))
    one = g.const(f"{prefix}.one", np.array(1.0, dtype=np.float32))
    half = g.const(f"{prefix}.half", np.array(0.5, dtype=np.float32))
    erf = g.op("Erf", [g.op("Mul", [up, inv_sqrt2], f"{prefix}.gelu_div")], f"{prefix}.gelu_erf")
    gate = g.op("Mul", [g.op("Add", [erf, one], f"{prefix}.gelu_add"), half], f"{prefix}.gelu_half")
    act = g.op("Mul", [up, gate], f"{prefix}.gelu")
    return _linear(g, w, act, f"{prefix}.fc_out", cfg.d_mlp, cfg.d_model, cfg.weight_std)


def _attention_bias(g: _Graph, cfg: GptConfig, seq: str) -> str:
    """Additive bias [batch, 1, seq, seq]: causal part plus masked (padded) keys."""
    causal = np.triu(np.full((cfg.max_seq_len, cfg.max_seq_len), _NEG, dtype=np.float32), k=1)
    g.const(MASK_BIAS, causal)
    seq2 = g.op("Concat", [seq, seq], "mask.seq2", axis=0)
    causal_s = g.op(
        "Slice",
        [MASK_BIAS, g.const("mask.starts", _i64(0, 0)), seq2, g.const("mask.axes", _i64(0, 1))],
        "mask.causal",
    )
    keep = g.op("Cast", [ATTENTION_MASK], "mask.float", to=TensorProto.FLOAT)
    one = g.const("mask.one", np.array(1.0, dtype=np.float32))
    neg = g.const("mask.neg", np.array(_NEG, dtype=np.float32))
    pad = g.op("Mul", [g.op("Sub", [one, keep], "mask.pad"), neg], "mask.pad_bias")
    pad4 = g.op("Unsqueeze", [pad, g.const("mask.axes12", _i64(1, 2))], "mask.pad4")
    return g.op("Add", [causal_s, pad4], "mask.bias")


def _cached_positions_and_bias(g: _Graph, seq: str) -> tuple[str, str]:
    """Positions [batch, seq] and additive bias [batch, 1, seq, total] for the cached graph.

    ``attention_mask`` covers past and new tokens ([batch, total]); a token's
    position is the number of real tokens before it, so a batch whose rows have
    different past lengths (padded, with holes) still gives each token its own
    position. The causal part works on columns: new token ``i`` sits at column
    ``total - seq + i`` and sees every column up to its own.
    """
    total = g.op(
        "Slice",
        [
            g.op("Shape", [ATTENTION_MASK], "cache.mask_shape"),
            g.const("cache.one_i", _i64(1)),
            g.const("cache.two_i", _i64(2)),
        ],
        "cache.total",
    )
    start = g.op("Sub", [total, seq], "cache.past_len")
    axis1 = g.const("cache.axis1", np.array(1, np.int64))
    counted = g.op("CumSum", [ATTENTION_MASK, axis1], "cache.cumsum")
    before = g.op("Sub", [counted, g.const("cache.one", _i64(1))], "cache.before")
    new_pos = g.op(
        "Slice", [before, start, total, g.const("cache.slice_axis", _i64(1))], "cache.new_positions"
    )
    positions = g.op("Max", [new_pos, g.const("cache.zero", _i64(0))], "cache.positions")

    scalar = g.const("cache.scalar_axes", _i64(0))
    start_s = g.op("Squeeze", [start, scalar], "cache.start_scalar")
    total_s = g.op("Squeeze", [total, scalar], "cache.total_scalar")
    step = g.const("cache.step", np.array(1, np.int64))
    queries = g.op("Range", [start_s, total_s, step], "cache.query_cols")
    zero = g.const("cache.zero_s", np.array(0, np.int64))
    keys = g.op("Range", [zero, total_s, step], "cache.key_cols")
    future = g.op(
        "Greater",
        [
            g.op("Unsqueeze", [keys, g.const("cache.axes0", _i64(0))], "cache.keys_row"),
            g.op("Unsqueeze", [queries, g.const("cache.axes1", _i64(1))], "cache.queries_col"),
        ],
        "cache.future",
    )
    causal = g.op(
        "Where",
        [
            future,
            g.const("cache.neg", np.array(_NEG, dtype=np.float32)),
            g.const("cache.zero_f", np.array(0.0, dtype=np.float32)),
        ],
        "cache.causal",
    )
    keep = g.op("Cast", [ATTENTION_MASK], "mask.float", to=TensorProto.FLOAT)
    one = g.const("mask.one", np.array(1.0, dtype=np.float32))
    neg = g.const("mask.neg", np.array(_NEG, dtype=np.float32))
    pad = g.op("Mul", [g.op("Sub", [one, keep], "mask.pad"), neg], "mask.pad_bias")
    pad4 = g.op("Unsqueeze", [pad, g.const("mask.axes12", _i64(1, 2))], "mask.pad4")
    return positions, g.op("Add", [causal, pad4], "mask.bias")


def _cache_io(cfg: GptConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Past inputs and present outputs, [batch, heads, past_seq | total_seq, head_dim]."""
    past: list[onnx.ValueInfoProto] = []
    present: list[onnx.ValueInfoProto] = []
    for layer in range(cfg.n_layers):
        for name in (past_key_name(layer), past_value_name(layer)):
            past.append(
                helper.make_tensor_value_info(
                    name, TensorProto.FLOAT, ["batch", cfg.n_heads, "past_seq", cfg.head_dim]
                )
            )
        for name in (present_key_name(layer), present_value_name(layer)):
            present.append(
                helper.make_tensor_value_info(
                    name, TensorProto.FLOAT, ["batch", cfg.n_heads, "total_seq", cfg.head_dim]
                )
            )
    return past, present


def build_graph(cfg: GptConfig, seed: int, kv_cache: bool = False) -> onnx.GraphProto:
    g = _Graph()
    w = _Weights(seed)
    d = cfg.d_model
    wte = g.const("wte", w.normal((cfg.vocab_size, d), cfg.token_embedding_std))
    wpe = g.const("wpe", w.normal((cfg.max_seq_len, d), cfg.position_embedding_std))

    shape = g.op("Shape", [INPUT_IDS], "seq.shape")
    seq = g.op(
        "Slice",
        [shape, g.const("seq.start", _i64(1)), g.const("seq.end", _i64(2))],
        "seq.len",
    )
    tok = g.op("Gather", [wte, INPUT_IDS], "embed.tokens", axis=0)
    if kv_cache:
        positions, bias = _cached_positions_and_bias(g, seq)
        pos = g.op("Gather", [wpe, positions], "embed.positions", axis=0)
    else:
        pos = g.op(
            "Slice",
            [wpe, g.const("embed.start", _i64(0)), seq, g.const("embed.axis", _i64(0))],
            "embed.positions",
        )
    x = g.op("Add", [tok, pos], "embed")
    if not kv_cache:
        bias = _attention_bias(g, cfg, seq)

    for layer in range(cfg.n_layers):
        p = f"h{layer}"
        attn = _attention(
            g,
            w,
            cfg,
            _layer_norm(g, x, f"{p}.ln_1", d, cfg.layer_norm_eps),
            bias,
            f"{p}.attn",
            layer if kv_cache else None,
        )
        x = g.op("Add", [x, attn], f"{p}.resid_attn")
        mlp = _mlp(g, w, cfg, _layer_norm(g, x, f"{p}.ln_2", d, cfg.layer_norm_eps), f"{p}.mlp")
        x = g.op("Add", [x, mlp], f"{p}.resid_mlp")

    x = _layer_norm(g, x, "ln_f", d, cfg.layer_norm_eps)
    head_std = 1.0 / math.sqrt(d)
    head = g.const("lm_head.weight", w.normal((d, cfg.vocab_size), head_std))
    head_bias = g.const("lm_head.bias", np.zeros(cfg.vocab_size, dtype=np.float32))
    hidden = g.op("MatMul", [x, head], "lm_head.matmul")
    g.nodes.append(helper.make_node("Add", [hidden, head_bias], [LOGITS], name="lm_head.add"))

    mask_len = "total_seq" if kv_cache else "seq"
    inputs = [
        helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, ["batch", mask_len]),
    ]
    outputs = [
        helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["batch", "seq", cfg.vocab_size])
    ]
    name = f"graylane_demo_gpt_{cfg.size.value}"
    if kv_cache:
        past, present = _cache_io(cfg)
        inputs += past
        outputs += present
        name += "_with_past"
    return helper.make_graph(g.nodes, name, inputs, outputs, g.initializers)
