"""iGPU-aware memory: allocator hooks and re-exec, release after unload, footprints, budget, pressure.

On a Jetson the CPU and the GPU share one DRAM, so host heap growth is GPU memory lost. This package decides
and measures; it never loads models. It imports only edged.errors and edged.config.
"""

from edged.memory._allocator import (
    REEXEC_MARKER,
    AllocatorName,
    AllocatorState,
    active_allocator,
    ensure_allocator,
    find_library,
)
from edged.memory._budget import EvictionCandidate, MemoryBudget, budget_bytes
from edged.memory._footprint import DeviceUsed, Footprint, FootprintProbe, measure_footprint
from edged.memory._pressure import PressureListener, PressureMonitor, PressureState
from edged.memory._procfs import read_meminfo, read_rss_bytes
from edged.memory._release import ReleaseReport, release_memory

__all__ = [
    "REEXEC_MARKER", "AllocatorName", "AllocatorState", "DeviceUsed", "EvictionCandidate", "Footprint",
    "FootprintProbe", "MemoryBudget", "PressureListener", "PressureMonitor", "PressureState", "ReleaseReport",
    "active_allocator", "budget_bytes", "ensure_allocator", "find_library", "measure_footprint",
    "read_meminfo", "read_rss_bytes", "release_memory",
]
