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

Vocabulary: the 256 byte values, then ``BOS_ID`` and ``EOS_ID``
(:mod:`graylane.models.byte_vocab`, which the worker's tokenizer reads too).

The graph writer (one private helper per block, with and without a KV cache) lives
in :mod:`graylane.models.demo_gpt_graph`; this module holds the contract: config,
metadata and the build/write entry points.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from graylane.models.byte_vocab import (
    BOS_ID,
    EOS_ID,
    META_PREFIX,
    PAD_ID,
    VOCAB_SIZE,
    DemoModelError,
)

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"
OPSET = 17
IR_VERSION = 8
PRODUCER = "graylane.demo"
MASK_BIAS = "causal_mask_bias"
"""The causal-mask buffer initializer (not a learned parameter)."""
"""Additive mask value: large enough to zero a softmax term in float32, finite in float16."""


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


class DemoSize(Enum):
    TINY = "tiny"
    SMALL = "small"


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


def build_demo_gpt(
    size: DemoSize | str = DemoSize.TINY, seed: int = 0, *, kv_cache: bool = False
) -> onnx.ModelProto:
    """Build the demo decoder of ``size`` with weights drawn from ``seed``.

    ``kv_cache`` exports the decoder-with-past form instead (same weights, same
    logits): ``past_key_values.{i}.key|value`` in, ``present.{i}.key|value`` out.
    """
    from graylane.models.demo_gpt_graph import build_graph  # it imports this module

    cfg = config_for(size)
    model = helper.make_model(
        build_graph(cfg, seed, kv_cache),
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
        if init.name == MASK_BIAS or init.data_type != TensorProto.FLOAT or len(init.dims) == 0:
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
