"""Give freed heap memory back to the kernel after a model is unloaded.

Allocators keep freed pages for reuse; after an unload that is tens to hundreds of MiB the device may need
elsewhere (on a Jetson the GPU shares the same DRAM). Each step talks to the allocator that actually serves
malloc: glibc ``malloc_trim(0)``, jemalloc's all-arenas purge, tcmalloc's ReleaseFreeMemory. Runtime caches
(ONNX Runtime arenas, the torch CUDA cache) are the backends' part.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass

from edged.memory._allocator import AllocatorState, active_allocator
from edged.memory._procfs import read_rss_bytes

log = logging.getLogger(__name__)

# jemalloc 5's MALLCTL_ARENAS_ALL: the pseudo arena index that addresses every arena at once.
MALLCTL_ARENAS_ALL = 4096


@dataclass(frozen=True)
class ReleaseReport:
    allocator: str
    actions: tuple[str, ...]  # the calls made, e.g. ("malloc_trim(0)", "arena.4096.purge")
    rss_before_bytes: int
    rss_after_bytes: int
    seconds: float

    @property
    def released_bytes(self) -> int:
        return self.rss_before_bytes - self.rss_after_bytes


def release_memory(state: AllocatorState | None = None) -> ReleaseReport:
    """Ask the active allocator (``state``, or the one detected now) to return free pages; report RSS."""
    state = state if state is not None else active_allocator()
    started = time.perf_counter()
    before = read_rss_bytes()
    actions: list[str] = []
    if state.name == "jemalloc" and state.library:
        actions += _jemalloc_purge(state.library)
    elif state.name == "tcmalloc" and state.library:
        actions += _tcmalloc_release(state.library)
    actions += _glibc_trim()
    after = read_rss_bytes()
    report = ReleaseReport(state.name, tuple(actions), before, after, time.perf_counter() - started)
    log.debug("released %d bytes via %s", report.released_bytes, ", ".join(actions) or "nothing")
    return report


def _glibc_trim() -> list[str]:
    # Always tried: with another allocator preloaded, glibc still owns what was allocated before it
    # (the dynamic loader's own blocks) and malloc_trim is then a cheap no-op.
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # absent on musl
    if trim is None:
        return []
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return ["malloc_trim(0)"]


def _jemalloc_purge(library: str) -> list[str]:
    # dlopen of an already-mapped object returns the same handle: this reaches the live allocator.
    lib = ctypes.CDLL(library)
    mallctl = lib.mallctl
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    mallctl.restype = ctypes.c_int
    actions = []
    for name in ("thread.tcache.flush", f"arena.{MALLCTL_ARENAS_ALL}.purge"):
        error = mallctl(name.encode("ascii"), None, None, None, 0)
        if error:
            log.warning("jemalloc mallctl(%r) failed with error %d", name, error)
        else:
            actions.append(name)
    return actions


def _tcmalloc_release(library: str) -> list[str]:
    lib = ctypes.CDLL(library)
    release = lib.MallocExtension_ReleaseFreeMemory
    release.argtypes = []
    release.restype = None
    release()
    return ["MallocExtension_ReleaseFreeMemory()"]
