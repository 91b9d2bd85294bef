"""The CUDA calls the TensorRT backend needs, behind one tiny interface.

Three providers, tried in order: cuda-python's ``cuda.bindings.runtime`` (12.x and 13.x), the old
``cuda.cudart`` module (cuda-python < 12.6; removed in 13.0), and torch.cuda when only torch is present.
Device pointers and stream handles are plain ints, as TensorRT's Python API takes them. Host-side buffers are
numpy arrays, so that the torch provider can copy without raw host pointers.

On an integrated GPU (Jetson: ``cudaDeviceProp.integrated == 1``) CPU and GPU share DRAM, so the backend uses
page-locked mapped host memory (``cudaHostAlloc(cudaHostAllocMapped)`` + ``cudaHostGetDevicePointer``) as
zero-copy I/O buffers; only the cuda-python providers can allocate it.

Failures raise `CudaError`, a foreign error that the backend translates at its boundary (ModelLoadError
while loading, InferenceFailed while running).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edged.backends.base import Array
from edged.errors import BackendUnavailable

CUDA_MISSING_HINT = (
    "install cuda-python pinned to the CUDA release of your JetPack (e.g. pip install 'cuda-python==12.6.*' "
    "on JetPack 6.1/6.2), or a CUDA build of torch"
)


class CudaError(Exception):
    """A CUDA runtime call failed; the message names the call and the CUDA error."""


@dataclass(frozen=True)
class DeviceProps:
    index: int
    name: str
    compute_capability: str  # "8.7"
    integrated: bool
    total_memory: int
    can_map_host_memory: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "compute_capability": self.compute_capability,
            "integrated": self.integrated, "total_memory": self.total_memory,
            "can_map_host_memory": self.can_map_host_memory,
        }


class CudaApi(Protocol):
    provider: str  # the module that backs it: "cuda.bindings.runtime", "cuda.cudart" or "torch.cuda"
    supports_mapped_host: bool

    def device_properties(self, device: int = 0) -> DeviceProps: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        """Page-locked host memory mapped into the device: (host pointer, device pointer)."""
        ...
    def free_host(self, ptr: int) -> None: ...
    def memcpy_htod_async(self, dst: int, src: Array, stream: int) -> None: ...
    def memcpy_dtoh_async(self, dst: Array, src: int, stream: int) -> None: ...
    def stream_create(self) -> int: ...
    def stream_destroy(self, stream: int) -> None: ...
    def stream_sync(self, stream: int) -> None: ...


def host_view(ptr: int, nbytes: int) -> Array:
    """A uint8 numpy view of ``nbytes`` of host memory at ``ptr`` (mapped buffers)."""
    import ctypes

    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class CudaPythonApi:
    """cuda-python's runtime module: every call returns ``(cudaError_t, *values)``."""

    supports_mapped_host = True

    def __init__(self, runtime: Any, provider: str) -> None:
        self._rt = runtime
        self.provider = provider
        self._streams: dict[int, Any] = {}

    def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self._rt, name)(*args)
        err = result[0]
        if err != self._rt.cudaError_t.cudaSuccess:
            raise CudaError(f"{name} failed: {getattr(err, 'name', err)}")
        values = result[1:]
        return values[0] if len(values) == 1 else values

    def device_properties(self, device: int = 0) -> DeviceProps:
        prop = self._call("cudaGetDeviceProperties", device)
        raw_name = prop.name
        name = raw_name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw_name, bytes) \
            else str(raw_name)
        return DeviceProps(
            index=device, name=name, compute_capability=f"{prop.major}.{prop.minor}",
            integrated=bool(prop.integrated), total_memory=int(prop.totalGlobalMem),
            can_map_host_memory=bool(prop.canMapHostMemory))

    def malloc(self, nbytes: int) -> int:
        return int(self._call("cudaMalloc", nbytes))

    def free(self, ptr: int) -> None:
        self._call("cudaFree", ptr)

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        host = int(self._call("cudaHostAlloc", nbytes, self._rt.cudaHostAllocMapped))
        try:
            device = int(self._call("cudaHostGetDevicePointer", host, 0))
        except CudaError:
            self._call("cudaFreeHost", host)
            raise
        return host, device

    def free_host(self, ptr: int) -> None:
        self._call("cudaFreeHost", ptr)

    def memcpy_htod_async(self, dst: int, src: Array, stream: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call("cudaMemcpyAsync", dst, src.ctypes.data, src.nbytes, kind, self._streams[stream])

    def memcpy_dtoh_async(self, dst: Array, src: int, stream: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call("cudaMemcpyAsync", dst.ctypes.data, src, dst.nbytes, kind, self._streams[stream])

    def stream_create(self) -> int:
        # Never the default stream: TensorRT adds device-wide synchronisation on it.
        stream = self._call("cudaStreamCreateWithFlags", self._rt.cudaStreamNonBlocking)
        handle = int(stream)
        self._streams[handle] = stream
        return handle

    def stream_destroy(self, stream: int) -> None:
        self._call("cudaStreamDestroy", self._streams.pop(stream))

    def stream_sync(self, stream: int) -> None:
        self._call("cudaStreamSynchronize", self._streams[stream])


class TorchCudaApi:
    """torch.cuda as the CUDA provider: memory is torch tensors kept alive by pointer; no mapped memory."""

    provider = "torch.cuda"
    supports_mapped_host = False

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._blocks: dict[int, Any] = {}
        self._streams: dict[int, Any] = {}

    def device_properties(self, device: int = 0) -> DeviceProps:
        prop = self._torch.cuda.get_device_properties(device)
        return DeviceProps(
            index=device, name=str(prop.name), compute_capability=f"{prop.major}.{prop.minor}",
            integrated=bool(getattr(prop, "is_integrated", False)), total_memory=int(prop.total_memory),
            can_map_host_memory=False)

    def malloc(self, nbytes: int) -> int:
        try:
            block = self._torch.empty(max(nbytes, 1), dtype=self._torch.uint8, device="cuda")
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            raise CudaError(f"torch.empty({nbytes} bytes on cuda) failed: {e}") from e
        ptr = int(block.data_ptr())
        self._blocks[ptr] = block
        return ptr

    def free(self, ptr: int) -> None:
        self._blocks.pop(ptr, None)

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        raise CudaError("mapped host memory needs cuda-python; torch.cuda cannot allocate it")

    def free_host(self, ptr: int) -> None:
        raise CudaError("mapped host memory needs cuda-python; torch.cuda cannot free it")

    def memcpy_htod_async(self, dst: int, src: Array, stream: int) -> None:
        block = self._blocks[dst]
        flat = self._torch.from_numpy(np.ascontiguousarray(src).reshape(-1).view(np.uint8))
        with self._torch.cuda.stream(self._streams[stream]):
            block[: flat.numel()].copy_(flat, non_blocking=True)

    def memcpy_dtoh_async(self, dst: Array, src: int, stream: int) -> None:
        block = self._blocks[src]
        flat = self._torch.from_numpy(dst.reshape(-1).view(np.uint8))
        with self._torch.cuda.stream(self._streams[stream]):
            flat.copy_(block[: flat.numel()])

    def stream_create(self) -> int:
        stream = self._torch.cuda.Stream()
        handle = int(stream.cuda_stream)
        self._streams[handle] = stream
        return handle

    def stream_destroy(self, stream: int) -> None:
        self._streams.pop(stream, None)

    def stream_sync(self, stream: int) -> None:
        self._streams[stream].synchronize()


def load_cuda_api() -> CudaApi:
    """The first CUDA provider that imports; BackendUnavailable when none does."""
    for module_name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            runtime = importlib.import_module(module_name)
        except ImportError:
            continue
        return CudaPythonApi(runtime, module_name)
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        return TorchCudaApi(torch)
    raise BackendUnavailable(f"no CUDA binding for the TensorRT backend: {CUDA_MISSING_HINT}")
