"""Memory admission for model loads: the engine's side of `edged.memory`.

Before a load: refuse under memory pressure, then reserve the model's expected footprint in the budget,
evicting least-recently-used idle versions when the policy allows. Around the load: measure the real
footprint and charge it instead. After an unload: discharge it and give freed memory back to the system.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from edged.config import MemoryConfig
from edged.engine.version import ModelVersion
from edged.memory import (
    EvictionCandidate,
    FootprintProbe,
    MemoryBudget,
    PressureMonitor,
    measure_footprint,
    read_meminfo,
    release_memory,
)

log = logging.getLogger(__name__)


def version_key(version: ModelVersion) -> str:
    return f"{version.config.name}/{version.version}"


class MemoryGovernor:
    def __init__(self, config: MemoryConfig, pressure: PressureMonitor | None = None,
                 total_memory_bytes: int | None = None) -> None:
        self._config = config
        if total_memory_bytes is None:
            total_memory_bytes = int(read_meminfo().get("MemTotal", 0))
        self.budget = MemoryBudget(config, total_memory_bytes)
        self.pressure = pressure
        self.last_release: dict[str, Any] = {}

    def before_load(self, version: ModelVersion, candidates: Callable[[], list[ModelVersion]],
                    evict: Callable[[ModelVersion], None]) -> None:
        key = version_key(version)
        if self.pressure is not None:
            self.pressure.refuse_if_under_pressure(key)
        try:
            file_bytes = version.path.stat().st_size
        except OSError:
            file_bytes = 0  # the load itself reports the missing file
        by_key: dict[str, ModelVersion] = {}

        def evictable() -> list[EvictionCandidate]:
            found = candidates()
            by_key.update({version_key(v): v for v in found})
            return [EvictionCandidate(version_key(v), v.last_used, v.in_flight) for v in found]

        victims = self.budget.admit(key, self.budget.estimate(key, file_bytes), evictable)
        for victim in victims:
            evict(by_key[victim])

    @contextlib.contextmanager
    def measure(self) -> Iterator[FootprintProbe]:
        with measure_footprint() as probe:
            yield probe

    def after_load(self, version: ModelVersion, probe: FootprintProbe) -> None:
        footprint = probe.footprint
        if footprint is None:
            return
        version.footprint_bytes = max(0, footprint.total_bytes)
        self.budget.commit(version_key(version), version.footprint_bytes)

    def forget(self, version: ModelVersion) -> None:
        """The version is unloaded, evicted, or failed to load: it no longer counts against the budget."""
        self.budget.release(version_key(version))

    def release(self) -> None:
        if not self._config.release_after_unload:
            return
        report = release_memory()
        self.last_release = {"actions": list(report.actions), "released_bytes": report.released_bytes,
                             "rss_after_bytes": report.rss_after_bytes}
        log.info("released %d bytes to the system after unload (%s)", report.released_bytes,
                 ", ".join(report.actions))

    def describe(self) -> dict[str, Any]:
        state = self.pressure.check() if self.pressure is not None else None
        return {
            "budget_bytes": self.budget.limit_bytes,
            "used_bytes": self.budget.used_bytes,
            "charges": dict(self.budget.charges()),
            "policy": self._config.policy,
            "under_pressure": bool(state and state.under_pressure),
            "pressure_reason": state.reason if state else "",
            "mem_available_bytes": state.mem_available_bytes if state else None,
            "last_release": self.last_release,
        }
