"""A small GPT-style decoder written straight to ONNX from seeded random weights.

The model is untrained: it exists so that the whole pipeline (builder, worker,
batching, rollouts, QoS) can run end to end on a real transformer graph without
downloading anything. Its weights are drawn from ``numpy.random.default_rng(seed)``
so the same (size, seed) gives the same bytes on the same numpy version.

Graph contract:

- inputs ``input_ids`` int64 [batch, seq] and ``attention_mask`` int64
  [batch, seq] (1 = real token, 0 = padding, padding on the right);
- output ``logits`` float32 [batch, seq, vocab];
- causal self-attention; keys whose mask is 0 are never attended to, so a
  padded row gives the same logits at its real positions as the unpadded row;
- ``seq`` must not exceed ``max_seq_len`` (recorded in ``metadata_props``).

Vocabulary: the 256 byte values, then ``BOS_ID`` and ``EOS_ID``.

Kept as one module (about 400 lines) on purpose: the config, the byte tokenizer and
the graph writer describe one model and change together (a new size or layer touches
all three), and most of the length is the graph writer, one private helper per block.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BYTE_VOCAB = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = EOS_ID
"""Padding id; any id works because padded keys are masked, EOS is the usual choice."""
VOCAB_SIZE = 258
SPECIAL_IDS = frozenset({BOS_ID, EOS_ID})

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"


def past_key_name(layer: int) -> str:
    """Cache input of ``layer`` (Hugging Face Optimum naming)."""
    return f"past_key_values.{layer}.key"


def past_value_name(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key_name(layer: int) -> str:
    """Cache output of ``layer``: the past keys followed by this call's keys."""
    return f"present.{layer}.key"


def present_value_name(layer: int) -> str:
    return f"present.{layer}.value"


OPSET = 17
IR_VERSION = 8
PRODUCER = "graylane.demo"
META_PREFIX = "graylane.demo."
_MASK_BIAS = "causal_mask_bias"
_NEG = -1.0e4
"""Additive mask value: large enough to zero a softmax term in float32, finite in float16."""


class DemoSize(Enum):
    TINY = "tiny"
    SMALL = "small"


class DemoModelError(ValueError):
    """A demo model could not be configured or its metadata could not be read."""


@dataclass(frozen=True, kw_only=True)
class GptConfig:
    """Shape of a demo decoder; the weights come from the seed."""

    size: DemoSize
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    mlp_ratio: int = 4
    vocab_size: int = VOCAB_SIZE
    layer_norm_eps: float = 1e-5
    token_embedding_std: float = 1.0
    position_embedding_std: float = 0.5
    weight_std: float = 0.02

    def __post_init__(self) -> None:
        if min(self.d_model, self.n_layers, self.n_heads, self.max_seq_len, self.mlp_ratio) < 1:
            raise DemoModelError(f"every dimension must be positive: {self}")
        if self.d_model % self.n_heads:
            raise DemoModelError(f"d_model {self.d_model} is not divisible by {self.n_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_mlp(self) -> int:
        return self.mlp_ratio * self.d_model

    def parameter_count(self) -> int:
        """Learned parameters (embeddings, blocks, final norm, LM head)."""
        d, f, v = self.d_model, self.d_mlp, self.vocab_size
        norms = 2 * (2 * d)
        qkv = d * 3 * d + 3 * d
        attn_out = d * d + d
        mlp = (d * f + f) + (f * d + d)
        block = norms + qkv + attn_out + mlp
        embeddings = v * d + self.max_seq_len * d
        head = 2 * d + d * v + v  # final norm and LM head
        return embeddings + self.n_layers * block + head


CONFIGS: Mapping[DemoSize, GptConfig] = {
    DemoSize.TINY: GptConfig(
        size=DemoSize.TINY, d_model=128, n_layers=2, n_heads=4, max_seq_len=256
    ),
    DemoSize.SMALL: GptConfig(
        size=DemoSize.SMALL, d_model=384, n_layers=6, n_heads=6, max_seq_len=512
    ),
}


def config_for(size: DemoSize | str) -> GptConfig:
    try:
        key = size if isinstance(size, DemoSize) else DemoSize(size)
    except ValueError:
        names = ", ".join(s.value for s in DemoSize)
        raise DemoModelError(f"unknown demo size {size!r} (known: {names})") from None
    return CONFIGS[key]


@dataclass(frozen=True, kw_only=True)
class DemoModelInfo:
    """What a demo model records about itself in ``metadata_props``."""

    size: DemoSize
    seed: int
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    max_seq_len: int
    kv_cache: bool = False

    def as_metadata(self) -> dict[str, str]:
        cache = {f"{META_PREFIX}kv_cache": "1"} if self.kv_cache else {}
        return cache | {
            f"{META_PREFIX}size": self.size.value,
            f"{META_PREFIX}seed": str(self.seed),
            f"{META_PREFIX}vocab_size": str(self.vocab_size),
            f"{META_PREFIX}bos_id": str(self.bos_id),
            f"{META_PREFIX}eos_id": str(self.eos_id),
            f"{META_PREFIX}pad_id": str(self.pad_id),
            f"{META_PREFIX}max_seq_len": str(self.max_seq_len),
        }

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> DemoModelInfo:
        props = {p.key: p.value for p in model.metadata_props}
        try:
            return cls(
                size=DemoSize(props[f"{META_PREFIX}size"]),
                seed=int(props[f"{META_PREFIX}seed"]),
                vocab_size=int(props[f"{META_PREFIX}vocab_size"]),
                bos_id=int(props[f"{META_PREFIX}bos_id"]),
                eos_id=int(props[f"{META_PREFIX}eos_id"]),
                pad_id=int(props[f"{META_PREFIX}pad_id"]),
                max_seq_len=int(props[f"{META_PREFIX}max_seq_len"]),
                kv_cache=props.get(f"{META_PREFIX}kv_cache") == "1",
            )
        except (KeyError, ValueError) as exc:
            raise DemoModelError(f"not a demo model or bad metadata: {exc}") from None


def encode_text(text: str, *, add_bos: bool = False) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids, optionally after ``BOS_ID``."""
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if add_bos else ids


def decode_tokens(tokens: Iterable[int]) -> str:
    """Text of byte tokens; special ids are skipped, broken UTF-8 is replaced."""
    data = bytearray()
    for t in tokens:
        t = int(t)
        if 0 <= t < BYTE_VOCAB:
            data.append(t)
        elif t not in SPECIAL_IDS:
            raise DemoModelError(f"token id {t} is outside the demo vocabulary")
    return data.decode("utf-8", errors="replace")


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
    g.const(_MASK_BIAS, causal)
    seq2 = g.op("Concat", [seq, seq], "mask.seq2", axis=0)
    causal_s = g.op(
        "Slice",
        [_MASK_BIAS, g.const("mask.starts", _i64(0, 0)), seq2, g.const("mask.axes", _i64(0, 1))],
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


def _build_graph(cfg: GptConfig, seed: int, kv_cache: bool = False) -> onnx.GraphProto:
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


def build_demo_gpt(
    size: DemoSize | str = DemoSize.TINY, seed: int = 0, *, kv_cache: bool = False
) -> onnx.ModelProto:
    """Build the demo decoder of ``size`` with weights drawn from ``seed``.

    ``kv_cache`` exports the decoder-with-past form instead (same weights, same
    logits): ``past_key_values.{i}.key|value`` in, ``present.{i}.key|value`` out.
    """
    cfg = config_for(size)
    model = helper.make_model(
        _build_graph(cfg, seed, kv_cache),
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version="1",
        doc_string=f"Untrained byte-level GPT demo ({cfg.size.value}, seed {seed}).",
    )
    model.ir_version = IR_VERSION
    info = DemoModelInfo(
        size=cfg.size,
        seed=seed,
        vocab_size=cfg.vocab_size,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=PAD_ID,
        max_seq_len=cfg.max_seq_len,
        kv_cache=kv_cache,
    )
    helper.set_model_props(model, info.as_metadata())
    return model


def write_demo_gpt(
    path: str | Path, size: DemoSize | str = DemoSize.TINY, seed: int = 0, *, kv_cache: bool = False
) -> Path:
    """Build the demo decoder and write it to ``path`` (parents are created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(build_demo_gpt(size, seed, kv_cache=kv_cache).SerializeToString())
    return target


def count_parameters(model: onnx.ModelProto) -> int:
    """Learned float parameters in ``model``: float initializers except the mask buffer."""
    total = 0
    for init in model.graph.initializer:
        if init.name == _MASK_BIAS or init.data_type != TensorProto.FLOAT or len(init.dims) == 0:
            continue
        total += math.prod(init.dims)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the Graylane demo GPT as ONNX.")
    parser.add_argument("output", type=Path)
    parser.add_argument("--size", choices=[s.value for s in DemoSize], default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-cache", action="store_true", help="export the decoder-with-past (KV cache) form"
    )
    args = parser.parse_args(argv)
    path = write_demo_gpt(args.output, args.size, args.seed, kv_cache=args.kv_cache)
    cfg = config_for(args.size)
    print(
        f"{path}: {cfg.size.value}, {cfg.parameter_count():,} parameters, "
        f"{path.stat().st_size / 1e6:.1f} MB, max_seq_len {cfg.max_seq_len}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
