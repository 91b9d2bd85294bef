"""Footprints from the real /proc/self and from recorded Jetson /proc/meminfo files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edged.memory import Footprint, FootprintProbe, measure_footprint

MIB = 1024 * 1024

# The layout of /proc/meminfo with the NvMap fields of L4T kernels (docs/jetson.md §6); values illustrative.
JETSON_MEMINFO = """\
MemTotal:        3964656 kB
MemFree:          153452 kB
MemAvailable:    1934240 kB
Buffers:           97424 kB
Cached:          1794804 kB
SwapCached:            0 kB
Active:          2069676 kB
Inactive:        1407612 kB
Shmem:             31524 kB
NvMapMemFree:      33492 kB
NvMapMemUsed:     {used} kB
Slab:             170036 kB
"""


def test_rss_delta_of_a_64_mib_array_is_about_64_mib() -> None:
    with measure_footprint() as probe:
        block = np.ones(64 * MIB, dtype=np.uint8)
    assert probe.footprint is not None
    assert 60 * MIB < probe.footprint.rss_bytes < 72 * MIB
    assert probe.footprint.device_bytes is None
    del block


def test_unified_memory_delta_from_nvmap_on_a_jetson(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    shutil.copy("/proc/self/statm", proc / "self" / "statm")
    (proc / "meminfo").write_text(JETSON_MEMINFO.format(used=411_244), encoding="ascii")
    probe = FootprintProbe(proc_root=proc)
    (proc / "meminfo").write_text(JETSON_MEMINFO.format(used=411_244 + 102_400), encoding="ascii")
    footprint = probe.finish()
    assert footprint.unified_bytes == 100 * MIB
    assert footprint.rss_bytes == 0
    assert footprint.total_bytes == 100 * MIB


def test_no_unified_figure_where_the_kernel_has_no_nvmap() -> None:
    with measure_footprint() as probe:
        pass
    assert probe.footprint is not None and probe.footprint.unified_bytes is None


def test_device_memory_delta_through_the_callable() -> None:
    readings = iter([1_000 * MIB, 1_300 * MIB])
    with measure_footprint(device_used=lambda: next(readings)) as probe:
        pass
    assert probe.footprint is not None and probe.footprint.device_bytes == 300 * MIB


def test_a_failed_load_leaves_no_footprint() -> None:
    with pytest.raises(ValueError), measure_footprint() as probe:
        raise ValueError("load failed")
    assert probe.footprint is None


def test_finishing_twice_is_a_programming_error() -> None:
    probe = FootprintProbe()
    probe.finish()
    with pytest.raises(RuntimeError):
        probe.finish()


def test_total_counts_negative_deltas_as_zero() -> None:
    assert Footprint(rss_bytes=-5 * MIB, unified_bytes=None, device_bytes=2 * MIB).total_bytes == 2 * MIB
