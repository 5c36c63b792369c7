"""Which decoder layers the 8-bit rung keeps in float, measured on calibration text.

With ``accuracy_level`` 4, ``MatMulNBits`` quantizes its activations to int8 per block,
and the layers of a decoder do not suffer alike: on SmolLM2-135M (smoothed, 26
calibration prompts), quantizing only one of the first three layers moves fp32's next-token
distributions 3-9x more than quantizing one of layers 3 to 8. A fixed list of float layers
is a guess about one model; this measures it:

1. for each decoder layer (its ``MatMul`` nodes, grouped by the first numbered part of
   their names: ``layers.7`` of ``layers.7.mlp.up_proj``), quantize that layer alone, as
   the rung quantizes it (its GPTQ codes where the rung rounds by GPTQ);
2. run the calibration prompts through it and take the mean KL divergence of its
   next-token distributions from fp32's, per position;
3. keep in float the ``count`` layers with the largest divergence.

Every other layer is quantized in the rung, so the measure is one layer's own damage,
not its interactions; it ranks, it does not predict the rung's agreement (the build's
validation does that).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

__all__ = [
    "FloatLayerChoice",
    "LayerSensitivity",
    "decoder_layers",
    "mean_kl",
    "measure_layers",
    "most_sensitive",
]

Quantize = Callable[[onnx.ModelProto, Sequence[str], Path], None]
"""``(model, nodes to keep in float, path)``: the rung's own quantizer, writing the
quantized model (and its external data beside it) at ``path``."""


@dataclass(frozen=True)
class LayerSensitivity:
    """One decoder layer's damage when it alone is quantized."""

    layer: str
    """``layers.7``: the node-name prefix of the layer, without its trailing dot."""
    nodes: tuple[str, ...]
    mean_kl: float
    """Mean KL(fp32 || this layer in int8) per position on the calibration text."""
    top1_changes: int
    """Positions whose greedy token differs from fp32's."""


@dataclass(frozen=True)
class FloatLayerChoice:
    """What the measurement chose (recorded in the manifest)."""

    layers: tuple[str, ...]
    """Most sensitive first."""
    measured: tuple[LayerSensitivity, ...]
    calibration_prompts: int
    positions: int

    @property
    def nodes(self) -> tuple[str, ...]:
        chosen = set(self.layers)
        return tuple(n for m in self.measured if m.layer in chosen for n in m.nodes)

    def describe(self) -> str:
        ranked = sorted(self.measured, key=lambda m: -m.mean_kl)
        spread = (
            f"mean KL {ranked[0].mean_kl:.2e} to {ranked[-1].mean_kl:.2e}" if ranked else "none"
        )
        return (
            f"kept in float by measured sensitivity: {', '.join(self.layers)} "
            f"({len(self.measured)} layers measured one at a time on "
            f"{self.calibration_prompts} calibration prompts, {self.positions} positions; "
            f"{spread})"
        )


def decoder_layers(nodes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Nodes grouped by decoder layer, in graph order; nodes with no numbered part are left
    out (the output head, a projection outside the layers)."""
    layers: dict[str, list[str]] = {}
    for name in nodes:
        layer = _layer_of(name)
        if layer is not None:
            layers.setdefault(layer, []).append(name)
    return {layer: tuple(members) for layer, members in layers.items()}


def _layer_of(name: str) -> str | None:
    """``layers.7`` of ``layers.7.mlp.up_proj`` or ``/model/layers.7/mlp/MatMul``, ``h3`` of
    ``h3.attn.qkv``; ``None`` for a name with no digit (``lm_head``)."""
    for segment in (s for s in name.split("/") if s):
        parts = segment.split(".")
        for i, part in enumerate(parts):
            if any(c.isdigit() for c in part):
                return ".".join(parts[: i + 1])
    return None


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    out: np.ndarray = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return out


def mean_kl(reference: np.ndarray, logits: np.ndarray) -> float:
    """Mean over positions of KL(softmax(reference) || softmax(logits)), last axis the
    vocabulary."""
    ref = _log_softmax(reference).reshape(-1, np.shape(reference)[-1])
    got = _log_softmax(logits).reshape(-1, np.shape(logits)[-1])
    per_position = (np.exp(ref) * (ref - got)).sum(axis=-1)
    return float(per_position.mean()) if len(per_position) else 0.0


def most_sensitive(measured: Sequence[LayerSensitivity], count: int) -> tuple[str, ...]:
    """The ``count`` layers with the largest divergence, largest first (ties: graph order)."""
    order = sorted(range(len(measured)), key=lambda i: (-measured[i].mean_kl, i))
    return tuple(measured[i].layer for i in order[: max(count, 0)])


def measure_layers(
    model: onnx.ModelProto,
    quantizable: Sequence[str],
    prompts: Sequence[Sequence[int]],
    quantize: Quantize,
    count: int,
) -> FloatLayerChoice:
    """Quantize each decoder layer of ``model`` alone (``quantize``), run ``prompts`` (token
    ids, one forward each, as a worker runs the model) and choose the ``count`` layers that
    move fp32's next-token distributions most."""
    from graylane.builder.runtime import open_runner

    layers = decoder_layers(quantizable)
    with tempfile.TemporaryDirectory(prefix="graylane-layer-sensitivity-") as tmp:

        def logits_at(path: Path) -> list[np.ndarray]:
            runner = open_runner(path, threads=None)
            out = []
            for ids in prompts:
                tokens = np.asarray([list(ids)], dtype=np.int64)
                result = runner({"input_ids": tokens, "attention_mask": np.ones_like(tokens)})
                out.append(np.asarray(result["logits"], dtype=np.float32)[0])
            del runner
            shutil.rmtree(path.parent)
            return out

        def path_for(label: str) -> Path:
            folder = Path(tmp) / label
            folder.mkdir()
            return folder / "model.onnx"

        fp32 = path_for("fp32")
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # saving with external data empties the tensors it saves
        onnx.save_model(copy, str(fp32), save_as_external_data=True)
        del copy
        reference = logits_at(fp32)
        positions = sum(len(r) for r in reference)
        measured = []
        for i, (layer, nodes) in enumerate(layers.items()):
            alone = set(nodes)
            path = path_for(f"layer{i}")
            quantize(model, [n for n in quantizable if n not in alone], path)
            got = logits_at(path)
            pairs = list(zip(reference, got, strict=True))
            kl = sum(mean_kl(r, g) * len(r) for r, g in pairs)
            changes = sum(int(np.sum(r.argmax(-1) != g.argmax(-1))) for r, g in pairs)
            measured.append(
                LayerSensitivity(
                    layer=layer,
                    nodes=nodes,
                    mean_kl=kl / positions if positions else 0.0,
                    top1_changes=changes,
                )
            )
    chosen = most_sensitive(measured, count)
    return FloatLayerChoice(
        layers=chosen,
        measured=tuple(measured),
        calibration_prompts=len(prompts),
        positions=positions,
    )
