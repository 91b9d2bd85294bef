"""Memory admission for model loads: the engine's side of `edged.memory`.

Before a load: refuse under memory pressure, then reserve the load's expected peak in the budget, evicting
least-recently-used idle versions when the policy allows. Around the load: measure the real footprint and the
peak (VmHWM), charge the footprint instead and remember the peak for the next load of the same file (scaled to
the number of instances that load creates: each instance is a copy of its own). After an
unload: discharge it and give freed memory back to the system.

Each loaded copy has its own charge: a reload's new copy is charged as ``"<name>/<version> (reload)"`` beside
the serving ``"<name>/<version>"`` until the old copy is gone, then takes over the plain key. The serving copy
of the version being loaded is never an eviction candidate for its own reload (that would be a replace, which
the registry decides by its ``[models] reload`` policy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edged.backends.genai_config import (
    generation_limits,
    kv_cache_bytes,
    max_length,
    read_decoder_shape,
    weight_bytes,
)
from edged.config import MemoryConfig
from edged.engine.version import ModelVersion
from edged.memory import (
    EvictionCandidate,
    FootprintProbe,
    MemoryBudget,
    PressureMonitor,
    active_allocator,
    measure_footprint,
    read_meminfo,
    release_memory,
)

log = logging.getLogger(__name__)

GENAI_RUNTIME = "onnxruntime_genai"
def version_key(version: ModelVersion) -> str:
    return f"{version.config.name}/{version.version}"


def reload_key(key: str, number: int = 1) -> str:
    """The budget key of a reload's copy loaded beside the serving one (the second such copy: number 2)."""
    return f"{key} (reload)" if number == 1 else f"{key} (reload {number})"


def file_key(key: str, path: Path) -> str:
    """A model file's identity for its measured peak: a changed file (size or mtime) or external data of another
    size is estimated afresh."""
    try:
        st = path.stat()
    except OSError:
        return key
    return f"{key}@{model_bytes(path)}:{st.st_mtime_ns}"


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the load itself reports the missing file


def model_bytes(path: Path) -> int:
    """What loading the model file ``path`` reads. An ONNX model may keep its weights in external data files
    (past 2 GB it must), which ORT takes only from inside the model's folder: every file under the folder counts.
    Counting model.onnx alone estimated a model of any size at a few hundred bytes."""
    size = file_size(path)
    if path.suffix != ".onnx":
        return size
    total = 0
    for folder, _, names in os.walk(path.parent):
        for name in names:
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return max(total, size)


class MemoryGovernor:
    def __init__(self, config: MemoryConfig, pressure: PressureMonitor | None = None,
                 total_memory_bytes: int | None = None) -> None:
        self._config = config
        if total_memory_bytes is None:
            total_memory_bytes = int(read_meminfo().get("MemTotal", 0))
        self.budget = MemoryBudget(config, total_memory_bytes, active_allocator().name)
        self.pressure = pressure
        self.last_release: dict[str, Any] = {}
        self.last_load: dict[str, Any] = {}
        self._keys: dict[ModelVersion, str] = {}  # each charged copy → its key in the budget
        self._free_at_admission: int | None = None

    def peak_estimate(self, key: str, path: Path, instances: int = 1) -> int:
        """What loading ``instances`` instances of the file ``path`` of version ``key`` is expected to add to the
        process's peak: every backend builds each instance from the file on its own (edged.memory's budget)."""
        return self.budget.estimate(file_key(key, path), model_bytes(path), instances)

    def load_estimate(self, version: ModelVersion) -> int:
        """The expected peak of loading ``version`` (all its instances) plus what it reserves beyond the load
        (a KV cache)."""
        key = version_key(version)
        instances = version.config.instance_count
        if version.config.runtime != GENAI_RUNTIME:
            return self.peak_estimate(key, version.path, instances)
        # genai_config.json is what names the version; the weights are the ONNX files beside it. The KV caches
        # are reserved once: generation runs on the first instance only (edged.engine.generation).
        weights = self.budget.estimate(file_key(key, version.path), weight_bytes(version.path.parent), instances)
        return weights + self.reserved_bytes(version)

    def reserved_bytes(self, version: ModelVersion) -> int:
        """Memory a loaded version takes after its load is measured: the KV caches of a generative model's
        ``max_sequences`` sequences (ORT GenAI allocates them per generator, while generating)."""
        if version.config.runtime != GENAI_RUNTIME:
            return 0
        config = version.config
        shape = read_decoder_shape(version.path.parent, config.name)
        limits = generation_limits(config.name, config.parameters)
        return kv_cache_bytes(shape, limits, config.parameters, config.name)

    def reserve_reason(self, version: ModelVersion) -> str:
        """Why a generative version needs more than its weights, for a refusal's message."""
        config = version.config
        shape = read_decoder_shape(version.path.parent, config.name)
        limits = generation_limits(config.name, config.parameters)
        kv = kv_cache_bytes(shape, limits, config.parameters, config.name)
        return (f"the figure includes the KV cache, {kv / 2**20:.1f} MiB for max_sequences "
                f"{limits.max_sequences} x max_length {max_length(shape, limits)} tokens (lower the model's "
                "max_sequences, max_prompt_tokens or max_output_tokens parameters to need less)")

    def charge_key(self, version: ModelVersion) -> str:
        """The budget key for a copy about to load; refuses under memory pressure."""
        key = version_key(version)
        if self.pressure is not None:
            self.pressure.refuse_if_under_pressure(key)
        charges = self.budget.charges()
        if key not in charges:
            return key
        # A copy still draining after an earlier reload may hold "(reload)" as well: each copy its own key.
        number = 1
        while reload_key(key, number) in charges:
            number += 1
        return reload_key(key, number)

    def admit(self, key: str, needed: int, spare: str, candidates: Callable[[], list[ModelVersion]],
              evict: Callable[[ModelVersion], None]) -> None:
        """Reserve ``needed`` under ``key``, evicting per policy any candidate except model ``spare``'s."""
        by_key: dict[str, ModelVersion] = {}

        def evictable() -> list[EvictionCandidate]:
            found = [v for v in candidates() if v.config.name != spare and v in self._keys]
            by_key.update({self._keys[v]: v for v in found})
            return [EvictionCandidate(self._keys[v], v.last_used, v.in_flight) for v in found]

        victims = self.budget.admit(key, needed, evictable)
        free = self.budget.free_bytes
        self._free_at_admission = None if free is None else free + needed  # loads run one at a time
        for victim in victims:
            evict(by_key[victim])

    def fits_beside(self, serving: list[ModelVersion], candidates: list[ModelVersion]) -> bool:
        """Whether reloads of the ``serving`` copies are expected to fit beside them: their peaks together within
        the free part plus what evicting other models' idle versions could free (policy evict_lru)."""
        free = self.budget.free_bytes
        if free is None:
            return True
        names = {v.config.name for v in serving}
        if self._config.policy == "evict_lru":
            charges = self.budget.charges()
            free += sum(charges.get(self._keys.get(v, ""), 0) for v in candidates
                        if v.config.name not in names and v.in_flight == 0)
        return sum(self.load_estimate(v) for v in serving) <= free

    def charged(self, version: ModelVersion, key: str) -> None:
        """``version`` holds the reservation made under ``key``; a reload's copy whose predecessor was
        unloaded meanwhile (policy replace) takes the plain key."""
        plain = version_key(version)
        if key != plain and plain not in self.budget.charges():
            self.budget.rename(key, plain)
            key = plain
        self._keys[version] = key

    @contextlib.contextmanager
    def measure(self) -> Iterator[FootprintProbe]:
        with measure_footprint() as probe:
            yield probe

    def after_load(self, version: ModelVersion, probe: FootprintProbe) -> None:
        footprint = probe.footprint
        if footprint is None:
            return
        version.footprint_bytes = max(0, footprint.total_bytes) + self.reserved_bytes(version)
        version.load_peak_bytes = footprint.peak_bytes
        key = self._keys.get(version, version_key(version))
        self.budget.commit(key, version.footprint_bytes)
        self.remember_peak(version_key(version), version.path, probe, version.config.instance_count)
        free = self._free_at_admission
        within = free is None or footprint.peak_bytes <= free
        if not within:
            log.warning("loading %s peaked at %d bytes, above the budget's free %d bytes; its next load is "
                        "estimated from this peak", key, footprint.peak_bytes, free)
        self.last_load = {"key": key, "peak_bytes": footprint.peak_bytes, "footprint_bytes": version.footprint_bytes,
                          "free_before_bytes": free, "within_budget": within, "hwm_reset": probe.hwm_reset}

    def remember_peak(self, key: str, path: Path, probe: FootprintProbe, instances: int = 1) -> None:
        """The next estimates for ``key`` loading this same file are the peak measured now for ``instances``
        instances, scaled to the number they load."""
        if probe.footprint is not None:
            self.budget.remember_peak(file_key(key, path), probe.footprint.peak_bytes, instances)

    def forget(self, version: ModelVersion) -> None:
        """The copy is unloaded, evicted, or failed to load: it no longer counts against the budget. A
        reload's new copy waiting beside it takes over the plain key."""
        key = self._keys.pop(version, None)
        if key is None:  # never charged (loaded without the governor, or its admission failed)
            return
        self.budget.release(key)
        if key != version_key(version):
            return
        waiting = [(k, v) for v, k in self._keys.items() if k.startswith(key + " (reload")]
        if waiting:
            other_key, other = min(waiting, key=lambda item: item[0])
            self.budget.rename(other_key, key)
            self._keys[other] = key

    def trim(self) -> None:
        """Return what a load freed (parsed protobufs, an auto-complete session, a failed load) to the system,
        so the footprint charged is what the model holds, not the allocator's leftovers."""
        if self._config.release_after_unload:
            release_memory()

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
            "free_bytes": self.budget.free_bytes,
            "charges": dict(self.budget.charges()),
            "policy": self._config.policy,
            "load_estimate_factor": self.budget.factor,
            "under_pressure": bool(state and state.under_pressure),
            "pressure_reason": state.reason if state else "",
            "mem_available_bytes": state.mem_available_bytes if state else None,
            "last_release": self.last_release,
            "last_load": self.last_load,
        }

