"""Client side of system shared memory: create a POSIX shared-memory object, give it to the daemon's group, put
tensors in it, and name it in requests (standard library only: ``os`` and ``mmap`` on ``/dev/shm``).

    with SharedMemoryRegion.create("/camera0", frame.nbytes + 4096) as region:
        region.share_with("edged")                  # the daemon runs as another user: group edged, mode 0660
        region.write(frame)
        client.register_system_shared_memory("cam0", region.key, region.byte_size)
        result = client.infer("detector", {"image": ShmTensor("cam0", frame.shape, "UINT8")},
                              shm_outputs={"boxes": ShmOutput("cam0", 4096, offset=frame.nbytes)})
        boxes = region.read(np.float32, result.shape("boxes"), offset=frame.nbytes)

edged opens regions read-write as its own user. A client running as that user needs nothing more; one running as
another user gives the object to a group the daemon is in with mode 0660 (``share_with``; tritonclient creates
its objects with mode 0600, so ``share_with(key, group)`` exists for those too). Over the Unix socket the daemon
also checks that the caller owns the object or is in its group.
"""

from __future__ import annotations

import grp
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edged.errors import ClientError
from edged.protocol.codec import tensor_bytes
from edged.protocol.datatypes import kserve_datatype, numpy_for

SHM_DIR = Path("/dev/shm")
Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class ShmTensor:
    """An input whose bytes are in registered region ``region`` (``byte_size`` defaults to the tensor's size)."""

    region: str
    shape: tuple[int, ...]
    datatype: str
    offset: int = 0
    byte_size: int | None = None

    def size(self) -> int:
        if self.byte_size is not None:
            return self.byte_size
        count = 1
        for dim in self.shape:
            count *= dim
        return count * numpy_for(self.datatype, "input").itemsize

    def parameters(self) -> dict[str, Any]:
        return {"shared_memory_region": self.region, "shared_memory_byte_size": self.size(),
                "shared_memory_offset": self.offset}


@dataclass(frozen=True)
class ShmOutput:
    """Where the daemon should write an output: ``byte_size`` bytes from ``offset`` in region ``region``."""

    region: str
    byte_size: int
    offset: int = 0

    def parameters(self) -> dict[str, Any]:
        return {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size,
                "shared_memory_offset": self.offset}


def _path(key: str) -> Path:
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"shared memory key {key!r} is not a POSIX shared-memory name such as '/camera0'")
    return SHM_DIR / name


def _group_id(group: str | int) -> int:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ClientError(f"no group {group!r} on this machine: sharing a region is needed only when the daemon "
                          "runs as another user; name a group that user is in (`id edged` lists them)") from None


def _give(fd: int, key: str, group: str | int, mode: int) -> None:
    gid = _group_id(group)
    try:
        os.fchown(fd, -1, gid)
    except PermissionError as e:
        raise ClientError(f"cannot give shared memory {key!r} to group {group!r}: {e.strerror}; only a member "
                          "of the group (or root) may hand an object to it (`id` lists your groups)") from e
    os.fchmod(fd, mode)


def share_with(key: str, group: str | int, mode: int = 0o660) -> None:
    """Give an existing object (one tritonclient made, say) to ``group`` with ``mode`` so the daemon can open it."""
    fd = os.open(_path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _give(fd, key, group, mode)
    finally:
        os.close(fd)


class SharedMemoryRegion:
    """A shared-memory object this process created (or opened) and maps whole."""

    def __init__(self, key: str, fd: int, byte_size: int, owned: bool) -> None:
        self.key = key if key.startswith("/") else "/" + key
        self.byte_size = byte_size
        self._fd = fd
        self._owned = owned
        self._map = mmap.mmap(fd, byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    @classmethod
    def create(cls, key: str, byte_size: int, mode: int = 0o600) -> SharedMemoryRegion:
        """A new object of ``byte_size`` bytes; FileExistsError if ``key`` is taken. Unlinked by ``close``."""
        if byte_size <= 0:
            raise ValueError(f"byte_size must be positive, found {byte_size}")
        fd = os.open(_path(key), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not narrow what was asked for
            os.ftruncate(fd, byte_size)
            return cls(key, fd, byte_size, owned=True)
        except BaseException:
            os.close(fd)
            os.unlink(_path(key))
            raise

    @classmethod
    def open(cls, key: str) -> SharedMemoryRegion:
        """An existing object, mapped whole; ``close`` leaves it in place."""
        fd = os.open(_path(key), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return cls(key, fd, os.fstat(fd).st_size, owned=False)
        except BaseException:
            os.close(fd)
            raise

    def share_with(self, group: str | int, mode: int = 0o660) -> None:
        _give(self._fd, self.key, group, mode)

    def write(self, array: Array, offset: int = 0) -> int:
        """Copy ``array`` in at ``offset`` as the daemon reads it (row-major, little-endian; BYTES elements
        length-prefixed); returns the bytes written."""
        raw = tensor_bytes(np.asarray(array))
        if offset < 0 or offset + len(raw) > self.byte_size:
            raise ValueError(f"{len(raw)} bytes at offset {offset} do not fit the {self.byte_size}-byte region")
        self._map[offset:offset + len(raw)] = raw
        return len(raw)

    def read(self, dtype: Any, shape: tuple[int, ...] | list[int], offset: int = 0) -> Array:
        """A copy of the tensor of ``dtype`` and ``shape`` at ``offset``."""
        wire = np.dtype(dtype).newbyteorder("<")
        count = 1
        for dim in shape:
            count *= dim
        if offset < 0 or offset + count * wire.itemsize > self.byte_size:
            raise ValueError(f"a {list(shape)} {wire.name} tensor at offset {offset} is past the region's end")
        view: Array = np.frombuffer(self._map, wire, count, offset).reshape(shape)
        copied: Array = view.copy()
        return copied

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
        if self._owned:
            _path(self.key).unlink(missing_ok=True)

    def __enter__(self) -> SharedMemoryRegion:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def tensor_for(array: Array, region: str, offset: int = 0) -> ShmTensor:
    """The ShmTensor that names ``array`` after it was written to ``region`` at ``offset``."""
    return ShmTensor(region, tuple(array.shape), kserve_datatype(array), offset, len(tensor_bytes(array))
                     if array.dtype.kind in "OSU" else array.nbytes)
