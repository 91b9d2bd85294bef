"""One telemetry sample, whatever source produced it.

Every source (tegrastats, jtop, sysfs, replay) produces `Sample` values; the store, the derived numbers and
the exports only ever see this type. `to_json()` is the exact contract of ``edged telemetry parse``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CpuCore:
    load_pct: int | None  # None: the core is off
    freq_mhz: int | None


@dataclass(frozen=True)
class Rail:
    now_mw: int
    avg_mw: int | None = None


@dataclass(frozen=True)
class Engine:
    """A hardware engine (VIC, NVENC, APE, GR3D2, MTS ...): off, or on with a load and/or frequency."""

    on: bool
    load_pct: int | None = None
    freq_mhz: int | None = None
    extra: tuple[tuple[str, int], ...] = ()  # e.g. MTS: (("fg_pct", 0), ("bg_pct", 0))


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the epoch when the sample was taken (0.0 when unknown, e.g. parse only)
    ram_used_mb: int
    ram_total_mb: int
    timestamp: str | None = None  # the timestamp as printed by tegrastats, if any
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    cpu: tuple[CpuCore, ...] = ()
    gpu_load_pct: int | None = None
    gpu_freq_mhz: int | None = None
    gpu_gpc_freq_mhz: tuple[int, ...] | None = None
    emc_load_pct: int | None = None
    emc_freq_mhz: int | None = None
    temps_c: dict[str, float] = field(default_factory=dict)
    power_mw: dict[str, Rail] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    unparsed: tuple[str, ...] = ()
    # Not part of the tegrastats contract; filled by sources that can read them (sysfs).
    trips_c: dict[str, float] = field(default_factory=dict)  # sensor -> lowest passive/hot trip point
    freq_caps: dict[str, tuple[int, int]] = field(default_factory=dict)  # domain -> (cap MHz, hw max MHz)
    # Device elapsed time (edged.clock) when taken, set only by sources whose timeline is their own (a replay
    # faster than real time); None: the service stamps the clock's elapsed time as the sample arrives.
    elapsed: float | None = None

    def cpu_mean_load(self) -> float | None:
        loads = [c.load_pct for c in self.cpu if c.load_pct is not None]
        return sum(loads) / len(loads) if loads else None

    def to_json(self) -> dict[str, Any]:
        """The ``edged telemetry parse`` object: names as printed, None for absent values."""
        out: dict[str, Any] = {
            "timestamp": self.timestamp,
            "ram_used_mb": self.ram_used_mb,
            "ram_total_mb": self.ram_total_mb,
            "swap_used_mb": self.swap_used_mb,
            "swap_total_mb": self.swap_total_mb,
            "cpu": [{"load_pct": c.load_pct, "freq_mhz": c.freq_mhz} for c in self.cpu],
            "gpu_load_pct": self.gpu_load_pct,
            "gpu_freq_mhz": self.gpu_freq_mhz,
            "emc_load_pct": self.emc_load_pct,
            "emc_freq_mhz": self.emc_freq_mhz,
            "temps_c": dict(self.temps_c),
            "power_mw": {k: {"now": r.now_mw, "avg": r.avg_mw} for k, r in self.power_mw.items()},
            "engines": {k: _engine_json(e) for k, e in self.engines.items()},
            "unparsed": list(self.unparsed),
        }
        if self.gpu_gpc_freq_mhz is not None:
            out["gpu_gpc_freq_mhz"] = list(self.gpu_gpc_freq_mhz)
        return out


def _engine_json(engine: Engine) -> dict[str, Any]:
    out: dict[str, Any] = {"on": engine.on, "load_pct": engine.load_pct, "freq_mhz": engine.freq_mhz}
    out.update(dict(engine.extra))
    return out
