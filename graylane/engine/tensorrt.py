"""TensorRT 10/11 adapter for :class:`~graylane.engine.protocol.InferenceEngine`.

``tensorrt`` and ``pycuda`` are imported only when a plan is loaded, so this
module imports on machines without a GPU. Device memory and streams go through
``pycuda.driver`` on the device's primary context (the one TensorRT's runtime
API uses), pushed around each call so any worker thread may run the engine.

One execution context per optimization profile: a request runs on the profile
whose min/max shapes cover it (the smallest such, so bucket-sized profiles are
preferred), each context with its own stream, buffers and lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graylane.engine.errors import (
    EngineClosedError,
    EngineError,
    EngineLoadError,
    EngineRunError,
    IncompatibleEngineError,
    InvalidInputError,
)
from graylane.engine.signature import Dim, IOSignature, TensorSpec

__all__ = [
    "PlanTarget",
    "TensorRTEngine",
    "check_plan_target",
    "gpu_compute_capability",
    "tensorrt_version",
]


def tensorrt_version() -> str | None:
    """The installed TensorRT version, or ``None`` without TensorRT."""
    try:
        import tensorrt as trt
    except ImportError:
        return None
    return str(trt.__version__)


def gpu_compute_capability(device_id: int = 0) -> tuple[int, int] | None:
    """(major, minor) of GPU ``device_id``, or ``None`` without a GPU or CUDA bindings."""
    try:
        import pycuda.driver as cuda

        cuda.init()
        major, minor = cuda.Device(device_id).compute_capability()
        return int(major), int(minor)
    except Exception:  # No pycuda, or no device through it: ask cuda-python instead.
        pass
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    attr = cudart.cudaDeviceAttr
    err, major = cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMajor, device_id)
    if err != cudart.cudaError_t.cudaSuccess:
        return None
    err, minor = cudart.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMinor, device_id)
    if err != cudart.cudaError_t.cudaSuccess:
        return None
    return int(major), int(minor)


@dataclass(frozen=True, kw_only=True)
class PlanTarget:
    """Where a plan was built; a plan only runs on the same GPU architecture and TensorRT."""

    compute_capability: tuple[int, int]
    tensorrt_version: str


def check_plan_target(expected: PlanTarget, device_id: int = 0) -> None:
    """Raise :class:`IncompatibleEngineError` unless this host matches ``expected``."""
    here_cc = gpu_compute_capability(device_id)
    here_trt = tensorrt_version()
    if here_trt is None:
        raise IncompatibleEngineError("TensorRT is not installed on this host")
    if here_cc is None:
        raise IncompatibleEngineError(f"no CUDA device {device_id} on this host")
    if here_cc != expected.compute_capability:
        raise IncompatibleEngineError(
            f"plan built for compute capability {expected.compute_capability}, "
            f"this GPU is {here_cc}"
        )
    if here_trt != expected.tensorrt_version:
        raise IncompatibleEngineError(
            f"plan built with TensorRT {expected.tensorrt_version}, this host has {here_trt}"
        )


@dataclass
class _DeviceBuffer:
    allocation: Any
    nbytes: int


@dataclass
class _ProfileSlot:
    """One optimization profile with its own context, stream and buffers."""

    index: int
    context: Any
    stream: Any
    ranges: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    buffers: dict[str, _DeviceBuffer] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def covers(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        for name, shape in shapes.items():
            low, high = self.ranges[name]
            if len(shape) != len(low):
                return False
            if any(s < lo or s > hi for s, lo, hi in zip(shape, low, high, strict=True)):
                return False
        return True

    def volume(self) -> int:
        return sum(math.prod(high) for _, high in self.ranges.values())


class TensorRTEngine:
    """A deserialized TensorRT plan on one GPU."""

    def __init__(
        self,
        *,
        name: str,
        variant: str,
        trt: Any,
        cuda: Any,
        cuda_context: Any,
        runtime: Any,
        engine: Any,
        slots: list[_ProfileSlot],
        io: IOSignature,
    ) -> None:
        self._name = name
        self._variant = variant
        self._trt = trt
        self._cuda = cuda
        self._cuda_context: Any = cuda_context
        self._runtime = runtime
        self._engine = engine
        self._slots = slots
        self._io = io
        self._closed = False

    @classmethod
    def load(
        cls,
        plan: str | Path | bytes,
        variant: str,
        *,
        name: str | None = None,
        device_id: int = 0,
        expected: PlanTarget | None = None,
    ) -> TensorRTEngine:
        """Deserialize ``plan`` (a path or bytes) onto GPU ``device_id``.

        ``expected`` (from the artifact manifest) is checked first, so a plan for
        another GPU or TensorRT version fails with :class:`IncompatibleEngineError`
        instead of an opaque deserialization error.
        """
        try:
            import pycuda.driver as cuda
            import tensorrt as trt
        except ImportError as exc:
            raise EngineLoadError(f"TensorRT backend unavailable: {exc}") from exc
        if expected is not None:
            check_plan_target(expected, device_id)
        data = plan if isinstance(plan, bytes) else _read(Path(plan))
        label = name or ("plan" if isinstance(plan, bytes) else Path(plan).stem)
        try:
            cuda.init()
            cuda_context = cuda.Device(device_id).retain_primary_context()
        except Exception as exc:
            raise EngineLoadError(f"CUDA device {device_id} unavailable: {exc}") from exc
        cuda_context.push()
        try:
            logger = trt.Logger(trt.Logger.WARNING)
            runtime = trt.Runtime(logger)
            engine = runtime.deserialize_cuda_engine(data)
            if engine is None:
                raise IncompatibleEngineError(
                    f"TensorRT {trt.__version__} could not deserialize {label}: the plan is "
                    "corrupt or was built for another GPU or TensorRT version"
                )
            io = _signature(trt, engine)
            slots = [
                _make_slot(cuda, engine, index, io)
                for index in range(engine.num_optimization_profiles)
            ]
        except EngineError:
            raise
        except Exception as exc:
            raise EngineLoadError(f"could not set up TensorRT plan {label}: {exc}") from exc
        finally:
            cuda.Context.pop()
        return cls(
            name=label,
            variant=variant,
            trt=trt,
            cuda=cuda,
            cuda_context=cuda_context,
            runtime=runtime,
            engine=engine,
            slots=slots,
            io=io,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def variant(self) -> str:
        return self._variant

    @property
    def io(self) -> IOSignature:
        return self._io

    @property
    def num_profiles(self) -> int:
        return len(self._slots)

    def profile_ranges(self, index: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
        """(min, max) shape per input of optimization profile ``index``."""
        return dict(self._slots[index].ranges)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise EngineClosedError(f"engine {self._name}/{self._variant} is closed")
        arrays = self._io.check_feeds(feeds)
        shapes = {name: tuple(int(d) for d in arr.shape) for name, arr in arrays.items()}
        candidates = [slot for slot in self._slots if slot.covers(shapes)]
        if not candidates:
            raise InvalidInputError(f"no optimization profile of {self._name} covers {shapes}")
        slot = min(candidates, key=_ProfileSlot.volume)
        self._cuda_context.push()
        try:
            with slot.lock:
                return self._execute(slot, arrays)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineRunError(f"{self._name}/{self._variant}: {exc}") from exc
        finally:
            self._cuda.Context.pop()

    def _execute(
        self, slot: _ProfileSlot, arrays: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        cuda, context, stream = self._cuda, slot.context, slot.stream
        for name, arr in arrays.items():
            if not context.set_input_shape(name, arr.shape):
                raise InvalidInputError(f"TensorRT rejected shape {arr.shape} for {name!r}")
        outputs: dict[str, np.ndarray] = {}
        for spec in self._io.outputs:
            shape = tuple(int(d) for d in context.get_tensor_shape(spec.name))
            if any(d < 0 for d in shape):
                raise EngineRunError(f"output {spec.name!r} has unresolved shape {shape}")
            outputs[spec.name] = np.empty(shape, dtype=spec.dtype)
        for name, arr in {**arrays, **outputs}.items():
            buffer = self._buffer(slot, name, max(arr.nbytes, 1))
            context.set_tensor_address(name, int(buffer.allocation))
        for name, arr in arrays.items():
            if arr.nbytes:
                cuda.memcpy_htod_async(slot.buffers[name].allocation, arr, stream)
        if not context.execute_async_v3(stream.handle):
            raise EngineRunError(f"{self._name}/{self._variant}: execute_async_v3 failed")
        for name, arr in outputs.items():
            if arr.nbytes:
                cuda.memcpy_dtoh_async(arr, slot.buffers[name].allocation, stream)
        stream.synchronize()
        return outputs

    def _buffer(self, slot: _ProfileSlot, name: str, nbytes: int) -> _DeviceBuffer:
        """A device buffer of at least ``nbytes``, reused across calls, grown as needed."""
        current = slot.buffers.get(name)
        if current is not None and current.nbytes >= nbytes:
            return current
        if current is not None:
            current.allocation.free()
        grown = _DeviceBuffer(self._cuda.mem_alloc(nbytes), nbytes)
        slot.buffers[name] = grown
        return grown

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cuda_context.push()
        try:
            for slot in self._slots:
                with slot.lock:
                    for buffer in slot.buffers.values():
                        buffer.allocation.free()
                    slot.buffers.clear()
                    slot.context = None
            self._slots = []
            self._engine = None
            self._runtime = None
        finally:
            self._cuda.Context.pop()
            self._cuda_context.detach()

    def __repr__(self) -> str:
        return f"TensorRTEngine(name={self._name!r}, variant={self._variant!r})"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EngineLoadError(f"cannot read plan {path}: {exc}") from exc


def _signature(trt: Any, engine: Any) -> IOSignature:
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        try:
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        except TypeError as exc:
            raise EngineLoadError(f"tensor {name!r}: unsupported TensorRT dtype: {exc}") from exc
        shape: tuple[Dim, ...] = tuple(
            None if int(d) < 0 else int(d) for d in engine.get_tensor_shape(name)
        )
        spec = TensorSpec(name=name, dtype=dtype, shape=shape)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs.append(spec)
        else:
            outputs.append(spec)
    return IOSignature(inputs=tuple(inputs), outputs=tuple(outputs))


def _make_slot(cuda: Any, engine: Any, index: int, io: IOSignature) -> _ProfileSlot:
    stream = cuda.Stream()
    context = engine.create_execution_context()
    if context is None:
        raise EngineLoadError(f"TensorRT could not create an execution context for profile {index}")
    if not context.set_optimization_profile_async(index, stream.handle):
        raise EngineLoadError(f"TensorRT refused optimization profile {index}")
    stream.synchronize()
    ranges: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for spec in io.inputs:
        low, _opt, high = engine.get_tensor_profile_shape(spec.name, index)
        ranges[spec.name] = (tuple(int(d) for d in low), tuple(int(d) for d in high))
    return _ProfileSlot(index=index, context=context, stream=stream, ranges=ranges)
