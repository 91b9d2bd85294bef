"""Per-tensor I/O buffers for a TensorRT instance: device memory plus copies, or zero-copy mapped memory.

A buffer grows to the largest request seen (256-byte aligned, never empty: TensorRT wants a valid address
even for a zero-size tensor) and is reused. On an integrated GPU the buffer is page-locked host memory
mapped into the device, so an input is written by numpy and an output read back after the stream sync,
with no cudaMemcpy. Freed by `close()`, never by a finaliser.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.backends._trt_cuda import CudaApi, host_view
from edged.backends._trt_scratch import align_up
from edged.backends.base import Array


def buffer_capacity(nbytes: int, current: int) -> int:
    """The capacity to hold ``nbytes``: the current one when it is enough, else ``nbytes`` aligned up."""
    if current > 0 and nbytes <= current:
        return current
    return align_up(max(nbytes, 1))


class IoBuffer:
    def __init__(self, cuda: CudaApi, mapped: bool) -> None:
        self._cuda = cuda
        self.mapped = mapped
        self.capacity = 0
        self.device_ptr = 0
        self._host_ptr = 0
        self._host: Array | None = None

    def ensure(self, nbytes: int) -> None:
        wanted = buffer_capacity(nbytes, self.capacity)
        if wanted == self.capacity:
            return
        self.close()
        if self.mapped:
            self._host_ptr, self.device_ptr = self._cuda.host_alloc_mapped(wanted)
            self._host = host_view(self._host_ptr, wanted)
        else:
            self.device_ptr = self._cuda.malloc(wanted)
        self.capacity = wanted

    def write(self, array: Array, stream: int) -> None:
        """Enqueue (or, mapped, do) the copy of a C-contiguous input into the buffer."""
        self.ensure(array.nbytes)
        if self._host is not None:
            self._host[: array.nbytes] = array.reshape(-1).view(np.uint8)
        elif array.nbytes:
            self._cuda.memcpy_htod_async(self.device_ptr, array, stream)

    def fetch(self, shape: tuple[int, ...], dtype: np.dtype[Any], stream: int) -> Array:
        """Enqueue the copy of an output; after the stream sync, pass the array to `settle`."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._host is not None:
            return self._host[:nbytes].view(dtype).reshape(shape)
        out = np.empty(shape, dtype=dtype)
        if nbytes:
            self._cuda.memcpy_dtoh_async(out, self.device_ptr, stream)
        return out

    def settle(self, fetched: Array) -> Array:
        """After the stream sync: a mapped view must be copied out before the next run overwrites it."""
        return fetched.copy() if self._host is not None else fetched

    def close(self) -> None:
        if self._host_ptr:
            self._host = None
            self._cuda.free_host(self._host_ptr)
        elif self.device_ptr:
            self._cuda.free(self.device_ptr)
        self._host_ptr, self.device_ptr, self.capacity = 0, 0, 0
