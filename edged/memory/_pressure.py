"""Memory pressure: MemAvailable below a floor, or PSI ``some avg10`` above a ceiling, refuses new loads.

``check()`` reads /proc each time (no thread here; the daemon calls it every
``memory.pressure_check_interval_s`` and before each load). A change between calm and pressure is reported
to the ``on_change`` callback once per transition. Either source may be missing (PSI needs Linux 4.20 with
CONFIG_PSI); a missing source never signals pressure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edged.config import MemoryConfig
from edged.errors import MemoryPressure
from edged.memory._procfs import PROC, read_meminfo, read_psi_some_avg10

MIB = 1024 * 1024


@dataclass(frozen=True)
class PressureState:
    under_pressure: bool
    reason: str
    mem_available_bytes: int | None
    some_avg10: float | None


PressureListener = Callable[[PressureState], None]


class PressureMonitor:
    def __init__(self, proc_root: Path = PROC, min_available_mb: float = 256.0,
                 some_avg10_max: float = 40.0, on_change: PressureListener | None = None) -> None:
        self._proc_root = proc_root
        self._min_available = int(min_available_mb * MIB)
        self._avg10_max = some_avg10_max
        self._on_change = on_change
        self._last: bool = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: MemoryConfig, proc_root: Path = PROC,
                    on_change: PressureListener | None = None) -> PressureMonitor:
        return cls(proc_root, config.pressure_min_available_mb, config.pressure_some_avg10_max, on_change)

    def check(self) -> PressureState:
        available = read_meminfo(self._proc_root).get("MemAvailable")
        avg10 = read_psi_some_avg10(self._proc_root)
        state = self._judge(available, avg10)
        with self._lock:
            changed = state.under_pressure != self._last
            self._last = state.under_pressure
        if changed and self._on_change is not None:
            self._on_change(state)
        return state

    def refuse_if_under_pressure(self, key: str) -> PressureState:
        """Check now; raise MemoryPressure naming ``key`` and the reason if the system is under pressure."""
        state = self.check()
        if state.under_pressure:
            raise MemoryPressure(f"not loading {key}: the system is under memory pressure ({state.reason})")
        return state

    def _judge(self, available: int | None, avg10: float | None) -> PressureState:
        reasons = []
        if available is not None and available < self._min_available:
            reasons.append(f"MemAvailable {available / MIB:.0f} MiB is below the minimum "
                           f"{self._min_available / MIB:.0f} MiB")
        if avg10 is not None and avg10 > self._avg10_max:
            reasons.append(f"memory PSI some avg10 {avg10:.2f}% is above the maximum {self._avg10_max:.2f}%")
        if reasons:
            return PressureState(True, "; ".join(reasons), available, avg10)
        sources = [name for name, value in (("MemAvailable", available), ("PSI", avg10)) if value is None]
        reason = "ok" if not sources else f"ok ({' and '.join(sources)} not available)"
        return PressureState(False, reason, available, avg10)
