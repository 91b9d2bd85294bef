"""The registry of system shared-memory regions behind Triton's ``/v2/systemsharedmemory`` API.

Who may use a region: over the Unix socket a peer may register only an object it owns or whose group it is in
(SO_PEERCRED against the object's owner and group), and may then use, see and unregister only regions it could
have registered itself, so one client cannot make edged read or write another's memory. Root may do anything.
Over TCP there is no peer identity: the caller was admitted by the ``shared-memory`` API category instead, and
the per-region check is skipped.

Limits: at most ``max_regions`` regions and ``max_bytes`` mapped bytes in all; past them registration fails
with the limit's config key in the message. All regions are released on unregister and at shutdown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from edged.errors import (
    PermissionDenied,
    SharedMemoryExists,
    SharedMemoryInvalid,
    SharedMemoryLimit,
    SharedMemoryNotFound,
)
from edged.protocol.shm_params import ShmReference
from edged.shm._region import SHM_DIR, Region


@dataclass(frozen=True)
class Caller:
    """Who asks, as the front end knows it: uid -1 when there is no identity (TCP); groups = primary and
    supplementary groups, from the front end's peer cache."""

    uid: int
    gid: int
    groups: frozenset[int]


TCP_CALLER = Caller(-1, -1, frozenset())
MAX_REGION_NAME_BYTES = 1024


@dataclass(frozen=True)
class ShmLimits:
    max_regions: int = 64
    max_bytes: int = 1 << 30


class SharedMemoryRegistry:
    def __init__(self, limits: ShmLimits = ShmLimits(), directory: Path = SHM_DIR) -> None:
        self._limits = limits
        self._directory = directory
        self._regions: dict[str, Region] = {}
        self._retired: list[Region] = []  # unregistered while a view was in use; closed when it is not
        self._lock = threading.Lock()

    # --- the API ------------------------------------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int, peer: Caller) -> None:
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > MAX_REGION_NAME_BYTES:  # kept as long as the region is: a gRPC message could make it 60 MB
            raise SharedMemoryInvalid(f"failed to register shared memory region {name[:64]!r}...: its name is "
                                      f"{size} bytes, longer than {MAX_REGION_NAME_BYTES} bytes; name it briefly, such "
                                      "as 'input0_data'")
        with self._lock:
            self._sweep()
            if name in self._regions:
                raise SharedMemoryExists(f"shared memory region '{name}' already in manager")
            if len(self._regions) >= self._limits.max_regions:
                raise SharedMemoryLimit(f"failed to register shared memory region '{name}': {len(self._regions)} "
                                      f"regions are registered, the limit ([server] shm_max_regions) is "
                                      f"{self._limits.max_regions}")
            mapped = self._mapped_locked()  # regions unregistered but still mapped count: their memory is real
            if mapped + byte_size > self._limits.max_bytes:
                raise SharedMemoryLimit(f"failed to register shared memory region '{name}': {byte_size} more bytes "
                                      f"would map {mapped + byte_size}, above the limit ([server] "
                                      f"shm_max_bytes_mb) of {self._limits.max_bytes}")
            region = Region(name, key, offset, byte_size, self._directory, peer.uid)
            if not _may_use(region, peer, registering=True):
                region.close()
                raise PermissionDenied(f"failed to register shared memory region '{name}': object {key!r} belongs "
                                       f"to uid {region.owner.object_uid} / gid {region.owner.object_gid}, and "
                                       f"the caller (uid {peer.uid}) is neither its owner nor in its group")
            self._regions[name] = region

    def unregister(self, name: str, peer: Caller) -> None:
        """Triton's rule: unregistering a name that is not registered succeeds."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                return
            _check_use(region, peer)
            self._release(name)
            self._sweep()

    def unregister_all(self, peer: Caller) -> None:
        with self._lock:
            for name, region in list(self._regions.items()):
                if _may_use(region, peer):
                    self._release(name)
            self._sweep()

    def sweep(self) -> None:
        """Close the regions unregistered while a view of them was in use, once none is: the server calls it
        periodically, so that a mapping outlives its unregister only as long as a request still holds it."""
        if self._retired:
            with self._lock:
                self._sweep()

    def status(self, name: str, peer: Caller) -> list[dict[str, object]]:
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values() if _may_use(r, peer)]
            region = self._regions.get(name)
            if region is None or not _may_use(region, peer):
                raise SharedMemoryNotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]

    def readable(self, reference: ShmReference, peer: Caller) -> memoryview:
        """The bytes of an input that names a region, read on behalf of ``peer``."""
        return self._region_for(reference, peer).readable(reference)

    def writable(self, reference: ShmReference, peer: Caller) -> memoryview:
        return self._region_for(reference, peer).writable(reference)

    def close(self) -> None:
        with self._lock:
            for name in list(self._regions):
                self._release(name)
            self._sweep()

    # --- accounting ---------------------------------------------------------------------------------------
    @property
    def mapped_bytes(self) -> int:
        """Bytes mapped: registered regions, and unregistered ones a request still holds (not yet swept)."""
        with self._lock:
            return self._mapped_locked()

    def _mapped_locked(self) -> int:
        return sum(r.byte_size for r in self._regions.values()) + sum(r.byte_size for r in self._retired)

    def __len__(self) -> int:
        return len(self._regions)

    def _region_for(self, reference: ShmReference, peer: Caller) -> Region:
        region = self._regions.get(reference.region)
        if region is None:
            raise SharedMemoryInvalid(f"Unable to find shared memory region: '{reference.region}'")
        _check_use(region, peer)
        return region

    def _release(self, name: str) -> None:
        region = self._regions.pop(name)
        if not region.close():
            self._retired.append(region)

    def _sweep(self) -> None:
        self._retired = [region for region in self._retired if not region.close()]


def _may_use(region: Region, peer: Caller, registering: bool = False) -> bool:
    if peer.uid < 0 or peer.uid == 0:
        return True  # TCP (admitted by its API category) or root
    owner = region.owner
    if peer.uid == owner.object_uid or owner.object_gid == peer.gid or owner.object_gid in peer.groups:
        return True
    return not registering and peer.uid == owner.uid


def _check_use(region: Region, peer: Caller) -> None:
    if not _may_use(region, peer):
        raise PermissionDenied(f"shared memory region '{region.name}' was registered for another user; the "
                               f"caller (uid {peer.uid}) may not use it")
