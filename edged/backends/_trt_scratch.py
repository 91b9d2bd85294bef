"""One device-memory scratch area shared by TensorRT execution contexts that never run at the same time.

With ``execution_context_allocation_strategy: USER_MANAGED`` a context owns no activation memory; the caller
hands it a block with ``set_device_memory(ptr, size)`` before each execution. On a Jetson, where every MiB
of DRAM is shared with the CPU, models that take turns can share one block sized for the largest of them
instead of each holding its own.

Invariants: the block is 256-byte aligned (cudaMalloc gives 256) and sized to a multiple of 256; it only
grows, when an engine that needs more is registered or leased; it is replaced (freed and allocated again)
only while the lock is held, and a lease holds the lock from handing the block to a context until the
stream has been synchronised, so two contexts never use it at once. The backend owns one; the daemon may
pass the same arena to several backends. Freed by `close()`, never by a finaliser.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from edged.backends._trt_cuda import CudaApi

ALIGNMENT = 256


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def scratch_bytes(engine_size: int, profile_sizes: Sequence[int | None] = ()) -> int:
    """What one engine needs from the arena: the max of its whole-engine and per-profile sizes, aligned."""
    sizes = [engine_size, *(s for s in profile_sizes if s is not None)]
    return align_up(max(sizes))


@dataclass(frozen=True)
class ScratchLease:
    ptr: int
    size: int


class ScratchArena:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cuda: CudaApi | None = None
        self._ptr = 0
        self._size = 0
        self._wanted = 0
        self._grows = 0
        self._users: dict[str, int] = {}

    @property
    def size(self) -> int:
        return self._size

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"bytes": self._size, "grows": self._grows, "users": dict(self._users)}

    def register(self, user: str, nbytes: int, cuda: CudaApi) -> None:
        """Record that ``user`` needs ``nbytes``; grow the block now so the first run does not allocate."""
        with self._lock:
            self._bind(cuda)
            self._users[user] = align_up(nbytes)
            self._wanted = max(self._wanted, align_up(nbytes))
            self._grow_locked(self._wanted)

    def unregister(self, user: str) -> None:
        """The block keeps its size: a later engine of the same size would only allocate it again."""
        with self._lock:
            self._users.pop(user, None)

    @contextmanager
    def lease(self, nbytes: int) -> Iterator[ScratchLease]:
        """Exclusive use of at least ``nbytes`` until the with-block ends (after the stream sync)."""
        with self._lock:
            self._grow_locked(align_up(nbytes))
            yield ScratchLease(self._ptr, self._size)

    def _bind(self, cuda: CudaApi) -> None:
        if self._cuda is None:
            self._cuda = cuda
        elif self._cuda is not cuda:
            raise RuntimeError("ScratchArena is bound to another CUDA provider; one arena serves one device")

    def _grow_locked(self, nbytes: int) -> None:
        if nbytes <= self._size:
            return
        if self._cuda is None:
            raise RuntimeError("ScratchArena.lease before register: no CUDA provider bound")
        if self._ptr:
            self._cuda.free(self._ptr)
            self._ptr, self._size = 0, 0
        self._ptr = self._cuda.malloc(nbytes)
        self._size = nbytes
        self._grows += 1

    def close(self) -> None:
        with self._lock:
            if self._ptr and self._cuda is not None:
                self._cuda.free(self._ptr)
            self._ptr, self._size, self._wanted = 0, 0, 0
            self._users.clear()
