"""One loaded TensorRT engine with its execution context, stream and I/O buffers.

A run: pick the optimisation profile whose [min, max] holds the request (`set_optimization_profile_async`
on a change), `set_input_shape` for dynamic inputs, read output shapes from the context, grow buffers,
copy inputs, `set_tensor_address` for every I/O tensor, `execute_async_v3` on the instance's own
non-default stream, copy outputs, synchronise. One run at a time per instance (a context is not
thread-safe). With USER_MANAGED the whole run holds the shared scratch arena's lease.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.backends._trt_cuda import CudaApi, CudaError
from edged.backends._trt_io import IoBuffer
from edged.backends._trt_meta import TrtCapabilities
from edged.backends._trt_plan import TRT_TO_NUMPY, Binding, Shape, select_profile
from edged.backends._trt_runtime import AllocationStrategy, set_context_memory
from edged.backends._trt_scratch import ScratchArena
from edged.backends.base import Array, InstanceInfo
from edged.errors import InferenceFailed, InvalidInput


@dataclass
class TrtHandles:
    """The TensorRT objects of one instance, dropped in order (context, engine, runtime) by close()."""

    runtime: Any
    engine: Any
    context: Any
    logger: Any


@dataclass(frozen=True)
class InstanceSetup:
    name: str  # "model/version#index", for messages and arena bookkeeping
    bindings: tuple[Binding, ...]
    caps: TrtCapabilities
    strategy: AllocationStrategy
    zero_copy: bool
    scratch_need: int  # bytes; 0 unless USER_MANAGED


def check_input(binding: Binding, array: Array) -> Array:
    expected = TRT_TO_NUMPY[binding.dtype]
    if array.dtype != expected:
        raise InvalidInput(f"input {binding.name!r}: expected dtype {expected}, found {array.dtype}")
    if not binding.is_dynamic and tuple(array.shape) != binding.shape:
        raise InvalidInput(f"input {binding.name!r}: expected shape {list(binding.shape)}, found "
                           f"{list(array.shape)}")
    if binding.is_dynamic and len(array.shape) != len(binding.shape):
        raise InvalidInput(f"input {binding.name!r}: expected {len(binding.shape)} dimensions "
                           f"{list(binding.shape)}, found {list(array.shape)}")
    return np.ascontiguousarray(array)


class TensorRTInstance:
    def __init__(self, setup: InstanceSetup, handles: TrtHandles, cuda: CudaApi, arena: ScratchArena | None,
                 info: InstanceInfo) -> None:
        self.info = info
        self._setup = setup
        self._handles: TrtHandles | None = handles
        self._cuda = cuda
        self._arena = arena
        self._lock = threading.Lock()
        # close() never waits for an execution: when one holds _lock it sets _close_requested, and run() closes
        # before it lets go. _flag_lock makes the check and the release of _lock one step, so no close is lost.
        self._flag_lock = threading.Lock()
        self._close_requested = False
        self._stream = cuda.stream_create()
        self._profile = -1  # none selected yet
        self._by_name = {b.name: b for b in setup.bindings}
        self._buffers = {b.name: IoBuffer(cuda, setup.zero_copy) for b in setup.bindings}

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        self._lock.acquire()
        try:
            return self._run_locked(inputs, output_names)
        finally:
            with self._flag_lock:
                try:
                    if self._close_requested:
                        self._close_locked()
                finally:
                    self._lock.release()

    def _run_locked(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        if self._handles is None:
            raise InferenceFailed(f"TensorRT instance {self._setup.name} is closed")
        arrays = self._checked_inputs(inputs)
        wanted = list(output_names) or [b.name for b in self._setup.bindings if not b.is_input]
        unknown = [n for n in wanted if n not in self._by_name or self._by_name[n].is_input]
        if unknown:
            raise InvalidInput(f"unknown output(s) {unknown} for {self._setup.name}")
        try:
            with self._scratch() as scratch:
                if scratch is not None:
                    set_context_memory(self._handles.context, scratch.ptr, scratch.size, self._setup.caps)
                return self._execute(self._handles, arrays, wanted)
        except CudaError as e:
            raise InferenceFailed(f"{self._setup.name}: {e}") from e

    def _checked_inputs(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        expected = [b for b in self._setup.bindings if b.is_input]
        missing = [b.name for b in expected if b.name not in inputs]
        extra = [n for n in inputs if n not in self._by_name or not self._by_name[n].is_input]
        if missing or extra:
            raise InvalidInput(f"{self._setup.name}: expected inputs {[b.name for b in expected]}, missing "
                               f"{missing}, unknown {extra}")
        return {b.name: check_input(b, inputs[b.name]) for b in expected}

    def _scratch(self) -> contextlib.AbstractContextManager[Any]:
        if self._arena is None or self._setup.strategy != "USER_MANAGED":
            return contextlib.nullcontext(None)
        return self._arena.lease(self._setup.scratch_need)

    def _select_profile(self, context: Any, shapes: Mapping[str, Shape]) -> None:
        profile = select_profile(self._setup.bindings, shapes, max(self._profile, 0))
        if profile != self._profile:
            if not context.set_optimization_profile_async(profile, self._stream):
                raise InferenceFailed(f"{self._setup.name}: TensorRT refused optimisation profile {profile}")
            self._profile = profile

    def _execute(self, handles: TrtHandles, arrays: Mapping[str, Array],
                 wanted: Sequence[str]) -> dict[str, Array]:
        context = handles.context
        self._select_profile(context, {name: tuple(a.shape) for name, a in arrays.items()})
        for name, array in arrays.items():
            if self._by_name[name].is_dynamic and not context.set_input_shape(name, tuple(array.shape)):
                raise InvalidInput(f"{self._setup.name}: TensorRT rejected shape {list(array.shape)} "
                                   f"for input {name!r}")
        out_shapes = self._output_shapes(context)
        for name, array in arrays.items():
            self._buffers[name].write(array, self._stream)
        for name, shape in out_shapes.items():
            itemsize = TRT_TO_NUMPY[self._by_name[name].dtype].itemsize
            self._buffers[name].ensure(int(np.prod(shape, dtype=np.int64)) * itemsize)
        for name, buffer in self._buffers.items():
            if not context.set_tensor_address(name, buffer.device_ptr):
                raise InferenceFailed(f"{self._setup.name}: TensorRT refused the address of tensor {name!r}")
        handles.logger.drain()
        if not context.execute_async_v3(self._stream):
            messages = " | ".join(handles.logger.drain()) or "(TensorRT logged nothing)"
            raise InferenceFailed(f"{self._setup.name}: execute_async_v3 failed: {messages}")
        fetched = {name: self._buffers[name].fetch(out_shapes[name], TRT_TO_NUMPY[self._by_name[name].dtype],
                                                   self._stream) for name in wanted}
        self._cuda.stream_sync(self._stream)
        return {name: self._buffers[name].settle(array) for name, array in fetched.items()}

    def _output_shapes(self, context: Any) -> dict[str, Shape]:
        shapes = {}
        for binding in self._setup.bindings:
            if binding.is_input:
                continue
            shape = tuple(int(d) for d in context.get_tensor_shape(binding.name))
            if any(d < 0 for d in shape):
                raise InferenceFailed(f"{self._setup.name}: output {binding.name!r} has a data-dependent "
                                      f"shape {list(shape)}, which edged does not support")
            shapes[binding.name] = shape
        return shapes

    def release_memory(self) -> None:
        """Buffers are sized to the largest request; shrinking them would only allocate again."""

    def close(self) -> None:
        """Free the engine now, or, while an execution runs, as soon as it ends: close never waits for an
        execution (the registry may call it with its lock held)."""
        with self._flag_lock:
            if not self._lock.acquire(blocking=False):
                self._close_requested = True
                return
        try:
            self._close_locked()
        finally:
            self._lock.release()

    def _close_locked(self) -> None:
        if self._handles is None:
            return
        try:
            self._cuda.stream_sync(self._stream)
        finally:
            for buffer in self._buffers.values():
                buffer.close()
            self._cuda.stream_destroy(self._stream)
            if self._arena is not None:
                self._arena.unregister(self._setup.name)
            handles, self._handles = self._handles, None
            handles.context = None
            handles.engine = None
            handles.runtime = None
