"""The sysfs source: works on any Linux, richer on a Jetson (rails, GPU load, trip points, frequency caps)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from edged.telemetry._sample import Sample
from edged.telemetry._sysfs_read import (
    read_cpus,
    read_gpu,
    read_meminfo,
    read_proc_stat,
    read_rails,
    read_thermal,
)


class SysfsSource:
    def __init__(self, root: str, interval_s: float) -> None:
        self._root = Path(root)
        self._interval = interval_s
        self._prev_stat: dict[int, tuple[int, int]] = {}
        self._next_due: float | None = None

    @property
    def name(self) -> str:
        return "sysfs"

    @property
    def bad_lines(self) -> int:
        return 0  # structured readings, no lines to refuse; a value too large to store is counted by the store

    def read(self) -> Sample:
        """One sample now; CPU loads are over the time since the previous call (since boot on the first)."""
        now_stat = read_proc_stat(self._root)
        cores, cpu_cap = read_cpus(self._root, self._prev_stat, now_stat)
        self._prev_stat = now_stat
        mem = read_meminfo(self._root)
        used_kb = (mem.get("MemTotal", 0) - mem.get("MemFree", 0) - mem.get("Buffers", 0)
                   - mem.get("Cached", 0))
        swap_total = mem.get("SwapTotal")
        temps, trips = read_thermal(self._root)
        gpu_load, gpu_mhz, gpu_cap = read_gpu(self._root)
        caps = {k: v for k, v in (("cpu", cpu_cap), ("gpu", gpu_cap)) if v is not None}
        return Sample(
            t=time.time(), ram_used_mb=max(0, used_kb) // 1024, ram_total_mb=mem.get("MemTotal", 0) // 1024,
            swap_used_mb=(swap_total - mem.get("SwapFree", 0)) // 1024 if swap_total else None,
            swap_total_mb=swap_total // 1024 if swap_total else None,
            cpu=tuple(cores), gpu_load_pct=gpu_load, gpu_freq_mhz=gpu_mhz, temps_c=temps,
            power_mw=read_rails(self._root), trips_c=trips, freq_caps=caps,
        )

    def next_sample(self, stop: threading.Event) -> Sample | None:
        now = time.monotonic()
        if self._next_due is None:
            self.read()  # prime /proc/stat so that the first returned load covers one interval
            self._next_due = now + self._interval
        if stop.wait(max(0.0, self._next_due - now)):
            return None
        self._next_due = max(self._next_due + self._interval, time.monotonic())
        return self.read()

    def close(self) -> None:
        return None
