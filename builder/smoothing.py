"""Activation smoothing before a weight-only int8 rung computes in int8 (SmoothQuant).

``MatMulNBits`` with ``accuracy_level`` 4 quantizes its activations to int8 per block of
the input axis. A decoder's activations have a few channels far larger than the rest
(SmolLM2-135M: the largest channel of a normed hidden state is 5-23x its median), so
the other channels of their blocks lose most of their precision, and that, not the
8-bit weights, is what costs a rung its agreement with fp32 (measured: 8-bit weights
with float compute agree 0.990, with int8 compute 0.969).

Smoothing moves that range from the activations into the weights, exactly in float:
for a channel ``c`` of the activation ``x`` feeding some ``MatMul`` weights ``W``,
``x[c] / s[c]`` times ``W[c, :] * s[c]`` is the same product. The division is folded
into what produced ``x``, so the graph keeps its nodes:

- a normalization's scale (``Mul(normalized, gamma)``: RMSNorm feeding q/k/v or
  gate/up): ``gamma[c] / s[c]``;
- a projection whose output is multiplied in (SwiGLU's ``Mul(act, up)`` feeding
  down_proj): the up projection's output column ``c`` divided by ``s[c]``.

``s[c] = max|x[c]|^alpha / max|W[c, :]|^(1 - alpha)`` (the SmoothQuant rule), from the
activation maxima on calibration text. The smoothed fp32 graph computes what the source
computes (up to float rounding); only its int8 quantization changes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "DEFAULT_FOLDS",
    "FoldKind",
    "SmoothingGroup",
    "SmoothingRecord",
    "activation_maxima",
    "apply_smoothing",
    "smoothing_groups",
    "smoothing_scales",
]

_MIN = 1e-5
_SCALE_RANGE = (1e-3, 1e3)


class FoldKind(Enum):
    """Where the division by the smoothing scale is folded."""

    NORM_SCALE = "norm-scale"
    """The constant scale of the ``Mul`` that produced the activation (RMSNorm's gamma)."""
    PRODUCER_COLUMNS = "producer-columns"
    """The output columns of the constant-weight ``MatMul`` multiplied into it (SwiGLU's up)."""


@dataclass(frozen=True)
class SmoothingGroup:
    """One activation and the constant-weight ``MatMul`` nodes it feeds."""

    activation: str
    matmuls: tuple[str, ...]
    weights: tuple[str, ...]
    """The ``[in, out]`` weight initializer of each MatMul, in the same order."""
    fold: FoldKind
    fold_initializer: str
    """gamma (``[in]``) or the producing projection's weight (``[*, in]``)."""


@dataclass(frozen=True)
class SmoothingRecord:
    """What smoothing did to a rung (recorded in its manifest)."""

    alpha: float
    groups: int
    calibration_prompts: int
    folded: Mapping[FoldKind, int]

    def describe(self) -> str:
        kinds = ", ".join(f"{n} into {k.value}" for k, n in self.folded.items() if n)
        return (
            f"smoothed {self.groups} activations (alpha {self.alpha}, "
            f"{self.calibration_prompts} calibration prompts; {kinds})"
        )


def _initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {i.name: i for i in graph.initializer}


DEFAULT_FOLDS = (FoldKind.NORM_SCALE,)
"""What the 8-bit rung smooths: the normed inputs of q/k/v and gate/up. Measured on
SmolLM2-135M (alpha 0.75, 40 English prompts): those alone take int8 compute from 0.969
to 0.979 top-1 agreement; smoothing down_proj's input as well gave 0.968 (its outlier
channels move into weights that then round coarsely)."""


def smoothing_groups(
    model: onnx.ModelProto,
    exclude: Iterable[str] = (),
    folds: Collection[FoldKind] = tuple(FoldKind),
) -> list[SmoothingGroup]:
    """The activations whose smoothing can be folded exactly, with the MatMuls they feed.

    An activation qualifies when every consumer is a ``MatMul`` with its own 2-D constant
    weight (none of them in ``exclude``) and its producer is a ``Mul`` by a 1-D constant
    used nowhere else, or a ``Mul`` by the output of such a ``MatMul`` that nothing else
    reads. Anything else is left as it is.
    """
    graph = model.graph
    inits = _initializers(graph)
    excluded = set(exclude)
    uses: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for name in node.input:
            uses[name].append(node)
        for name in node.output:
            producer[name] = node
    outputs = {o.name for o in graph.output}

    def own_weight(node: onnx.NodeProto) -> bool:
        return (
            node.op_type == "MatMul"
            and len(node.input) == 2
            and node.input[1] in inits
            and len(inits[node.input[1]].dims) == 2
            and len(uses[node.input[1]]) == 1
        )

    groups: list[SmoothingGroup] = []
    seen: set[str] = set()
    for node in graph.node:
        if not own_weight(node) or node.input[0] in seen:
            continue
        x = node.input[0]
        seen.add(x)
        consumers = uses[x]
        if x in outputs or not all(own_weight(c) for c in consumers):
            continue
        if any(c.name in excluded for c in consumers):
            continue
        width = int(inits[consumers[0].input[1]].dims[0])
        made = producer.get(x)
        if made is None or made.op_type != "Mul" or len(made.input) != 2:
            continue
        fold: tuple[FoldKind, str] | None = None
        for name in made.input:
            init = inits.get(name)
            if init is not None and list(init.dims) == [width] and len(uses[name]) == 1:
                fold = (FoldKind.NORM_SCALE, name)
                break
            source = producer.get(name)
            if (
                source is not None
                and own_weight(source)
                and int(inits[source.input[1]].dims[1]) == width
                and len(uses[name]) == 1
                and name not in outputs
            ):
                fold = (FoldKind.PRODUCER_COLUMNS, source.input[1])
                break
        if fold is None or fold[0] not in folds:
            continue
        groups.append(
            SmoothingGroup(
                activation=x,
                matmuls=tuple(c.name for c in consumers),
                weights=tuple(c.input[1] for c in consumers),
                fold=fold[0],
                fold_initializer=fold[1],
            )
        )
    return groups


def smoothing_scales(
    activation_max: np.ndarray, weight_max: np.ndarray, alpha: float
) -> np.ndarray:
    """SmoothQuant's per-channel scale, ``amax^alpha / wmax^(1-alpha)``, kept finite."""
    a = np.maximum(np.asarray(activation_max, dtype=np.float64), _MIN)
    w = np.maximum(np.asarray(weight_max, dtype=np.float64), _MIN)
    scales = np.power(a, alpha) / np.power(w, 1.0 - alpha)
    return np.clip(scales, *_SCALE_RANGE).astype(np.float32)


def apply_smoothing(
    model: onnx.ModelProto,
    groups: Sequence[SmoothingGroup],
    maxima: Mapping[str, np.ndarray],
    alpha: float,
) -> dict[FoldKind, int]:
    """Fold each group's scales into ``model``'s initializers (in place); counts by kind."""
    inits = _initializers(model.graph)
    folded = dict.fromkeys(FoldKind, 0)
    for group in groups:
        weights = [numpy_helper.to_array(inits[w]) for w in group.weights]
        weight_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        scales = smoothing_scales(maxima[group.activation], weight_max, alpha)
        for name, w in zip(group.weights, weights, strict=True):
            _replace(inits[name], (w * scales[:, None]).astype(np.float32))
        target = numpy_helper.to_array(inits[group.fold_initializer])
        if group.fold is FoldKind.NORM_SCALE:
            _replace(inits[group.fold_initializer], (target / scales).astype(np.float32))
        else:
            _replace(inits[group.fold_initializer], (target / scales[None, :]).astype(np.float32))
        folded[group.fold] += 1
    return folded


def _replace(init: onnx.TensorProto, array: np.ndarray) -> None:
    init.CopyFrom(numpy_helper.from_array(array, init.name))


def activation_maxima(
    model: onnx.ModelProto, activations: Sequence[str], prompts: Sequence[Sequence[int]]
) -> dict[str, np.ndarray]:
    """The largest ``|value|`` per channel (last axis) of each activation over ``prompts``
    (token ids, one forward each), run as a worker runs the model."""
    from graylane.builder.runtime import activations_per_prompt

    maxima: dict[str, np.ndarray] = {}
    for out in activations_per_prompt(model, activations, prompts):
        for name in activations:
            value = np.abs(np.asarray(out[name], dtype=np.float32))
            channel_max = value.reshape(-1, value.shape[-1]).max(axis=0)
            previous = maxima.get(name)
            maxima[name] = channel_max if previous is None else np.maximum(previous, channel_max)
    return maxima
