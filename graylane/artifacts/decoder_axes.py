"""Decoder exports whose declared axes contradict how they run: found and corrected.

A merged decoder (one graph for the first pass and the cached steps, chosen by the
``use_cache_branch`` input, Optimum's ``decoder_model_merged.onnx``) is made by
``optimum.onnx.merge_decoders`` from the decoder without past inputs and the one
with them. The merged graph keeps the first one's input declarations, so its
``attention_mask`` is declared ``[batch_size, sequence_length]``, the axis name of
``input_ids``: true on the first pass, false on every cached step, where the mask
covers the past and the new tokens. ONNX Runtime does not hold inputs to their axis
names; Graylane does (:meth:`~graylane.engine.signature.IOSignature.check_feeds`),
so such a graph would be refused on its first cached step. The builder renames the
mask's axis before it produces any variant (:func:`correct_mask_axis`); nothing
else in the graph changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

__all__ = ["MASK_AXIS", "MaskAxisCorrection", "correct_mask_axis", "mask_axis_conflict"]

MASK_AXIS = "past_sequence_length + sequence_length"
"""The axis name Optimum gives the mask of a decoder with past inputs."""
_IDS, _MASK, _BRANCH = "input_ids", "attention_mask", "use_cache_branch"


@dataclass(frozen=True, slots=True)
class MaskAxisCorrection:
    """The mask's axis 1 was declared ``before`` (``input_ids``' axis) and is now ``after``."""

    before: str
    after: str

    def note(self) -> str:
        return (
            f"attention_mask axis 1 declared {self.after!r}, not {self.before!r}: "
            "the merged decoder's mask covers past and new tokens, input_ids only the new"
        )


def _seq_axis(value: onnx.ValueInfoProto) -> onnx.TensorShapeProto.Dimension | None:
    dims = value.type.tensor_type.shape.dim
    return dims[1] if len(dims) == 2 else None


def mask_axis_conflict(model: onnx.ModelProto) -> str | None:
    """The axis name a merged decoder wrongly shares between mask and ids, or ``None``."""
    inputs = {v.name: v for v in model.graph.input}
    if _BRANCH not in inputs or _IDS not in inputs or _MASK not in inputs:
        return None
    ids, mask = _seq_axis(inputs[_IDS]), _seq_axis(inputs[_MASK])
    if ids is None or mask is None or not ids.dim_param:
        return None
    return ids.dim_param if mask.dim_param == ids.dim_param else None


def correct_mask_axis(model: onnx.ModelProto) -> MaskAxisCorrection | None:
    """Rename the mask's axis 1 (in place) where :func:`mask_axis_conflict` finds one."""
    shared = mask_axis_conflict(model)
    if shared is None:
        return None
    mask = next(v for v in model.graph.input if v.name == _MASK)
    axis = _seq_axis(mask)
    assert axis is not None
    axis.dim_param = MASK_AXIS if shared != MASK_AXIS else f"{MASK_AXIS} (mask)"
    return MaskAxisCorrection(before=shared, after=axis.dim_param)
