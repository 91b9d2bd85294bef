"""The models of one repository and the rules that load, reload and unload their versions.

A reload builds the new versions next to the serving ones and swaps only when they are ready: a failed reload
leaves the old versions serving. All changes run under one lock.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.backends import Backend
from edged.config import ModelsConfig
from edged.engine.lifecycle import ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.engine.version import ModelVersion
from edged.errors import EdgedError, ModelLoadError, ModelNotFound, ModelNotReady, Unavailable
from edged.repository import (
    autocomplete,
    check_config_files,
    check_model_name,
    confined_path,
    detect_runtime,
    find_models,
    list_versions,
    load_model_config,
    normalize,
    select_versions,
)
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)
READY = ModelState.READY

# Runtimes whose model files carry their inputs and outputs, so a config is completed and checked from them.
SELF_DESCRIBING = frozenset({"onnxruntime", "tensorrt"})


class ModelRecord:
    """A model known to the service: its served versions and the outcome of the last load."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Served versions by number. Replaced (or `drop`ped from) as a whole, never changed in place, so that
        # the cached default below can tell whether it was chosen from the current dict.
        self.versions: dict[int, ModelVersion] = {}
        # The default version (highest ready) with the dict it was chosen from: every request without a version
        # asks for it, so it is chosen once per change of the dict, not per request.
        self._default: tuple[dict[int, ModelVersion], ModelVersion | None] = ({}, None)
        self.failed: dict[int, ModelVersion] = {}  # versions whose last load failed, with the reason
        self.error = ""  # a failure before any version could be tried (bad config, missing runtime)
        self.fingerprint: tuple[Any, ...] = ()
        self.loaded_explicitly = False

    def drop(self, number: int) -> None:
        self.versions = {n: v for n, v in self.versions.items() if n != number}

    def default_version(self) -> ModelVersion | None:
        """The highest ready version, or None."""
        chosen_from, version = self._default
        if chosen_from is self.versions and version is not None and version.lifecycle.state is READY:
            return version
        versions = self.versions
        ready = [v for _, v in sorted(versions.items()) if v.lifecycle.state is READY]
        version = ready[-1] if ready else None
        self._default = (versions, version)
        return version

    def ready_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.state is ModelState.READY]

    def all_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items())]


class Registry:
    def __init__(self, root: Path, settings: ModelsConfig, max_elements: int,
                 backend_loader: Callable[[str], Backend], memory: MemoryGovernor | None,
                 unload_timeout_s: float) -> None:
        self._root = root
        self._settings = settings
        self._max_elements = max_elements
        self._backend_loader = backend_loader
        self._memory = memory
        self._unload_timeout_s = unload_timeout_s
        self._records: dict[str, ModelRecord] = {}
        self._lazy: set[str] = set()
        self._unloaded: dict[str, str] = {}  # model name → why it is no longer loaded, for the index
        self._backends: dict[str, Backend] = {}
        self._lock = threading.RLock()
        self.started = False

    # --- queries -------------------------------------------------------------------------------------------
    def records(self) -> list[ModelRecord]:
        return list(self._records.values())

    def names(self) -> list[str]:
        return sorted(set(self._records) | self._lazy)

    def record(self, name: str) -> ModelRecord:
        record = self._records.get(name)
        if record is None:
            if name in self._lazy:
                raise ModelNotReady(f"model {name} is not loaded yet (lazy loading loads it on first use)")
            raise ModelNotFound(f"unknown model: {name!r} is not in the repository or not loaded")
        return record

    def resolve(self, name: str, version: str) -> ModelVersion:
        record = self._records.get(name) or self.record(name)  # `record` only to raise the fitting error
        if not version:
            served = record.default_version()
            if served is not None:
                return served
            if record.error:
                raise ModelNotReady(f"model {name} is not ready: {record.error}")
            raise ModelNotReady(f"model {name} has no ready version")
        try:
            number = int(version)
        except ValueError:
            raise ModelNotFound(f"model {name}: version {version!r} is not a version number") from None
        served = record.versions.get(number) or record.failed.get(number)
        if served is None:
            known = ", ".join(str(v) for v in sorted(record.versions)) or "none"
            raise ModelNotFound(f"model {name} has no version {version} (served versions: {known})")
        return served

    def needs_lazy_load(self, name: str) -> bool:
        return name in self._lazy

    def ensure_loaded(self, name: str) -> None:
        """Load a lazily registered model; concurrent callers wait for the one load under the lock."""
        if name not in self._lazy:
            return
        with self._lock:
            if name in self._lazy:
                self.load(name, None, explicit=False)

    def all_expected_ready(self) -> bool:
        return all(record.ready_versions() or record.error or record.failed for record in self.records())

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        names = sorted(set(self._safe_find_models()) | set(self._records))
        for name in names:
            record = self._records.get(name)
            versions = sorted({**(record.failed if record else {}), **(record.versions if record else {})}.items())
            if not versions:
                if not ready_only:
                    reason = record.error if record else self._unloaded.get(name, "")
                    known = record is not None or name in self._unloaded
                    entries.append({"name": name, "version": "", "state": "UNAVAILABLE" if known else "",
                                    "reason": reason})
                continue
            for number, version in versions:
                if ready_only and version.state is not ModelState.READY:
                    continue
                entries.append({"name": name, "version": str(number), "state": version.state.value,
                                "reason": version.lifecycle.reason})
        return entries

    def _safe_find_models(self) -> list[str]:
        try:
            return find_models(self._root)
        except (OSError, EdgedError):
            return []

    # --- changes -------------------------------------------------------------------------------------------
    def start(self) -> None:
        names = find_models(self._root)
        mode = self._settings.control_mode
        if mode == "explicit":
            wanted = set(self._settings.startup_models)
            names = names if "*" in wanted else [n for n in names if n in wanted]
        with self._lock:
            for name in names:
                if self._settings.load == "lazy":
                    self._lazy.add(name)
                    continue
                try:
                    self.load(name, None, explicit=False)
                except EdgedError as e:
                    log.error("model %s failed to load: %s", name, e)
            self.started = True

    def load(self, name: str, override: ModelConfig | None, explicit: bool) -> None:
        if explicit and self._settings.control_mode != "explicit":
            raise Unavailable(f"explicit model load / unload is not allowed in model control mode "
                              f"{self._settings.control_mode!r}; start edged with --model-control-mode explicit")
        check_model_name(name)
        if not (self._root / name).is_dir():
            raise ModelNotFound(f"unknown model: {name!r} is not in the repository {self._root}")
        with self._lock:
            self._unloaded.pop(name, None)
            record = self._records.setdefault(name, ModelRecord(name))
            record.loaded_explicitly = explicit
            try:
                self._load_record(record, override)
            except EdgedError as e:
                if not record.versions:
                    record.error = str(e)
                raise
            finally:
                # Only now: callers of ensure_loaded() that saw the model as lazy wait on the lock until here.
                self._lazy.discard(name)

    def _load_record(self, record: ModelRecord, override: ModelConfig | None) -> None:
        model_dir = self._root / record.name
        if not model_dir.is_dir():
            raise ModelNotFound(f"model {record.name} is not in the repository {self._root}")
        config, backend, available = self._prepare(record.name, model_dir, override)
        wanted = select_versions(config.version_policy, available)
        if not wanted:
            raise ModelLoadError(f"model {record.name}: no version to serve in {model_dir} (found versions: "
                                 f"{available or 'none'}; version_policy {config.version_policy.kind})")
        check_config_files(config, model_dir, wanted)
        self._swap_in(record, config, backend, model_dir, wanted)
        record.fingerprint = fingerprint(model_dir)

    def _prepare(self, name: str, model_dir: Path,
                 override: ModelConfig | None) -> tuple[ModelConfig, Backend, list[int]]:
        available = list_versions(model_dir)
        config = override or load_model_config(model_dir)
        runtime = (config.runtime if config else "") or detect_runtime(model_dir, available) or ""
        if not runtime:
            raise ModelLoadError(f"model {name}: no config.pbtxt platform/backend and no model file "
                                 f"edged recognises in {model_dir} (model.onnx, model.plan, model.pt, model.pt2)")
        backend = self._backends.get(runtime)
        if backend is None:  # one backend object per runtime: TensorRT's scratch area is shared through it
            backend = self._backends[runtime] = self._backend_loader(runtime)
        return self._complete(name, config, runtime, backend, model_dir, available), backend, available

    def load_detached(self, name: str, model_dir: Path, number: int) -> ModelVersion:
        """Load one version from a folder outside the repository without serving it (OTA staging). Memory
        admission evicts nothing for it: an update must never make a served model unavailable."""
        check_model_name(name)
        with self._lock:
            config, backend, _ = self._prepare(name, model_dir, None)
            check_config_files(config, model_dir, [number])
            version = ModelVersion(config, number, model_dir, self._max_elements)
            self._load_version(version, backend, evict=False)
            return version

    def unload_detached(self, version: ModelVersion) -> None:
        with self._lock:
            self._unload_version(version, self._unload_timeout_s)
            self._after_unload()

    def _complete(self, name: str, config: ModelConfig | None, runtime: str, backend: Backend, model_dir: Path,
                  available: list[int]) -> ModelConfig:
        """Auto-complete from the model file where the format describes itself (ONNX, TensorRT), which also
        checks the config against the file; other runtimes need a config that lists inputs and outputs."""
        complete = config is not None and bool(config.input) and bool(config.output)
        if not self._settings.autocomplete and not complete:
            raise ModelLoadError(f"model {name}: auto-complete is off ([models] autocomplete = false) and the "
                                 "config.pbtxt does not list every input and output")
        if (runtime not in SELF_DESCRIBING or not self._settings.autocomplete) and config is not None and complete:
            config = config if config.name else dataclasses.replace(config, name=name)
            return normalize(_with_export_file(config, runtime, model_dir, available), _gpus(backend))
        if runtime == "pytorch":
            raise ModelLoadError(f"model {name}: PyTorch models need a config.pbtxt listing every input and "
                                 "output (name, data_type, dims)")
        if not available:
            raise ModelLoadError(f"model {name}: no numbered version folder in {model_dir}")
        probe = ModelConfig(name=name, backend=runtime) if config is None else config
        path = confined_path(model_dir, probe.model_filename, "default_model_filename", under=str(max(available)),
                             must_exist=False)
        return autocomplete(config, name, backend.describe(path), runtime, gpus=_gpus(backend))

    def _swap_in(self, record: ModelRecord, config: ModelConfig, backend: Backend, model_dir: Path,
                 wanted: list[int]) -> None:
        fresh: dict[int, ModelVersion] = {}
        errors: list[str] = []
        for number in wanted:
            version = ModelVersion(config, number, model_dir, self._max_elements)
            try:
                self._load_version(version, backend)
            except EdgedError as e:
                record.failed[number] = version
                errors.append(str(e))
                continue
            fresh[number] = version
            record.failed.pop(number, None)
        if not fresh:
            raise ModelLoadError("; ".join(errors) if errors else f"model {record.name}: nothing loaded")
        old = record.versions
        record.versions = {**{n: v for n, v in old.items() if n not in fresh and n in wanted and errors}, **fresh}
        record.error = ""
        retired = [(n, v) for n, v in old.items() if record.versions.get(n) is not v]
        for number, version in retired:
            self._unload_version(version, self._unload_timeout_s, forget=number not in fresh)
        if retired:
            self._after_unload()
        if errors:
            log.warning("model %s: some versions failed to load: %s", record.name, "; ".join(errors))

    def _load_version(self, version: ModelVersion, backend: Backend, evict: bool = True) -> None:
        memory = self._memory
        if memory is None:
            version.load(backend, self._settings.warmup)
            return
        memory.before_load(version, self._eviction_candidates if evict else list, self._evict)
        try:
            with memory.measure() as probe:
                version.load(backend, self._settings.warmup)
        except BaseException:
            memory.forget(version)
            raise
        memory.after_load(version, probe)

    def _unload_version(self, version: ModelVersion, timeout_s: float, forget: bool = True) -> None:
        version.unload(timeout_s)
        if self._memory is not None and forget:  # a reloaded version number keeps the new copy's charge
            self._memory.forget(version)

    def _eviction_candidates(self) -> list[ModelVersion]:
        return [v for r in self._records.values() for v in r.ready_versions()]

    def _evict(self, version: ModelVersion) -> None:
        record = self._records.get(version.config.name)
        log.info("evicting model %s version %s to make room (least recently used)", version.config.name,
                 version.version)
        self._unload_version(version, self._unload_timeout_s)
        if record is not None:
            record.drop(version.version)
            if not record.versions:
                del self._records[record.name]
                self._unloaded[record.name] = "evicted to make room for another model (memory budget)"
                if self._settings.load == "lazy":
                    self._lazy.add(record.name)

    def unload(self, name: str, explicit: bool) -> None:
        if explicit and self._settings.control_mode != "explicit":
            raise Unavailable(f"explicit model load / unload is not allowed in model control mode "
                              f"{self._settings.control_mode!r}; start edged with --model-control-mode explicit")
        with self._lock:
            record = self._records.pop(name, None)
            if record is None:
                if name in self._lazy:
                    return
                raise ModelNotFound(f"unknown model: {name!r} is not loaded")
            self._unloaded[name] = "unloaded"
            for version in record.all_versions():
                self._unload_version(version, self._unload_timeout_s)
            self._after_unload()

    def _after_unload(self) -> None:
        if self._memory is not None:
            self._memory.release()

    def poll(self) -> None:
        with self._lock:
            present = set(self._safe_find_models())
            for name in sorted(set(self._records) - present):
                log.info("model %s disappeared from the repository; unloading", name)
                self.unload(name, explicit=False)
            for name in sorted(present):
                record = self._records.get(name)
                if record is not None and record.fingerprint == fingerprint(self._root / name):
                    continue
                if record is None and name in self._lazy:
                    continue
                try:
                    self.load(name, None, explicit=False)
                except EdgedError as e:
                    log.error("model %s: reload failed, previous versions keep serving: %s", name, e)

    def close(self, timeout_s: float) -> None:
        with self._lock:
            for record in list(self._records.values()):
                for version in record.all_versions():
                    self._unload_version(version, timeout_s)
            self._records.clear()
            for backend in self._backends.values():
                close = getattr(backend, "close", None)  # optional: backends holding process-wide memory
                if callable(close):
                    close()
            self._backends.clear()
            self._after_unload()


def _gpus(backend: Backend) -> tuple[int, ...]:
    """The GPUs the backend can use; custom backends without the method are CPU-only."""
    probe = getattr(backend, "available_gpus", None)
    return tuple(probe()) if callable(probe) else ()


def _with_export_file(config: ModelConfig, runtime: str, model_dir: Path, available: list[int]) -> ModelConfig:
    """A PyTorch model folder holding a torch.export program (model.pt2) and no TorchScript file uses it."""
    if runtime != "pytorch" or config.default_model_filename or not available:
        return config
    latest = model_dir / str(max(available))
    if not (latest / "model.pt").exists() and (latest / "model.pt2").exists():
        return dataclasses.replace(config, default_model_filename="model.pt2")
    return config


def fingerprint(model_dir: Path) -> tuple[Any, ...]:
    """What poll compares to notice a change: names, sizes and mtimes of the config and version files."""
    entries: list[tuple[str, int, int]] = []
    try:
        for dirpath, _dirs, files in os.walk(model_dir):
            for file in files:
                path = os.path.join(dirpath, file)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                entries.append((os.path.relpath(path, model_dir), st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(entries))
