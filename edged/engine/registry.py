"""The models of one repository and the rules that load, reload and unload their versions.

A reload builds the new versions next to the serving ones and swaps only when they are ready: a failed reload
leaves the old versions serving. Where the memory budget cannot hold both copies, ``[models] reload`` decides:
"side_by_side" refuses the reload (the old copy keeps serving), "replace" unloads the old copy first (the
version is unavailable until the new one is ready), "auto" does side by side when it fits and replace when not.

All changes run under one lock, but nothing waits for an execution while holding it: versions leaving service
stop taking requests under the lock and are drained and closed after the change lets go of it, so a slow or
wedged execution never blocks loads, unloads, polls or shutdown of other models. The old copies a replacing
reload unloads first are drained before the load takes the lock (``_vacate``). Evicted versions have nothing
in flight and are closed at once: their memory must be free before the load that follows. Only a replace
decided inside a change (the budget refusing a step of a load already under way) drains under the lock,
bounded by the unload timeout.

A load holds the lock for its whole length, so loads of different models run one after another. The stop does
not wait for one: ``stop_loading`` makes it give up before its next instance, and ``close`` waits for the lock
only until its deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from edged.backends import Backend
from edged.config import ModelsConfig
from edged.engine.admission import Admission
from edged.engine.completion import check_instance_count, complete_config
from edged.engine.intake import Intake
from edged.engine.lifecycle import ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.engine.record import ModelRecord, index_entries
from edged.engine.version import ModelVersion
from edged.errors import (
    EdgedError,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    OutOfMemory,
    Unavailable,
    UnknownBackend,
)
from edged.repository import (
    CONFIG_FILENAME,
    Fingerprint,
    Settling,
    changed_versions,
    check_batching,
    check_config_files,
    check_io_and_groups,
    check_model_name,
    check_platform_backend,
    check_reshapes,
    check_supported,
    check_tensor_types,
    check_warmup,
    find_models,
    fingerprint,
    list_versions,
    load_model_config,
    parse_version,
    resolve_runtime,
    select_versions,
    unknown_backend,
    warn_not_utf8,
)
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)
READY = ModelState.READY
_MAX_SHOWN = 500  # characters of a foreign exception's text in a load's error (its traceback is in the log)


class Registry:
    def __init__(self, root: Path, settings: ModelsConfig, max_elements: int,
                 backend_loader: Callable[[str], Backend], memory: MemoryGovernor | None,
                 unload_timeout_s: float, intake: Intake | None = None) -> None:
        self._root = root
        self._intake = intake  # handed to each version's scheduler (edged.engine.intake)
        self._settings = settings
        self._max_elements = max_elements
        self._backend_loader = backend_loader
        self._memory = memory
        self._unload_timeout_s = unload_timeout_s
        self._records: dict[str, ModelRecord] = {}
        self._lazy: set[str] = set()
        # read-only to others: the models a first request loads (front ends test it per request, without a call)
        self.lazy: AbstractSet[str] = self._lazy
        # read-only to others: the service's submit takes a record's cached default version from it (`resolve`'s
        # first branch without the call); never rebound, so a reference to it stays current
        self.by_name: Mapping[str, ModelRecord] = self._records
        # model name → why it is no longer loaded and the versions it had, for the index
        self._unloaded: dict[str, tuple[str, tuple[int, ...]]] = {}
        # folders skipped for a name that is not UTF-8: warned about once, not at every index, status and poll
        self._not_utf8: set[str] = set()
        self._backends: dict[str, Backend] = {}
        self._lock = threading.RLock()
        # Set when the daemon stops: a load in progress gives up between two instances (ModelVersion.load) and
        # no new load starts, so the stop is not held by a load for its whole length.
        self._stopping = threading.Event()
        self._loading = ""  # the model whose load holds the lock now, for the stop's message
        self._depth = 0  # nesting of _changing() in the thread holding the lock
        self._retired: list[ModelVersion] = []  # out of service, to unload when the change ends
        self._settling = Settling()
        self._admission = Admission(memory, settings, self._eviction_candidates, self._evict, self._unload_now,
                                    self._stopping)
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
            if self._settings.control_mode == "explicit" and self._on_disk(name):
                raise ModelNotFound(f"unknown model: {name!r} is in the repository but not loaded (control_mode "
                                    "explicit loads only [models] startup_models at start): load it with `edged "
                                    f"models load {name}` or POST /v2/repository/models/{name}/load")
            raise ModelNotFound(f"unknown model: {name!r} is not in the repository or not loaded; the repository "
                                "index (`edged models list`) names the models this daemon has")
        return record

    def _on_disk(self, name: str) -> bool:
        """Whether the repository has a folder of this name (an error path only: a name is checked first)."""
        try:
            check_model_name(name)
        except EdgedError:
            return False
        return (self._root / name).is_dir()

    def resolve(self, name: str, version: str) -> ModelVersion:
        record = self._records.get(name) or self.record(name)  # `record` only to raise the fitting error
        if not version:
            chosen_from, served = record.chosen  # ModelRecord.default_version's cached answer, without the call
            if chosen_from is record.versions and served is not None and served.lifecycle.state is READY:
                return served
            served = record.default_version()
            if served is not None:
                return served
            if record.error:
                raise ModelNotReady(f"model {name} is not ready: {record.error}")
            raise ModelNotReady(f"model {name} has no ready version")
        number = parse_version(version)
        if number is None:  # the folders' rule: int() took '02', ' 2', '2_0' and other scripts' digits
            shown = version if len(version) <= 40 else version[:40] + "..."
            raise ModelNotFound(f"model {name}: version {shown!r} is not a version number (1, 2, ... without "
                                "leading zeros)")
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
        with self._changing():
            if name in self._lazy:
                self.load(name, None, explicit=False)

    def all_expected_ready(self) -> bool:
        return all(record.ready_versions() or record.error or record.failed for record in self.records())

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        names = sorted(set(self._safe_find_models()) | set(self._records))
        return index_entries(names, self._records, self._unloaded, ready_only)

    def _safe_find_models(self) -> list[str]:
        try:
            return self._find_models()
        except (OSError, EdgedError):
            return []

    def _find_models(self) -> list[str]:
        return find_models(self._root, self._skip_not_utf8)

    def _skip_not_utf8(self, name: str) -> None:
        if name not in self._not_utf8 and len(self._not_utf8) < 1024:
            self._not_utf8.add(name)
            warn_not_utf8(name)

    # --- changes -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the lock for a change; the versions it retired are drained and closed once the outermost
        change has let go of the lock."""
        retired: list[ModelVersion] = []
        try:
            with self._lock:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                    if self._depth == 0:
                        retired, self._retired = self._retired, []
        finally:
            self._finish(retired, self._unload_timeout_s)

    def _retire(self, version: ModelVersion) -> None:
        """Take a version out of service now (under the lock); it is unloaded when the change ends."""
        if version.lifecycle.state is READY:
            version.lifecycle.move(ModelState.UNLOADING)
        self._retired.append(version)

    def _finish(self, versions: list[ModelVersion], timeout_s: float) -> None:
        for version in versions:
            version.unload(timeout_s)
        if versions and self._memory is not None:
            with self._lock:  # the governor's books are kept under the lock; nothing waits here
                for version in versions:
                    self._memory.forget(version)
                self._memory.release()

    def start(self) -> None:
        names = self._find_models()
        mode = self._settings.control_mode
        if mode == "explicit":
            wanted = set(self._settings.startup_models)
            missing = sorted(wanted - set(names) - {"*"})
            if missing:  # a typo in the config must not look like a model that failed quietly
                log.warning("[models] startup_models names %s, which the repository %s does not have: not loaded",
                            ", ".join(repr(m) for m in missing), self._root)
            names = names if "*" in wanted else [n for n in names if n in wanted]
        with self._changing():
            for name in names:
                if self._stopping.is_set():
                    break  # the daemon stops before its start has loaded everything
                if self._settings.load == "lazy":
                    self._lazy.add(name)
                    continue
                try:
                    self.load(name, None, explicit=False)
                except EdgedError as e:
                    log.error("model %s failed to load: %s", name, e)
            self.started = True

    def load(self, name: str, override: ModelConfig | None, explicit: bool,
             seen: Fingerprint | None = None) -> None:
        """Load or reload a model; ``seen`` (from poll) reloads only the versions whose files changed."""
        if explicit and self._settings.control_mode != "explicit":
            raise Unavailable(f"explicit model load / unload is not allowed in model control mode "
                              f"{self._settings.control_mode!r}; start edged with --model-control-mode explicit")
        check_model_name(name)
        if not (self._root / name).is_dir():
            raise ModelNotFound(f"unknown model: {name!r} is not in the repository {self._root}")
        self._refuse_if_stopping(name)
        self._vacate(name, override, seen)
        with self._changing(), self._loading_model(name):
            self._refuse_if_stopping(name)  # the stop may have begun while this load waited for the lock
            self._unloaded.pop(name, None)
            record = self._records.setdefault(name, ModelRecord(name))
            record.loaded_explicitly = explicit
            changed = None if seen is None or override is not None else changed_versions(record.fingerprint, seen)
            try:
                self._load_record_translated(record, override, changed)
            except EdgedError as e:
                if not record.versions:
                    record.error = str(e)
                if self._stopping.is_set():
                    log.warning("%s", e)  # the load's caller may be gone with the server: the log says why
                raise
            finally:
                # Only now: callers of ensure_loaded() that saw the model as lazy wait on the lock until here.
                self._lazy.discard(name)
            record.fingerprint = seen if seen is not None else fingerprint(self._root / name)

    def _refuse_if_stopping(self, name: str) -> None:
        if self._stopping.is_set():
            raise Unavailable(f"model {name}: not loaded, the daemon is stopping")

    @contextlib.contextmanager
    def _loading_model(self, name: str) -> Iterator[None]:
        """Name the model being loaded (under the lock) for a stop that finds the lock held."""
        outer, self._loading = self._loading, name
        try:
            yield
        finally:
            self._loading = outer

    def _load_record_translated(self, record: ModelRecord, override: ModelConfig | None,
                                changed: set[int] | None) -> None:
        """`_load_record` with a foreign exception (a bug, a runtime's surprise) translated at this boundary: it is
        logged with its traceback and the load fails as any failed load does (the model marked with the reason),
        so one model cannot stop a start or a poll from loading the others."""
        try:
            self._load_record(record, override, changed)
        except EdgedError:
            raise
        except Exception as e:
            log.exception("model %s: unexpected error while loading", record.name)
            text = str(e)
            shown = text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."
            raise ModelLoadError(f"model {record.name}: load failed on an unexpected {type(e).__name__}: {shown} "
                                 "(the daemon's log has the traceback)") from e

    def _load_record(self, record: ModelRecord, override: ModelConfig | None, changed: set[int] | None) -> None:
        model_dir = self._root / record.name
        if not model_dir.is_dir():
            raise ModelNotFound(f"model {record.name} is not in the repository {self._root}")
        available = list_versions(model_dir)
        config, runtime = resolve_runtime(override or load_model_config(model_dir), model_dir, available)
        if not runtime:
            raise ModelLoadError(f"model {record.name}: no config.pbtxt platform/backend and no model file "
                                 f"edged recognises in {model_dir} (model.onnx, model.plan, model.pt, model.pt2)")
        config_path = str(model_dir / CONFIG_FILENAME)
        backend = self._backend_for(runtime, config, config_path)
        reloading = [n for n in record.versions if changed is None or n in changed]
        if reloading and self._settings.reload == "replace":
            self._admission.replace(record, reloading)
        with self._admission.describing(record, config, runtime, model_dir, available, reloading):
            config = complete_config(record.name, config, runtime, backend, model_dir, available,
                                     self._settings.autocomplete)
        check_instance_count(config, self._settings.max_instance_count)
        check_tensor_types(config, config_path)
        check_reshapes(config, config_path)
        check_io_and_groups(config, config_path)
        check_batching(config, config_path)
        check_warmup(config, config_path, self._max_elements)
        wanted = select_versions(config.version_policy, available)
        if not wanted:
            raise ModelLoadError(f"model {record.name}: no version to serve in {model_dir} (found versions: "
                                 f"{available or 'none'}; version_policy {config.version_policy.kind})")
        check_config_files(config, model_dir, wanted)
        self._swap_in(record, config, backend, model_dir, wanted, changed)

    def _vacate(self, name: str, override: ModelConfig | None, seen: Fingerprint | None) -> None:
        """Before a reload that replaces (see Admission.should_vacate): take the old copies out of service and
        wait for their requests without the lock. Inside a change (this thread already holds the lock) the
        admission's ``replace`` does it under the lock instead, bounded by the unload timeout."""
        with self._lock:
            record = self._records.get(name)
            if self._depth or record is None:
                return
            changed = None if seen is None or override is not None else changed_versions(record.fingerprint, seen)
            leaving = [v for n, v in record.versions.items() if changed is None or n in changed]
            if not leaving or not self._admission.should_vacate(leaving):
                return
            for version in leaving:
                self._admission.announce_replace(record, version.version)
                record.drop(version.version)
                version.lifecycle.move(ModelState.UNLOADING)
        self._finish(leaving, self._unload_timeout_s)

    def _prepare(self, name: str, model_dir: Path) -> tuple[ModelConfig, Backend]:
        """The completed config and the backend of a model folder, outside any record (OTA staging)."""
        available = list_versions(model_dir)
        config, runtime = resolve_runtime(load_model_config(model_dir), model_dir, available)
        if not runtime:
            raise ModelLoadError(f"model {name}: no config.pbtxt platform/backend and no model file "
                                 f"edged recognises in {model_dir} (model.onnx, model.plan, model.pt, model.pt2)")
        config_path = str(model_dir / CONFIG_FILENAME)
        backend = self._backend_for(runtime, config, config_path)
        config = complete_config(name, config, runtime, backend, model_dir, available, self._settings.autocomplete)
        check_instance_count(config, self._settings.max_instance_count)
        check_tensor_types(config, config_path)
        check_reshapes(config, config_path)
        check_io_and_groups(config, config_path)
        check_batching(config, config_path)
        check_warmup(config, config_path, self._max_elements)
        return config, backend

    def _backend_for(self, runtime: str, config: ModelConfig | None, config_path: str) -> Backend:
        """The backend of ``runtime``, one object per runtime (TensorRT's scratch area is shared through it);
        a platform or backend the config names wrongly is the config's error (400), not a failed load."""
        if config is not None:
            check_platform_backend(config, config_path, backends=None)  # names: the loader knows [models] backends
            check_supported(config, config_path)
        backend = self._backends.get(runtime)
        if backend is None:
            try:
                backend = self._backends[runtime] = self._backend_loader(runtime)
            except UnknownBackend as e:
                if config is None or not config.runtime:
                    raise
                raise unknown_backend(e.name, e.known, config_path) from e
        return backend

    def load_detached(self, name: str, model_dir: Path, number: int) -> ModelVersion:
        """Load one version from a folder outside the repository without serving it (OTA staging). Memory
        admission evicts nothing for it: an update must never make a served model unavailable."""
        check_model_name(name)
        with self._lock:
            config, backend = self._prepare(name, model_dir)
            check_config_files(config, model_dir, [number])
            version = ModelVersion(config, number, model_dir, self._max_elements, self._intake)
            self._admission.load_detached(version, backend)
            return version

    def unload_detached(self, version: ModelVersion) -> None:
        """A staged version never served a request: nothing to drain, so unloading under the lock waits on none."""
        with self._lock:
            self._unload_now(version)

    def _swap_in(self, record: ModelRecord, config: ModelConfig, backend: Backend, model_dir: Path,
                 wanted: list[int], changed: set[int] | None) -> None:
        unchanged = {n for n in record.versions if changed is not None and n in wanted and n not in changed}
        fresh: dict[int, ModelVersion] = {}
        errors: list[str] = []
        kinds: set[type[EdgedError]] = set()
        for number in wanted:
            if number in unchanged:
                continue
            version = ModelVersion(config, number, model_dir, self._max_elements, self._intake)
            record.loading = {**record.loading, number: version}  # the index shows it LOADING meanwhile
            try:
                self._admission.load_version(record, version, backend)
            except EdgedError as e:
                record.failed[number] = version
                errors.append(str(e))
                kinds.add(type(e))
                continue
            finally:
                record.loading = {n: v for n, v in record.loading.items() if n != number}
            fresh[number] = version
            record.failed.pop(number, None)
        if errors and not fresh:
            # a load abandoned because the daemon stops is no fault of the model: 503, not 400; and the one kind
            # of failure every version had keeps its family (MemoryBudgetExceeded, and a backend out of memory,
            # are 503s the caller may retry; any other failure of the model is a 400)
            (kind,) = kinds if len(kinds) == 1 else (ModelLoadError,)
            if self._stopping.is_set():
                kind = Unavailable
            elif not issubclass(kind, ModelLoadError | OutOfMemory):
                kind = ModelLoadError
            raise kind("; ".join(errors))
        old = record.versions
        record.versions = {**{n: v for n, v in old.items() if n not in fresh and n in wanted
                              and (errors or n in unchanged)}, **fresh}
        record.error = ""
        for number, version in old.items():
            if record.versions.get(number) is not version:
                self._retire(version)
        if errors:
            log.warning("model %s: some versions failed to load: %s", record.name, "; ".join(errors))

    def _unload_now(self, version: ModelVersion) -> None:
        """Unload under the lock: only for versions with nothing in flight (eviction) or whose memory the next
        load needs (replace); an execution still running is not waited for past the unload timeout."""
        version.unload(self._unload_timeout_s)
        if self._memory is not None:
            self._memory.forget(version)
            self._memory.release()

    def _eviction_candidates(self) -> list[ModelVersion]:
        return [v for r in self._records.values() for v in r.ready_versions()]

    def _evict(self, version: ModelVersion) -> None:
        record = self._records.get(version.config.name)
        log.info("evicting model %s version %s to make room (least recently used)", version.config.name,
                 version.version)
        self._unload_now(version)
        if record is not None:
            record.drop(version.version)
            if not record.versions:
                del self._records[record.name]
                self._unloaded[record.name] = ("evicted to make room for another model (memory budget)",
                                               (version.version,))
                if self._settings.load == "lazy":
                    self._lazy.add(record.name)

    def unload(self, name: str, explicit: bool) -> None:
        if explicit and self._settings.control_mode != "explicit":
            raise Unavailable(f"explicit model load / unload is not allowed in model control mode "
                              f"{self._settings.control_mode!r}; start edged with --model-control-mode explicit")
        with self._changing():
            record = self._records.pop(name, None)
            if record is None:
                return  # nothing to unload: as Triton, a success (an unload is idempotent)
            self._unloaded[name] = ("unloaded", tuple(sorted(record.versions)))
            for version in record.all_versions():
                self._retire(version)

    def poll(self, settle: bool = True) -> None:
        """Load new models, reload changed ones once their files settled (``settle``), unload removed ones.
        The loads run one by one after the scan, each taking the lock itself (see ``_vacate``)."""
        due: list[tuple[str, Fingerprint]] = []
        with self._changing():
            present = set(self._safe_find_models())
            for name in sorted(set(self._records) - present):
                log.info("model %s disappeared from the repository; unloading", name)
                self.unload(name, explicit=False)
            self._settling.keep_only(present)
            for name in sorted(present - self._lazy):
                record = self._records.get(name)
                if record is None and self._settings.control_mode == "explicit":
                    continue  # explicit mode: a rescan refreshes what was asked for, never loads the rest
                seen = fingerprint(self._root / name)
                if self._settling.settled(name, record.fingerprint if record else None, seen, settle):
                    due.append((name, seen))
        for name, seen in due:
            try:
                self.load(name, None, explicit=False, seen=seen)
            except EdgedError as e:
                with self._lock:
                    record = self._records.get(name)
                    if record is not None:
                        record.fingerprint = seen  # retried when the files change again, not on every poll
                log.error("model %s: reload failed, previous versions keep serving: %s", name, e)
            except Exception:  # a bug outside the load proper: this model waits for its next change, the rest go on
                with self._lock:
                    record = self._records.get(name)
                    if record is not None:
                        record.fingerprint = seen
                log.exception("model %s: poll failed unexpectedly; the other models are still polled", name)

    def stop_loading(self) -> None:
        """The daemon is stopping: loads in progress give up at their next instance, new ones are refused."""
        self._stopping.set()

    def close(self, timeout_s: float) -> list[str]:
        """Unload every version in parallel within one deadline, outside the registry lock (see the module
        docstring). Versions still unloading at the deadline are abandoned (returned and logged): the process is
        about to exit and the OS frees what they hold. A load in progress is told to stop; one still holding
        the lock at the deadline (a backend loading one instance cannot be interrupted) is abandoned with
        everything loaded (returned as ``"<model> (load)"``)."""
        deadline = time.monotonic() + timeout_s
        self.stop_loading()
        if not self._lock.acquire(timeout=timeout_s):
            loading = self._loading or "a model"
            log.warning("stop budget of %.1f s spent: abandoning the load of %s still running, and the unloads",
                        timeout_s, loading)
            return [f"{loading} (load)"]
        try:
            versions = [v for record in self._records.values() for v in record.all_versions()]
            for version in versions:
                if version.lifecycle.state is READY:
                    version.lifecycle.move(ModelState.UNLOADING)  # no new requests from here on
            self._records.clear()
        finally:
            self._lock.release()
        workers = [(version, threading.Thread(target=version.unload, args=(timeout_s,),
                                              name=f"unload-{version.config.name}-{version.version}", daemon=True))
                   for version in versions]
        for _, worker in workers:
            worker.start()
        for _, worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        abandoned = [f"{v.config.name}/{v.version}" for v, worker in workers if worker.is_alive()]
        if abandoned:
            # Closing a backend under a version that still unloads could crash the process mid-stop.
            log.warning("stop budget of %.1f s spent: abandoning the unload of %s", timeout_s, ", ".join(abandoned))
            return abandoned
        with self._lock:
            if self._memory is not None:
                for version in versions:
                    self._memory.forget(version)
            for backend in self._backends.values():
                close = getattr(backend, "close", None)  # optional: backends holding process-wide memory
                if callable(close):
                    close()
            self._backends.clear()
            if self._memory is not None:
                self._memory.release()
        return []

