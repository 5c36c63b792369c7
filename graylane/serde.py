"""Protobuf serde for every Graylane message on the bus.

Tensors on the wire: numpy arrays <-> ``graylane.v1.Tensor`` messages, checked.

Also what a request asks a worker to return from its model's primary output instead
of the raw tensors (:class:`PostProcess`): one enum for the SDK (the producer asks
for it) and the worker (which applies it), with its one protobuf mapping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import TypeVar

import numpy as np
from google.protobuf.message import DecodeError, Message

from graylane.engine.errors import BadDtype, BadShape
from graylane.errors import SerdeError, TensorError
from graylane.v1 import inference_pb2, tensor_pb2

__all__ = [
    "MAX_DIMS",
    "DType",
    "PostProcess",
    "TensorDtypeError",
    "TensorShapeError",
    "check_shape",
    "dtype_code",
    "from_tensor",
    "from_tensors",
    "numpy_dtype",
    "post_process_from_pb",
    "post_process_to_pb",
    "to_tensor",
    "to_tensors",
]


M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    """Serialize a message (deterministic, so equal messages give equal bytes)."""
    return message.SerializeToString(deterministic=True)


def decode(kind: type[M], data: bytes | None) -> M:
    """Parse ``data`` as ``kind``; raises :class:`SerdeError` with the reason."""
    if data is None:
        raise SerdeError(f"cannot decode {kind.__name__}: the record has no value (tombstone)")
    message = kind()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise SerdeError(f"cannot decode {kind.__name__} from {len(data)} bytes: {exc}") from None
    return message


def encode_key(key: str | None) -> bytes | None:
    return None if key is None else key.encode("utf-8")


def decode_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


DType = tensor_pb2.DType


class TensorDtypeError(TensorError, BadDtype):
    """A tensor's element type has no counterpart on the other side (code ``BAD_DTYPE``)."""


class TensorShapeError(TensorError, BadShape):
    """A tensor's shape, byte length or name does not fit (code ``BAD_SHAPE``)."""


MAX_DIMS = 8
"""At most this many dimensions per tensor."""
DEFAULT_MAX_ELEMENTS = 4 * 1024 * 1024
"""Element cap when the caller gives none (the default max request bytes: >= 1 byte each)."""


def check_shape(name: str, shape: tuple[int, ...], max_elements: int) -> None:
    """Refuse a shape before numpy sees it: rank, negative or huge dims, empty batch."""
    shown = _short(name)
    if len(shape) > MAX_DIMS:
        raise TensorShapeError(f"tensor {shown} has {len(shape)} dimensions; at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise TensorShapeError(f"tensor {shown} has a negative dimension in shape {shape}")
    if shape and shape[0] == 0:
        raise TensorShapeError(f"tensor {shown} has an empty batch dimension in shape {shape}")
    if any(d > max_elements for d in shape) or math.prod(shape) > max_elements:
        raise TensorShapeError(
            f"tensor {shown} shape {shape} exceeds the limit of {max_elements} elements"
        )


def _short(name: str, limit: int = 64) -> str:
    return repr(name if len(name) <= limit else name[:limit] + "...")


_TO_NUMPY: dict[tensor_pb2.DType, np.dtype[np.generic]] = {
    tensor_pb2.FLOAT32: np.dtype("<f4"),
    tensor_pb2.FLOAT16: np.dtype("<f2"),
    tensor_pb2.FLOAT64: np.dtype("<f8"),
    tensor_pb2.INT64: np.dtype("<i8"),
    tensor_pb2.INT32: np.dtype("<i4"),
    tensor_pb2.INT8: np.dtype("i1"),
    tensor_pb2.UINT8: np.dtype("u1"),
    tensor_pb2.BOOL: np.dtype("?"),
}
_FROM_NUMPY: dict[str, tensor_pb2.DType] = {
    dt.str.lstrip("<|="): code for code, dt in _TO_NUMPY.items()
}


def numpy_dtype(code: tensor_pb2.DType) -> np.dtype[np.generic]:
    """The numpy dtype for a ``graylane.v1.DType`` code."""
    try:
        return _TO_NUMPY[code]
    except KeyError:
        name = tensor_pb2.DType.Name(code) if code in tensor_pb2.DType.values() else str(code)
        raise TensorDtypeError(f"dtype {name} is not supported") from None


def dtype_code(dtype: np.dtype[np.generic]) -> tensor_pb2.DType:
    """The ``graylane.v1.DType`` code of a numpy dtype."""
    key = np.dtype(dtype).newbyteorder("<").str.lstrip("<|=")
    try:
        return _FROM_NUMPY[key]
    except KeyError:
        raise TensorDtypeError(f"numpy dtype {dtype} has no graylane.v1.DType") from None


def to_tensor(name: str, array: np.ndarray) -> tensor_pb2.Tensor:
    arr = np.asarray(array, order="C")
    code = dtype_code(arr.dtype)
    little = arr.astype(_TO_NUMPY[code], copy=False)
    return tensor_pb2.Tensor(name=name, dtype=code, shape=list(arr.shape), data=little.tobytes())


def from_tensor(tensor: tensor_pb2.Tensor, max_elements: int = DEFAULT_MAX_ELEMENTS) -> np.ndarray:
    """Decode a tensor, checking shape limits and that the byte length matches dtype and shape."""
    dtype = numpy_dtype(tensor.dtype)
    if len(tensor.shape) > MAX_DIMS:
        raise TensorShapeError(
            f"tensor {_short(tensor.name)} has {len(tensor.shape)} dimensions; at most {MAX_DIMS}"
        )
    shape = tuple(int(d) for d in tensor.shape)
    check_shape(tensor.name, shape, max_elements)
    expected = math.prod(shape) * dtype.itemsize
    if len(tensor.data) != expected:
        raise TensorShapeError(
            f"tensor {_short(tensor.name)}: {len(tensor.data)} bytes do not fit shape {shape} "
            f"of {dtype.name} ({expected} bytes expected)"
        )
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def to_tensors(arrays: Mapping[str, np.ndarray]) -> list[tensor_pb2.Tensor]:
    return [to_tensor(name, arr) for name, arr in arrays.items()]


def from_tensors(
    tensors: Iterable[tensor_pb2.Tensor], max_elements: int = DEFAULT_MAX_ELEMENTS
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        if t.name in out:
            raise TensorShapeError(f"tensor name {_short(t.name)} appears twice")
        out[t.name] = from_tensor(t, max_elements)
    return out


# -- what to return instead of the raw outputs ------------------------------------


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
