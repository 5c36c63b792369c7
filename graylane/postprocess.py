"""What a worker returns from a model's primary output instead of the raw tensors.

One enum for the SDK (the producer asks for it) and the worker (which applies
it), with its one protobuf mapping.
"""

from __future__ import annotations

from enum import Enum

from graylane.v1 import inference_pb2

__all__ = ["PostProcess", "post_process_from_pb", "post_process_to_pb"]


class PostProcess(Enum):
    """What to return from the primary output instead of the raw tensors."""

    NONE = "none"
    ARGMAX_LAST = "argmax_last"
    TOPK_LAST = "topk_last"
    MEAN_POOL = "mean_pool"


_TO_PB = {
    PostProcess.NONE: inference_pb2.POST_PROCESS_NONE,
    PostProcess.ARGMAX_LAST: inference_pb2.ARGMAX_LAST,
    PostProcess.TOPK_LAST: inference_pb2.TOPK_LAST,
    PostProcess.MEAN_POOL: inference_pb2.MEAN_POOL,
}
_FROM_PB: dict[int, PostProcess] = {v: k for k, v in _TO_PB.items()}


def post_process_to_pb(post: PostProcess) -> inference_pb2.PostProcess:
    return _TO_PB[post]


def post_process_from_pb(value: int) -> PostProcess:
    """An unknown value is NONE: the raw outputs."""
    return _FROM_PB.get(value, PostProcess.NONE)
