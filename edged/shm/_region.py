"""One registered system shared-memory region: an open POSIX shared-memory object and its mapping.

Invariants:
- The object is opened with ``O_NOFOLLOW`` from the shared-memory directory (``/dev/shm`` on Linux, where
  ``shm_open`` keeps its objects) by a key that is one path component, so a key can never name another file.
- Only ``[offset, offset + byte_size)`` of the object is mapped (from the page boundary below ``offset``), and
  every view handed out is checked against the registered bounds, whatever offsets and sizes a request claims.
- Before each use the open descriptor is ``fstat``-ed: an object truncated below the registered end, or
  unlinked, fails the request with an error instead of a SIGBUS when the mapping is touched. (A client that
  truncates its object while a request is reading it can still fault the process: the check narrows that window
  to the request's own execution; edged never maps past the size it saw.)
- A region is closed only when no view of it is alive (``mmap.close`` refuses while numpy arrays export it);
  until then it is retired, not reused, and closed later.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from edged.errors import SharedMemoryError, SharedMemoryInvalid
from edged.protocol.shm_params import ShmReference

SHM_DIR = Path("/dev/shm")
_MAX_KEY = 255


@dataclass(frozen=True)
class Owner:
    """Who registered a region, and the object's owner and group at registration (uid -1: over TCP)."""

    uid: int
    object_uid: int
    object_gid: int


def object_name(key: str) -> str:
    """The file name of a POSIX shared-memory key (``/name`` or ``name``); refuses anything else."""
    name = key[1:] if key.startswith("/") else key
    if (not name or "/" in name or "\0" in name or name in (".", "..")
            or len(name.encode("utf-8", "surrogateescape")) > _MAX_KEY):
        raise SharedMemoryInvalid(f"shared memory key {key!r} is not a POSIX shared-memory name such as "
                                  "'/camera0' (one component, at most 255 bytes)")
    return name


class Region:
    def __init__(self, name: str, key: str, offset: int, byte_size: int, directory: Path = SHM_DIR,
                 registrant_uid: int = -1) -> None:
        if byte_size <= 0:
            raise SharedMemoryInvalid(f"failed to register shared memory region '{name}': byte_size must be "
                                      "positive")
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._fd = _open(directory / object_name(key), key)
        try:
            info = os.fstat(self._fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryInvalid(f"shared memory key {key!r} is not a shared-memory object")
            if offset + byte_size > info.st_size:
                raise SharedMemoryInvalid(
                    f"failed to register shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"is past the end of the {info.st_size}-byte object {key!r}")
            self.owner = Owner(registrant_uid, info.st_uid, info.st_gid)
            self._lead = offset % mmap.ALLOCATIONGRANULARITY
            self._map = mmap.mmap(self._fd, self._lead + byte_size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - self._lead)
        except BaseException:
            os.close(self._fd)
            raise
        self._view = memoryview(self._map)

    # --- use ------------------------------------------------------------------------------------------------
    def readable(self, reference: ShmReference) -> memoryview:
        return self._slice(reference).toreadonly()

    def writable(self, reference: ShmReference) -> memoryview:
        return self._slice(reference)

    def _slice(self, reference: ShmReference) -> memoryview:
        start, size = reference.offset, reference.byte_size
        if start > self.byte_size or size > self.byte_size - start:
            raise SharedMemoryInvalid(
                f"Invalid offset + byte size for shared memory region: '{self.name}' (offset {start} + "
                f"byte_size {size} is past its {self.byte_size} registered bytes)")
        self.check_backing()
        begin = self._lead + start
        return self._view[begin:begin + size]

    def check_backing(self) -> None:
        """Refuse to touch the mapping when the object shrank below the registered end or was unlinked."""
        try:
            info = os.fstat(self._fd)
        except OSError as e:
            raise SharedMemoryError(f"shared memory region '{self.name}' cannot be checked: {e.strerror}") from e
        if info.st_size < self.offset + self.byte_size:
            raise SharedMemoryInvalid(
                f"shared memory region '{self.name}': object {self.key!r} is now {info.st_size} bytes, less than "
                f"the registered end {self.offset + self.byte_size} (was it truncated?); register it again")
        if info.st_nlink == 0:
            raise SharedMemoryInvalid(f"shared memory region '{self.name}': object {self.key!r} was unlinked; "
                                      "unregister the region and register a live object")

    def status(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    # --- release --------------------------------------------------------------------------------------------
    def close(self) -> bool:
        """Unmap and close; False (and nothing closed) while a view of the mapping is still in use."""
        try:
            self._view.release()
        except BufferError:
            return False  # a slice of it is exported to an array that is still alive
        try:
            self._map.close()
        except BufferError:
            self._view = memoryview(self._map)
            return False
        with contextlib.suppress(OSError):
            os.close(self._fd)
        return True


def _open(path: Path, key: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SharedMemoryInvalid(f"Unable to open shared memory region: '{key}' (no such object in "
                                  f"{path.parent})") from None
    except PermissionError:
        raise SharedMemoryInvalid(
            f"Unable to open shared memory region: '{key}': permission denied. edged opens it read-write as its "
            "own user: create it as that user, or give it to a group edged is in with mode 0660 "
            "(edged.client.shm.share_with)") from None
    except OSError as e:
        raise SharedMemoryInvalid(f"Unable to open shared memory region: '{key}': {e.strerror}") from None
