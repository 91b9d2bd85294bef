"""The jtop source: a client of jetson-stats' root service (``/run/jtop.sock``), for non-root daemons.

jetson-stats is imported here only, and only when this source is chosen. `sample_from_jtop` maps the client's
structured attributes (``memory``, ``cpu``, ``gpu``, ``power``, ``temperature``, ``engine``; jetson-stats
4.2+) to a `Sample`; units there are kB for memory, kHz for clocks (but MHz for a GPU read through NVML,
governor ``nvml``), mW for power, °C for temperatures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from edged.errors import TelemetryError
from edged.telemetry._sample import CpuCore, Engine, Rail, Sample

_NVML_GOVERNOR = "nvml"  # jetson-stats' governor name for a GPU it reads through NVML (jtop/core/gpu.py)


def _cpus(cpu: Mapping[str, Any]) -> tuple[CpuCore, ...]:
    cores = []
    for core in cpu.get("cpu", []):
        if not core.get("online", False):
            cores.append(CpuCore(None, None))
            continue
        freq = (core.get("freq") or {}).get("cur")
        cores.append(CpuCore(round(100 - float(core.get("idle", 100))), int(freq) // 1000 if freq else None))
    return tuple(cores)


def _engines(engine: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Engine]:
    out: dict[str, Engine] = {}
    for group in engine.values():
        for name, e in group.items():
            cur = e.get("cur")
            out[name] = Engine(bool(e.get("online")), None, int(cur) // 1000 if cur else None)
    return out


def sample_from_jtop(*, memory: Mapping[str, Any], cpu: Mapping[str, Any], gpu: Mapping[str, Any],
                     power: Mapping[str, Any], temperature: Mapping[str, Any],
                     engine: Mapping[str, Any], t: float) -> Sample:
    ram, swap = memory.get("RAM", {}), memory.get("SWAP", {})
    first_gpu = next(iter(gpu.values()), None)
    gpu_load = gpu_mhz = None
    if first_gpu is not None:
        gpu_load = round(float(first_gpu["status"]["load"]))
        freq = first_gpu.get("freq", {})
        cur = freq.get("cur")
        # Read through NVML (JetPack 7) the clock is NVML's MHz; from devfreq it is kHz.
        scale = 1 if freq.get("governor") == _NVML_GOVERNOR else 1000
        gpu_mhz = int(cur) // scale if cur else None
    rails = {name: Rail(int(r["power"]), int(r["avg"])) for name, r in (power or {}).get("rail", {}).items()}
    temps = {name: float(v["temp"]) for name, v in temperature.items() if v.get("online", True)}
    emc = memory.get("EMC", {})
    return Sample(
        t=t, ram_used_mb=int(ram.get("used", 0)) // 1024, ram_total_mb=int(ram.get("tot", 0)) // 1024,
        swap_used_mb=int(swap["used"]) // 1024 if swap else None,
        swap_total_mb=int(swap["tot"]) // 1024 if swap else None,
        cpu=_cpus(cpu), gpu_load_pct=gpu_load, gpu_freq_mhz=gpu_mhz,
        emc_load_pct=round(float(emc["val"])) if "val" in emc else None,
        emc_freq_mhz=int(emc["cur"]) // 1000 if emc.get("cur") else None,
        temps_c=temps, power_mw=rails, engines=_engines(engine),
    )


class JtopSource:
    def __init__(self, interval_s: float) -> None:
        try:
            from jtop import jtop
        except ImportError as e:
            raise TelemetryError("source 'jtop' needs jetson-stats: pip install 'edged[jetson]'") from e
        self._client: Any = jtop(interval=interval_s)
        self._interval = interval_s
        try:
            self._client.start()
        except Exception as e:  # jtop raises its own JtopException and OS errors for a missing service
            raise TelemetryError(f"cannot reach the jtop service: {e}") from e

    @property
    def name(self) -> str:
        return "jtop"

    @property
    def bad_lines(self) -> int:
        return 0  # structured readings, no lines to refuse; a value too large to store is counted by the store

    def next_sample(self, stop: threading.Event) -> Sample | None:
        try:
            alive = self._client.ok()  # blocks until the service pushes fresh data (one interval)
        except Exception as e:  # jtop re-raises the client thread's own exceptions here
            raise TelemetryError(f"the jtop client failed: {e}") from e
        if stop.is_set() or not alive:
            return None
        c = self._client
        return sample_from_jtop(memory=c.memory, cpu=c.cpu, gpu=c.gpu, power=c.power,
                                temperature=c.temperature, engine=c.engine, t=time.time())

    def close(self) -> None:
        self._client.close()
