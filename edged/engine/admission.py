"""How a load meets the memory budget and the ``[models] reload`` policy; runs under the registry's lock.

Each step of a load reserves its expected peak first: the auto-complete pass (it opens the newest model file
once) and then each version. When the serving copies of a reload are what stands in the way, the policy
decides: "side_by_side" refuses the reload with the budget's figures and the old copy keeps serving; "auto"
and "replace" unload the old copy first (the version is unavailable until the new copy is ready).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from edged.backends import Backend
from edged.config import ModelsConfig
from edged.engine.completion import SELF_DESCRIBING
from edged.engine.lifecycle import ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.engine.record import ModelRecord
from edged.engine.version import ModelVersion
from edged.errors import EdgedError, MemoryBudgetExceeded
from edged.repository import confined_path
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)


class Admission:
    def __init__(self, memory: MemoryGovernor | None, settings: ModelsConfig,
                 candidates: Callable[[], list[ModelVersion]], evict: Callable[[ModelVersion], None],
                 unload_now: Callable[[ModelVersion], None], stopping: threading.Event | None = None) -> None:
        self._memory = memory
        self._stopping = stopping  # set: a load gives up at its next instance (the daemon stops)
        self._settings = settings
        self._candidates = candidates
        self._evict = evict
        self._unload_now = unload_now

    def should_vacate(self, leaving: list[ModelVersion]) -> bool:
        """Whether a reload of ``leaving`` unloads them first: always under "replace", under "auto" when the
        new copies are not expected to fit beside them."""
        if self._settings.reload == "replace":
            return True
        return (self._settings.reload == "auto" and self._memory is not None
                and not self._memory.fits_beside(leaving, self._candidates()))

    @contextlib.contextmanager
    def describing(self, record: ModelRecord, config: ModelConfig | None, runtime: str, model_dir: Path,
                    available: list[int], reloading: list[int]) -> Iterator[None]:
        """Auto-complete opens the newest model file once: reserve that peak in the budget for its time."""
        memory = self._memory
        if memory is None or runtime not in SELF_DESCRIBING or not self._settings.autocomplete or not available:
            yield
            return
        probe = ModelConfig(name=record.name, backend=runtime) if config is None else config
        newest = max(available)
        key = f"{record.name}/{newest} (auto-complete)"
        path = confined_path(model_dir, probe.model_filename, "default_model_filename", under=str(newest),
                             must_exist=False)
        self.reserve(record, key, memory.peak_estimate(key, path), reloading)
        try:
            with memory.measure() as measured:
                yield
            memory.remember_peak(key, path, measured)
        finally:
            memory.budget.release(key)
            memory.trim()

    def reserve(self, record: ModelRecord, key: str, needed: int, reloading: list[int]) -> None:
        """Admit ``needed`` bytes under ``key``; when the serving copies of a reload are in the way, follow
        the reload policy: refuse ("side_by_side") or unload them first ("auto")."""
        memory = self._memory
        if memory is None:
            return
        try:
            memory.admit(key, needed, record.name, self._candidates, self._evict)
        except MemoryBudgetExceeded as e:
            serving = [n for n in reloading if n in record.versions]
            if not serving:
                raise
            if self._settings.reload == "side_by_side":
                raise MemoryBudgetExceeded(f"{e}; reload refused, the loaded copy keeps serving ([models] reload "
                                           "= \"side_by_side\"; \"replace\" or \"auto\" unload it first)") from e
            self.replace(record, serving)
            memory.admit(key, needed, record.name, self._candidates, self._evict)

    def announce_replace(self, record: ModelRecord, number: int) -> None:
        log.warning("model %s version %s is unavailable until its reload is ready: the loaded copy is unloaded "
                    "first ([models] reload = %r)", record.name, number, self._settings.reload)

    def replace(self, record: ModelRecord, numbers: list[int]) -> None:
        """Unload the serving copies of ``numbers`` before their reload, so both never share the memory."""
        for number in numbers:
            old = record.versions.get(number)
            if old is None:
                continue
            self.announce_replace(record, number)
            record.drop(number)
            self._unload_now(old)

    def load_detached(self, version: ModelVersion, backend: Backend) -> None:
        """Load a version that no record serves (OTA staging): admitted only into free memory, evicting nothing."""
        self._load(version, backend, lambda memory, key, needed: memory.admit(key, needed, version.config.name,
                                                                              list, self._evict))

    def load_version(self, record: ModelRecord, version: ModelVersion, backend: Backend) -> None:
        self._load(version, backend, lambda memory, key, needed: self.reserve(record, key, needed,
                                                                              [version.version]))

    def _load(self, version: ModelVersion, backend: Backend,
              admit: Callable[[MemoryGovernor, str, int], None]) -> None:
        """Reserve the load's expected peak (``admit`` decides how), load while measuring, charge the result."""
        memory = self._memory
        if memory is None:
            version.load(backend, self._settings.warmup, self._stopping, self._settings.stall_timeout_s)
            return
        key = memory.charge_key(version)
        try:
            try:
                admit(memory, key, memory.load_estimate(version))
            except MemoryBudgetExceeded as e:
                if not memory.reserved_bytes(version):
                    raise
                raise MemoryBudgetExceeded(f"{e}; {memory.reserve_reason(version)}") from e
        except EdgedError as e:
            # refused before version.load() began: it made nothing, and would otherwise stay LOADING for ever in
            # the index (Triton's UNAVAILABLE, with the budget's figures, until a later load that fits)
            version.lifecycle.move(ModelState.UNLOADED, str(e))
            raise
        memory.charged(version, key)
        try:
            with memory.measure() as probe:
                version.load(backend, self._settings.warmup, self._stopping, self._settings.stall_timeout_s)
                memory.trim()
        except BaseException:
            memory.forget(version)
            memory.trim()
            raise
        memory.after_load(version, probe)
