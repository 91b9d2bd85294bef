"""Measure what loading a model costs: process RSS, Jetson unified memory (NvMap), discrete device memory.

A probe takes a baseline when created and the difference when finished. It also measures the load's peak: it
resets the process's VmHWM to the current RSS when created (``clear_refs``), so VmHWM when finished minus RSS
before is what the load added at its highest. Where the reset is refused the same difference is still an upper
bound (VmHWM never undercounts), so an estimate made from it errs on the safe side. RSS is this process's; NvMapMemUsed
is system-wide (another process allocating meanwhile shows up too), so loads should be measured one at a
time. Deltas are signed: a load that frees cached memory can shrink RSS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edged.memory._procfs import PROC, read_hwm_bytes, read_meminfo, read_rss_bytes, reset_hwm

DeviceUsed = Callable[[], int]  # bytes of device memory in use now (e.g. from cudaMemGetInfo or NVML)


@dataclass(frozen=True)
class Footprint:
    rss_bytes: int
    unified_bytes: int | None = None  # Jetson: NvMapMemUsed delta; None where the kernel lacks it
    device_bytes: int | None = None  # discrete GPU: delta of the device_used callable; None without one
    peak_rss_bytes: int | None = None  # VmHWM at the end minus RSS at the start; None without VmHWM

    @property
    def total_bytes(self) -> int:
        """What to charge against the budget: host RSS plus GPU-side memory, negative parts counted as 0.

        Assumes NvMap buffers are not counted in RSS (they are driver mappings); not yet verified on a device.
        """
        gpu = self.unified_bytes if self.unified_bytes is not None else self.device_bytes
        return max(self.rss_bytes, 0) + max(gpu or 0, 0)

    @property
    def peak_bytes(self) -> int:
        """What the load needed at its highest: the RSS peak plus the GPU-side memory it kept."""
        if self.peak_rss_bytes is None:
            return self.total_bytes
        gpu = self.unified_bytes if self.unified_bytes is not None else self.device_bytes
        return max(self.total_bytes, max(self.peak_rss_bytes, 0) + max(gpu or 0, 0))


class FootprintProbe:
    """Token API: ``probe = FootprintProbe()`` before a load, ``probe.finish()`` after it."""

    def __init__(self, proc_root: Path = PROC, device_used: DeviceUsed | None = None) -> None:
        self._proc_root = proc_root
        self._device_used = device_used
        self.hwm_reset = reset_hwm(proc_root)
        self.rss_before_bytes = read_rss_bytes(proc_root)
        self._unified = _nvmap_used(proc_root)
        self._device = device_used() if device_used is not None else None
        self.footprint: Footprint | None = None

    def finish(self) -> Footprint:
        if self.footprint is not None:
            raise RuntimeError("FootprintProbe.finish() called twice")
        unified = _delta(self._unified, _nvmap_used(self._proc_root))
        device_now = self._device_used() if self._device_used is not None else None
        rss_after = read_rss_bytes(self._proc_root)
        hwm = read_hwm_bytes(self._proc_root)
        peak = None if hwm is None else max(hwm, rss_after) - self.rss_before_bytes
        self.footprint = Footprint(rss_after - self.rss_before_bytes, unified, _delta(self._device, device_now),
                                   peak)
        return self.footprint


@contextmanager
def measure_footprint(proc_root: Path = PROC, device_used: DeviceUsed | None = None,
                      ) -> Iterator[FootprintProbe]:
    """``with measure_footprint() as probe: load()`` then ``probe.footprint``; not set if the body raised."""
    probe = FootprintProbe(proc_root, device_used)
    yield probe
    probe.finish()


def _nvmap_used(proc_root: Path) -> int | None:
    return read_meminfo(proc_root).get("NvMapMemUsed")


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before
