"""Pressure from /proc/meminfo and /proc/pressure/memory in the kernel's formats, in a temp proc root."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.config import MemoryConfig
from edged.errors import MemoryPressure
from edged.memory import PressureMonitor, PressureState

MEMINFO = """\
MemTotal:        7999280 kB
MemFree:          312844 kB
MemAvailable:    {available} kB
Buffers:           40964 kB
Cached:          1263276 kB
SwapCached:            0 kB
SwapTotal:       3999632 kB
SwapFree:        3999632 kB
"""
PSI = """\
some avg10={avg10:.2f} avg60=1.24 avg300=0.31 total=2279301
full avg10=0.00 avg60=0.40 avg300=0.09 total=901723
"""


def write(proc: Path, available_kb: int, avg10: float | None) -> None:
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(MEMINFO.format(available=available_kb), encoding="ascii")
    if avg10 is not None:
        (proc / "pressure").mkdir(exist_ok=True)
        (proc / "pressure" / "memory").write_text(PSI.format(avg10=avg10), encoding="ascii")


def test_calm_system_reports_its_readings(tmp_path: Path) -> None:
    write(tmp_path, 2_000_000, 0.5)
    state = PressureMonitor(tmp_path).check()
    assert state == PressureState(False, "ok", 2_000_000 * 1024, 0.5)


def test_low_mem_available_is_pressure(tmp_path: Path) -> None:
    write(tmp_path, 100 * 1024, 0.0)
    state = PressureMonitor(tmp_path, min_available_mb=256).check()
    assert state.under_pressure
    assert "MemAvailable 100 MiB is below the minimum 256 MiB" in state.reason


def test_psi_stall_share_above_the_ceiling_is_pressure(tmp_path: Path) -> None:
    write(tmp_path, 2_000_000, 55.3)
    state = PressureMonitor(tmp_path, some_avg10_max=40).check()
    assert state.under_pressure and "some avg10 55.30%" in state.reason


def test_kernel_without_psi_judges_by_meminfo_alone(tmp_path: Path) -> None:
    write(tmp_path, 2_000_000, None)
    state = PressureMonitor(tmp_path).check()
    assert not state.under_pressure
    assert state.some_avg10 is None and "PSI not available" in state.reason


def test_transitions_are_reported_once_each(tmp_path: Path) -> None:
    events: list[PressureState] = []
    config = MemoryConfig(pressure_min_available_mb=256)
    monitor = PressureMonitor.from_config(config, tmp_path, events.append)
    for available_mb in (1000, 100, 90, 1000, 1000, 50):
        write(tmp_path, available_mb * 1024, 1.0)
        monitor.check()
    assert [e.under_pressure for e in events] == [True, False, True]


def test_a_load_under_pressure_is_refused_with_the_reason(tmp_path: Path) -> None:
    write(tmp_path, 10 * 1024, 0.0)
    with pytest.raises(MemoryPressure, match=r"not loading resnet/1: .*MemAvailable 10 MiB"):
        PressureMonitor(tmp_path).refuse_if_under_pressure("resnet/1")


def test_the_real_proc_of_this_machine_parses() -> None:
    state = PressureMonitor(min_available_mb=0, some_avg10_max=100).check()
    assert state.mem_available_bytes is not None and state.mem_available_bytes > 0
    assert not state.under_pressure
