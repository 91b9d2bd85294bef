"""The thin layer over the TensorRT Python API: import, logger, deserialisation, engine view, contexts.

TensorRT is imported inside functions only. The name-based API (``num_io_tensors``, ``set_input_shape``,
``execute_async_v3``) exists from 8.5 (JetPack 5.1); allocation strategies from 10.0;
``device_memory_size_v2`` and ``set_device_memory(ptr, size)`` from 10.1 (docs/jetson.md §9). Capabilities are
decided from the version.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal

from edged.backends._trt_meta import TrtCapabilities
from edged.backends._trt_plan import Shape
from edged.errors import BackendUnavailable, ModelLoadError

AllocationStrategy = Literal["STATIC", "ON_PROFILE_CHANGE", "USER_MANAGED"]
ALLOCATION_STRATEGIES: tuple[AllocationStrategy, ...] = ("STATIC", "ON_PROFILE_CHANGE", "USER_MANAGED")
STRATEGY_PARAMETER = "execution_context_allocation_strategy"
TRT_MISSING_HINT = (
    "TensorRT is not installed: on a Jetson it comes from JetPack (sudo apt install python3-libnvinfer) "
    "for the system Python only, so create edged's virtualenv with --system-site-packages; elsewhere install "
    "NVIDIA's tensorrt wheel"
)


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as e:
        raise BackendUnavailable(TRT_MISSING_HINT) from e
    return tensorrt


def tensorrt_version() -> str | None:
    try:
        import tensorrt
    except ImportError:
        return None
    return str(tensorrt.__version__)


def parse_allocation_strategy(parameters: Mapping[str, str], caps: TrtCapabilities) -> AllocationStrategy:
    """Triton's ``execution_context_allocation_strategy`` parameter; STATIC when absent."""
    raw = parameters.get(STRATEGY_PARAMETER)
    if raw is None:
        return "STATIC"
    value = raw.strip().upper()
    for strategy in ALLOCATION_STRATEGIES:
        if value == strategy:
            break
    else:
        raise ModelLoadError(f"parameter {STRATEGY_PARAMETER}: expected one of "
                             f"{', '.join(ALLOCATION_STRATEGIES)}, found {raw!r}")
    if strategy != "STATIC" and not caps.allocation_strategies:
        raise ModelLoadError(f"parameter {STRATEGY_PARAMETER}: {strategy} needs TensorRT >= 10.0 (JetPack "
                             f">= 6.1), found TensorRT {caps.version}; use STATIC or remove the parameter")
    return strategy


def make_logger(trt: Any, min_severity: str = "WARNING") -> Any:
    """A ``trt.ILogger`` that keeps the messages of one operation, so a failure can quote them."""
    order = ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"]
    keep = set(order[: order.index(min_severity) + 1])

    class CapturingLogger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []
            self._lock = threading.Lock()

        def log(self, severity: Any, msg: str) -> None:
            name = getattr(severity, "name", str(severity))
            if name in keep:
                with self._lock:
                    self.messages.append(f"[{name}] {msg}")

        def drain(self) -> list[str]:
            with self._lock:
                messages, self.messages = self.messages, []
            return messages

    return CapturingLogger()


def deserialize(trt: Any, runtime: Any, logger: Any, data: bytes, origin: str) -> Any:
    """``deserialize_cuda_engine`` returns None on failure: turn that into an error quoting TensorRT's log."""
    logger.drain()
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        messages = logger.drain() or ["(TensorRT logged nothing)"]
        raise ModelLoadError(f"TensorRT could not deserialise engine {origin}: " + " | ".join(messages))
    return engine


def _dims(dims: Any) -> Shape:
    return tuple(int(d) for d in dims)


class TrtEngineView:
    """`_trt_plan.EngineView` over a real ``trt.ICudaEngine``."""

    def __init__(self, trt: Any, engine: Any, caps: TrtCapabilities) -> None:
        self._trt = trt
        self.engine = engine
        self._caps = caps

    def tensor_names(self) -> tuple[str, ...]:
        return tuple(self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors))

    def is_input(self, name: str) -> bool:
        return bool(self.engine.get_tensor_mode(name) == self._trt.TensorIOMode.INPUT)

    def dtype_name(self, name: str) -> str:
        return str(self.engine.get_tensor_dtype(name).name)

    def shape(self, name: str) -> Shape:
        return _dims(self.engine.get_tensor_shape(name))

    def format_name(self, name: str) -> str:
        return str(self.engine.get_tensor_format(name).name)

    def format_desc(self, name: str) -> str:
        describe = getattr(self.engine, "get_tensor_format_desc", None)
        return str(describe(name)) if describe is not None else ""

    def is_shape_tensor(self, name: str) -> bool:
        check = getattr(self.engine, "is_shape_inference_io", None)
        return bool(check(name)) if check is not None else False

    def num_profiles(self) -> int:
        return int(self.engine.num_optimization_profiles)

    def profile_shapes(self, name: str, profile: int) -> tuple[Shape, Shape, Shape]:
        lo, opt, hi = self.engine.get_tensor_profile_shape(name, profile)
        return _dims(lo), _dims(opt), _dims(hi)

    def device_memory_size(self) -> int:
        if self._caps.device_memory_v2:
            return int(self.engine.device_memory_size_v2)
        return int(self.engine.device_memory_size)

    def profile_device_memory_size(self, profile: int) -> int | None:
        if self._caps.device_memory_v2:
            return int(self.engine.get_device_memory_size_for_profile_v2(profile))
        by_profile = getattr(self.engine, "get_device_memory_size_for_profile", None)
        return int(by_profile(profile)) if by_profile is not None else None


def create_context(trt: Any, engine: Any, strategy: AllocationStrategy, caps: TrtCapabilities) -> Any:
    if caps.allocation_strategies:
        context = engine.create_execution_context(getattr(trt.ExecutionContextAllocationStrategy, strategy))
    else:
        context = engine.create_execution_context()
    if context is None:
        raise ModelLoadError(f"TensorRT could not create an execution context (strategy {strategy}); the "
                             f"device is probably out of memory")
    return context


def set_context_memory(context: Any, ptr: int, size: int, caps: TrtCapabilities) -> None:
    if caps.device_memory_v2:
        context.set_device_memory(ptr, size)
    else:  # 10.0: the write-only property, size implied by the engine
        context.device_memory = ptr
