"""Scratch arena sizing and sharing, I/O buffers and a whole instance run, over a fake CUDA and context.

The fakes stand in for the GPU only: "device" memory is host memory owned by the fake, copies are memmove,
and the fake execution context computes y = 2x from the addresses it was given, as TensorRT would.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import numpy as np
import pytest

from edged.backends._trt_cuda import DeviceProps
from edged.backends._trt_instance import InstanceSetup, TensorRTInstance, TrtHandles
from edged.backends._trt_io import IoBuffer, buffer_capacity
from edged.backends._trt_meta import TrtCapabilities
from edged.backends._trt_plan import Binding, ProfileRange
from edged.backends._trt_scratch import ScratchArena, align_up, scratch_bytes
from edged.backends.base import InstanceInfo
from edged.errors import InferenceFailed, InvalidInput


class FakeCuda:
    provider = "fake"
    supports_mapped_host = True

    def __init__(self) -> None:
        self.blocks: dict[int, np.ndarray[Any, Any]] = {}
        self.mallocs = 0
        self.frees = 0
        self.copies = 0
        self.streams = 0

    def _alloc(self, nbytes: int) -> int:
        block = np.zeros(nbytes, np.uint8)
        ptr = int(block.ctypes.data)
        self.blocks[ptr] = block
        return ptr

    def device_properties(self, device: int = 0) -> DeviceProps:
        return DeviceProps(0, "Fake Orin", "8.7", True, 8 << 30, True)

    def malloc(self, nbytes: int) -> int:
        self.mallocs += 1
        return self._alloc(nbytes)

    def free(self, ptr: int) -> None:
        self.frees += 1
        del self.blocks[ptr]

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        ptr = self._alloc(nbytes)
        return ptr, ptr

    def free_host(self, ptr: int) -> None:
        del self.blocks[ptr]

    def memcpy_htod_async(self, dst: int, src: Any, stream: int) -> None:
        self.copies += 1
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def memcpy_dtoh_async(self, dst: Any, src: int, stream: int) -> None:
        self.copies += 1
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def stream_create(self) -> int:
        self.streams += 1
        return 1000 + self.streams

    def stream_destroy(self, stream: int) -> None:
        self.streams -= 1

    def stream_sync(self, stream: int) -> None:
        pass


class FakeLogger:
    def drain(self) -> list[str]:
        return []


class FakeContext:
    """y = 2 * x over addresses, with the calls TensorRT's IExecutionContext takes."""

    in_arena = 0  # contexts inside execute on the shared scratch, across instances

    def __init__(self, arena_guard: threading.Lock | None = None) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.profile_calls: list[int] = []
        self.device_memory: tuple[int, int] | None = None
        self.guard = arena_guard
        self.overlaps = 0

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        self.profile_calls.append(profile)
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes.get("x", (-1, 4)) if name == "y" else self.shapes[name]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def set_device_memory(self, ptr: int, size: int) -> None:
        self.device_memory = (ptr, size)

    def execute_async_v3(self, stream: int) -> bool:
        if self.guard is not None:
            with self.guard:
                FakeContext.in_arena += 1
                self.overlaps += FakeContext.in_arena > 1
            time.sleep(0.002)
        count = int(np.prod(self.shapes["x"]))
        x = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses["x"]))
        y = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses["y"]))
        y[:] = 2 * x
        if self.guard is not None:
            with self.guard:
                FakeContext.in_arena -= 1
        return True


BINDINGS = (
    Binding("x", True, "FLOAT", (-1, 4), "LINEAR",
            profiles=(ProfileRange((1, 4), (1, 4), (2, 4)), ProfileRange((3, 4), (8, 4), (64, 4)))),
    Binding("y", False, "FLOAT", (-1, 4), "LINEAR"),
)


def instance(cuda: FakeCuda, context: FakeContext, *, zero_copy: bool = False, arena: ScratchArena | None = None,
             name: str = "m/1#0", need: int = 0) -> TensorRTInstance:
    strategy = "USER_MANAGED" if arena is not None else "STATIC"
    setup = InstanceSetup(name, BINDINGS, TrtCapabilities.from_version("10.3.0"), strategy, zero_copy, need)
    if arena is not None:
        arena.register(name, need, cuda)
    handles = TrtHandles(runtime=object(), engine=object(), context=context, logger=FakeLogger())
    return TensorRTInstance(setup, handles, cuda, arena, InstanceInfo(device="cuda:0"))


def test_scratch_size_is_the_max_of_engine_and_profile_sizes_aligned_to_256() -> None:
    assert align_up(1) == 256 and align_up(256) == 256 and align_up(257) == 512
    assert scratch_bytes(1000, [3000, None, 2000]) == 3072
    assert scratch_bytes(5000, []) == 5120


def test_arena_grows_for_a_larger_engine_and_never_shrinks() -> None:
    cuda = FakeCuda()
    arena = ScratchArena()
    arena.register("small", 1000, cuda)
    arena.register("large", 5000, cuda)
    assert arena.size == 5120 and cuda.mallocs == 2 and cuda.frees == 1
    arena.register("medium", 3000, cuda)
    arena.unregister("large")
    assert arena.size == 5120 and cuda.mallocs == 2
    with arena.lease(100) as lease:
        assert lease.size == 5120 and lease.ptr in cuda.blocks
    assert arena.stats()["users"] == {"small": 1024, "medium": 3072}
    arena.close()
    assert cuda.blocks == {} and arena.size == 0


def test_arena_serves_one_cuda_provider() -> None:
    arena = ScratchArena()
    arena.register("a", 256, FakeCuda())
    with pytest.raises(RuntimeError, match="another CUDA provider"):
        arena.register("b", 256, FakeCuda())


def test_buffer_capacity_grows_aligned_and_is_reused() -> None:
    assert buffer_capacity(0, 0) == 256
    assert buffer_capacity(1000, 0) == 1024
    assert buffer_capacity(500, 1024) == 1024
    cuda = FakeCuda()
    buffer = IoBuffer(cuda, mapped=False)
    buffer.ensure(1000)
    first = buffer.device_ptr
    buffer.ensure(800)
    assert buffer.device_ptr == first and cuda.mallocs == 1
    buffer.close()
    assert cuda.blocks == {}


@pytest.mark.parametrize("zero_copy", [False, True])
def test_instance_runs_with_device_copies_or_zero_copy(zero_copy: bool) -> None:
    cuda = FakeCuda()
    context = FakeContext()
    inst = instance(cuda, context, zero_copy=zero_copy)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = inst.run({"x": x}, ["y"])
    np.testing.assert_array_equal(out["y"], 2 * x)
    assert cuda.copies == (0 if zero_copy else 2)
    out2 = inst.run({"x": np.ones((1, 4), np.float32)}, [])
    np.testing.assert_array_equal(out2["y"], np.full((1, 4), 2, np.float32))
    assert out["y"][0, 1] == 2  # earlier results are not overwritten by later runs (mapped views copied)
    inst.close()
    assert cuda.blocks == {} and cuda.streams == 0


def test_profile_is_switched_only_when_the_shape_leaves_it() -> None:
    cuda = FakeCuda()
    context = FakeContext()
    inst = instance(cuda, context)
    for batch in (1, 2, 8, 16, 1):
        inst.run({"x": np.zeros((batch, 4), np.float32)}, ["y"])
    assert context.profile_calls == [0, 1, 0]
    with pytest.raises(InvalidInput, match="no optimisation profile"):
        inst.run({"x": np.zeros((100, 4), np.float32)}, ["y"])
    inst.close()


def test_instance_rejects_unknown_inputs_and_outputs_and_runs_after_close() -> None:
    inst = instance(FakeCuda(), FakeContext())
    with pytest.raises(InvalidInput, match=r"missing \['x'\], unknown \['z'\]"):
        inst.run({"z": np.zeros((1, 4), np.float32)}, ["y"])
    with pytest.raises(InvalidInput, match=r"unknown output\(s\) \['x'\]"):
        inst.run({"x": np.zeros((1, 4), np.float32)}, ["x"])
    inst.close()
    with pytest.raises(InferenceFailed, match="closed"):
        inst.run({"x": np.zeros((1, 4), np.float32)}, ["y"])


def test_user_managed_instances_share_the_arena_one_at_a_time() -> None:
    cuda = FakeCuda()
    arena = ScratchArena()
    guard = threading.Lock()
    contexts = [FakeContext(guard), FakeContext(guard)]
    instances = [instance(cuda, c, arena=arena, name=f"m{i}/1#0", need=(i + 1) * 1000)
                 for i, c in enumerate(contexts)]
    assert arena.size == 2048 and cuda.mallocs == 2  # grown once for the larger engine

    def hammer(inst: TensorRTInstance) -> None:
        for _ in range(20):
            inst.run({"x": np.ones((2, 4), np.float32)}, ["y"])

    threads = [threading.Thread(target=hammer, args=(i,)) for i in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.overlaps for c in contexts) == 0
    assert {c.device_memory for c in contexts} == {(next(iter(arena_ptrs(cuda))), 2048)}
    for inst in instances:
        inst.close()
    assert arena.stats()["users"] == {}
    arena.close()


def arena_ptrs(cuda: FakeCuda) -> list[int]:
    return [ptr for ptr, block in cuda.blocks.items() if block.nbytes == 2048]


class GatedContext(FakeContext):
    """Holds its execution until the test opens the gate, as a long TensorRT execution would."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def execute_async_v3(self, stream: int) -> bool:
        self.entered.set()
        if not self.gate.wait(60):
            raise AssertionError("the test never opened the gate")
        return super().execute_async_v3(stream)


def test_close_during_an_execution_returns_at_once_and_frees_the_engine_when_it_ends() -> None:
    cuda = FakeCuda()
    context = GatedContext()
    inst = instance(cuda, context)
    results: list[Any] = []
    x = np.ones((1, 4), np.float32)
    running = threading.Thread(target=lambda: results.append(inst.run({"x": x}, ["y"])))
    running.start()
    assert context.entered.wait(60)
    closing = threading.Thread(target=inst.close)
    closing.start()
    closing.join(30)  # a bound for a hang, not a measurement: close must not wait for the execution
    assert not closing.is_alive(), "close() waited for the execution (the registry lock would be held meanwhile)"
    assert cuda.streams == 1, "the engine must stay alive while its execution runs"
    context.gate.set()
    running.join(60)
    np.testing.assert_array_equal(results[0]["y"], 2 * x)  # the execution in progress completes
    assert cuda.blocks == {} and cuda.streams == 0, "the deferred close freed the engine after the execution"
    with pytest.raises(InferenceFailed, match="closed"):
        inst.run({"x": x}, ["y"])
