"""The Open Inference Protocol v2 (KServe / Triton REST) <-> numpy tensors (pure, no I/O).

An ``infer`` body is JSON, optionally followed by raw tensor bytes (the binary-data
extension: the JSON's length is the ``Inference-Header-Content-Length`` header, an
input with ``parameters.binary_data_size`` takes its bytes from what follows, in
input order). It is read into a :class:`TensorCall` (named numpy arrays, which the
SDK sends as a ``FORWARD`` request); the model's outputs are written back as JSON
``data`` or, where the caller asked (``parameters.binary_data`` on an output, or
``binary_data_output`` on the request), as bytes after the JSON.

Datatypes are those ``graylane.v1.Tensor`` carries: ``BOOL``, ``UINT8``, ``INT8``,
``INT32``, ``INT64``, ``FP16``, ``FP32``, ``FP64``; the others (``BYTES``, ``BF16``,
``INT16``, ``UINT16/32/64``) are refused with a 400 naming the tensor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graylane.engine.signature import IOSignature, TensorSpec
from graylane.errors import ErrorCode
from graylane.serde import TensorShapeError, check_shape
from graylane.services.gateway.failures import ApiError
from graylane.services.gateway.logic.json_body import read_json

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "RequestedOutput",
    "TensorCall",
    "datatype_of",
    "infer_response",
    "model_metadata",
    "parse_infer",
    "server_metadata",
    "split_body",
]

HEADER_LENGTH = "inference-header-content-length"
"""The HTTP header giving the JSON part's length when binary tensor data follows."""

DATATYPES: Mapping[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "INT8": np.dtype("i1"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_KNOWN_UNSUPPORTED = ("BYTES", "BF16", "INT16", "UINT16", "UINT32", "UINT64")
_BY_NUMPY = {dt.str.lstrip("<|="): name for name, dt in DATATYPES.items()}


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The protocol's datatype name of a numpy dtype."""
    name = _BY_NUMPY.get(np.dtype(dtype).newbyteorder("<").str.lstrip("<|="))
    if name is None:
        raise ApiError(
            ErrorCode.INTERNAL, f"output dtype {dtype} has no Open Inference Protocol datatype"
        )
    return name


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(frozen=True, kw_only=True)
class TensorCall:
    """One ``infer`` call, checked."""

    id: str
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...] = ()
    """Outputs asked for by name (empty: every output)."""
    binary_outputs: bool = False
    """Outputs not named in ``outputs`` come back as binary data."""
    timeout_s: float | None = None
    """``parameters.timeout`` (microseconds, as Triton's clients send it), in seconds."""


def split_body(
    body: bytes, header_length: str | None, *, max_depth: int, max_containers: int
) -> tuple[object, bytes]:
    """(the JSON part decoded within bounds, the binary part) of an ``infer`` body."""
    if header_length is None or not header_length.strip():
        json_part, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ApiError.invalid(
                f"{HEADER_LENGTH} {header_length[:32]!r} is not an integer"
            ) from None
        if not 0 < n <= len(body):
            raise ApiError.invalid(f"{HEADER_LENGTH} {n} does not fit a body of {len(body)} bytes")
        json_part, binary = body[:n], body[n:]
    return read_json(json_part, max_depth=max_depth, max_containers=max_containers), binary


def _flat(data: object) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        if isinstance(item, list):
            out.extend(_flat(item))
        else:
            out.append(item)
    return out


def _json_tensor(
    name: str, dtype: np.dtype[Any], shape: tuple[int, ...], data: object
) -> np.ndarray:
    values = _flat(data)
    if len(values) != math.prod(shape):
        raise ApiError.invalid(
            f"input {name!r}: {len(values)} values do not fill shape {list(shape)}"
        )
    if dtype.kind == "b":
        if not all(isinstance(v, bool) for v in values):
            raise ApiError.invalid(f"input {name!r}: BOOL data must be true/false")
    elif any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise ApiError.invalid(f"input {name!r}: data must be numbers")
    elif dtype.kind in "iu":
        if any(not isinstance(v, int) for v in values):
            raise ApiError.invalid(f"input {name!r}: integer data must be integers")
        info = np.iinfo(dtype)
        if values and (min(values) < info.min or max(values) > info.max):
            raise ApiError.invalid(f"input {name!r}: a value is outside the range of {dtype.name}")
    return np.asarray(values, dtype=dtype).reshape(shape)


def _parameters(raw: object, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ApiError.invalid(f"{where}.parameters must be an object")
    return raw


def parse_infer(header: object, binary: bytes, *, max_elements: int) -> TensorCall:
    """An ``infer`` call from its JSON part and binary part; :class:`ApiError` (400)."""
    if not isinstance(header, Mapping):
        raise ApiError.invalid("the request body must be a JSON object")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ApiError.invalid("inputs must be a non-empty list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, Mapping):
            raise ApiError.invalid(f"inputs[{i}] must be an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError.invalid(f"inputs[{i}].name is required")
        if name in inputs:
            raise ApiError.invalid(f"input {name!r} appears twice")
        datatype = item.get("datatype")
        if datatype in _KNOWN_UNSUPPORTED:
            raise ApiError.invalid(f"input {name!r}: datatype {datatype} is not supported")
        dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
        if dtype is None:
            raise ApiError.invalid(f"input {name!r}: unknown datatype {datatype!r}")
        raw_shape = item.get("shape")
        if not isinstance(raw_shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in raw_shape
        ):
            raise ApiError.invalid(f"input {name!r}: shape must be a list of integers")
        shape = tuple(raw_shape)
        try:
            check_shape(name, shape, max_elements)
        except TensorShapeError as exc:
            raise ApiError.invalid(str(exc)) from None
        params = _parameters(item.get("parameters"), f"inputs[{i}]")
        size = params.get("binary_data_size")
        if size is not None:
            expected = math.prod(shape) * dtype.itemsize
            if not isinstance(size, int) or size != expected:
                raise ApiError.invalid(
                    f"input {name!r}: binary_data_size {size} does not fit shape "
                    f"{list(shape)} of {datatype} ({expected} bytes)"
                )
            if offset + size > len(binary):
                raise ApiError.invalid(f"input {name!r}: the binary data ends early")
            chunk = binary[offset : offset + size]
            offset += size
            inputs[name] = np.frombuffer(chunk, dtype=dtype).reshape(shape)
        elif "data" in item:
            inputs[name] = _json_tensor(name, dtype, shape, item["data"])
        else:
            raise ApiError.invalid(f"input {name!r} has neither data nor binary_data_size")
    if offset != len(binary):
        raise ApiError.invalid(f"{len(binary) - offset} bytes of binary data belong to no input")
    params = _parameters(header.get("parameters"), "request")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ApiError.invalid("parameters.binary_data_output must be a boolean")
    outputs = []
    raw_outputs = header.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise ApiError.invalid("outputs must be a list")
    for i, item in enumerate(raw_outputs):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ApiError.invalid(f"outputs[{i}] must be an object with a name")
        oparams = _parameters(item.get("parameters"), f"outputs[{i}]")
        wants = oparams.get("binary_data", binary_default)
        outputs.append(RequestedOutput(item["name"], bool(wants)))
    timeout = params.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ApiError.invalid("parameters.timeout must be a number of microseconds")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise ApiError.invalid("id must be a string")
    return TensorCall(
        id=request_id,
        inputs=inputs,
        outputs=tuple(outputs),
        binary_outputs=binary_default,
        timeout_s=float(timeout) / 1e6 if timeout else None,
    )


def infer_response(
    *, model: str, version: str, call: TensorCall, outputs: Mapping[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """(body, JSON length when binary data follows else None) of an ``infer`` answer."""
    wanted = call.outputs or tuple(RequestedOutput(n, call.binary_outputs) for n in outputs)
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for out in wanted:
        if out.name not in outputs:
            known = ", ".join(sorted(outputs))
            raise ApiError.invalid(f"output {out.name!r} is not an output of {model!r} ({known})")
        array = np.ascontiguousarray(outputs[out.name])
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": datatype_of(array.dtype),
            "shape": list(array.shape),
        }
        if out.binary:
            data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            entry["data"] = array.reshape(-1).tolist()
        described.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if call.id:
        body["id"] = call.id
    text = json.dumps(body, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return text, None
    return text + b"".join(blobs), len(text)


def _spec(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "datatype": datatype_of(spec.dtype),
        "shape": [d if isinstance(d, int) else -1 for d in spec.shape],
    }


def model_metadata(
    name: str, versions: Sequence[str], signature: IOSignature | None
) -> dict[str, Any]:
    """``GET /v2/models/{name}[/versions/{v}]``: inputs and outputs when known."""
    return {
        "name": name,
        "versions": list(versions),
        "platform": "onnxruntime_onnx",
        "inputs": [_spec(s) for s in signature.inputs] if signature else [],
        "outputs": [_spec(s) for s in signature.outputs] if signature else [],
    }


def server_metadata(version: str) -> dict[str, Any]:
    """``GET /v2``."""
    return {"name": "graylane", "version": version, "extensions": ["binary_tensor_data"]}
