"""`InferenceService`: the engine as front ends and in-process users see it.

It owns the models of one repository: their versions, lifecycles, schedulers and statistics. Loading is
serialised by one lock (a device loads one model at a time anyway, and memory admission needs a stable view);
inference takes no service-wide lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edged import __version__
from edged.backends import Backend, load_backend
from edged.config import ModelsConfig
from edged.engine.aio import LoopSubmitter
from edged.engine.generation import GenerationService
from edged.engine.intake import Intake
from edged.engine.lifecycle import ModelState
from edged.engine.memory_governor import MemoryGovernor
from edged.engine.metadata import model_metadata
from edged.engine.record import ModelRecord
from edged.engine.registry import Registry
from edged.engine.scheduler import Done
from edged.engine.types import InferRequest, InferResponse
from edged.engine.version import ModelVersion
from edged.errors import (
    ConfigError,
    EdgedError,
    InvalidInput,
    ModelLoadError,
    ModelNotFound,
    OutOfMemory,
    RequestTimeout,
    Unavailable,
)
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)

_READY = ModelState.READY  # a module global: an Enum member read through its class costs ten times more

# schedule_policy: the "priority" and "timeout" request parameters, applied by each model's queue policy
# (engine/queue_policy.py): priority levels, timeouts that REJECT or DELAY.
EXTENSIONS = ("classification", "model_repository", "model_configuration", "system_shared_memory",
              "binary_tensor_data", "parameters", "statistics", "schedule_policy")


class InferenceService:
    def __init__(self, repository: Path, models: ModelsConfig, *, max_elements: int = 64 * 1024 * 1024,
                 backend_loader: Callable[[str], Backend] | None = None,
                 memory: MemoryGovernor | None = None, unload_timeout_s: float = 10.0) -> None:
        self.repository = repository
        self.settings = models
        self.memory = memory
        if backend_loader is None:
            extra = dict(models.backends)

            def backend_loader(name: str) -> Backend:
                return load_backend(name, extra)
        # A front end that submits an event-loop iteration's requests together opens it while it reads them.
        self.intake = Intake()
        self._registry = Registry(repository, models, max_elements, backend_loader, memory, unload_timeout_s,
                                  self.intake)
        self._closed = False
        self.lazy_models = self._registry.lazy  # `needs_load` as a set, for paths that run per request
        self._records = self._registry.by_name
        self.generation = GenerationService(self)  # generative models: prompt in, a stream of text out
        # One submitter per event loop; a closed loop's entry goes away with the loop.
        self._submitters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopSubmitter] = (
            weakref.WeakKeyDictionary())
        self._last_submitter: LoopSubmitter | None = None  # keeps at most one finished loop alive

    # --- lifecycle of the service --------------------------------------------------------------------------
    def start(self) -> None:
        """Load (or, with load = "lazy", register) the models the control mode asks for."""
        self._registry.start()

    def stop_loading(self) -> None:
        """The stop begins: a load in progress gives up before its next instance, and no new load starts."""
        self._registry.stop_loading()

    def close(self, timeout_s: float = 10.0) -> list[str]:
        """Unload everything within ``timeout_s``; the versions abandoned at the deadline ("name/version", or
        "name (load)" for a load the backend could not interrupt: its thread is still running)."""
        self._closed = True
        return self._registry.close(timeout_s)

    @property
    def live(self) -> bool:
        return not self._closed

    @property
    def ready(self) -> bool:
        """Ready once start() has run and every model that is to be loaded eagerly is ready."""
        return not self._closed and self._registry.started and self._registry.all_expected_ready()

    # --- repository API ------------------------------------------------------------------------------------
    def load_model(self, name: str, config_override: ModelConfig | None = None) -> None:
        """An explicit load (HTTP, gRPC, the CLI). A failure of the model's own (its config, its files, the
        runtime it needs, memory) is worded as Triton words a failed load, "load failed for model 'm': why",
        which tritonclient shows as it comes; the error keeps its family, so its status code stays its own."""
        try:
            self._registry.load(name, config_override, explicit=True)
        except (ModelLoadError, ConfigError, OutOfMemory) as e:
            # reworded in place: a new exception of the same class could not be built for every family
            # (UnknownBackend takes more than a message), and the status tables read only the class
            e.args = (f"load failed for model '{name}': {e}",)
            raise

    def unload_model(self, name: str) -> None:
        self._registry.unload(name, explicit=True)

    def poll(self, settle: bool = True) -> None:
        """Rescan the repository (model control mode poll): load new and changed models, unload removed.
        With ``settle`` a change is acted on once two polls in a row saw the same files (a copy finished)."""
        self._registry.poll(settle)
    def reload_model(self, name: str) -> None:
        """Load (or reload) a model from the repository in any control mode: new versions are built beside the
        served ones and swapped in when ready, so requests never see the model missing (OTA activation)."""
        self._registry.load(name, None, explicit=False)

    def load_detached(self, name: str, model_dir: Path, version: int) -> ModelVersion:
        """Load a version from ``model_dir`` (outside the repository) without serving it; see Registry."""
        return self._registry.load_detached(name, model_dir, version)

    def unload_detached(self, version: ModelVersion) -> None:
        self._registry.unload_detached(version)

    def remove_model(self, name: str) -> None:
        """Unload a model in any control mode (its folder left the repository: OTA rolled back a new model)."""
        self._registry.unload(name, explicit=False)


    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self._registry.index(ready_only)

    def model_names(self) -> list[str]:
        return self._registry.names()

    def needs_load(self, name: str) -> bool:
        """True when the model is known but not loaded and lazy loading would load it on first use."""
        return self._registry.needs_lazy_load(name)

    def ensure_loaded(self, name: str) -> None:
        self._registry.ensure_loaded(name)

    # --- model information ---------------------------------------------------------------------------------
    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self._registry.resolve(name, version).state is ModelState.READY
        except EdgedError:
            return False

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        record = self._registry.record(name)
        served = self._registry.resolve(name, version)
        return model_metadata(name, record.ready_versions() or [served], served.config)

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._registry.resolve(name, version).config

    def version_info(self, name: str, version: str = "") -> ModelVersion:
        return self._registry.resolve(name, version)

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension document for one model (version) or all."""
        if name:
            # as Triton: statistics of what is not served are a bad argument (400, INVALID_ARGUMENT), where
            # metadata and infer answer 404
            try:
                record = self._registry.record(name)
                versions = [self._registry.resolve(name, version)] if version else record.all_versions()
            except ModelNotFound as e:
                raise InvalidInput(f"requested model is not available: {e}") from None
            if not versions:
                raise InvalidInput(f"requested model {name!r} is not available: no version of it is loaded")
        else:
            versions = [v for r in self._registry.records() for v in r.all_versions()]
        return {"model_stats": [self._version_stats(v) for v in versions]}

    def _version_stats(self, version: ModelVersion) -> dict[str, Any]:
        doc = version.stats.as_json()
        generation = self.generation.statistics(version.config.name)
        if generation is not None:
            doc["generation"] = generation  # per model: requests may reach any of its versions
        return doc

    def loaded_versions(self) -> list[ModelVersion]:
        return [v for r in self._registry.records() for v in r.all_versions()]

    def model_activity(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(model name, version or "tokens") → (inference count, compute ns), cumulative; telemetry attributes
        energy with it. Per version, not summed: a sum falls when a version goes, as if the model had reloaded."""
        activity: dict[tuple[str, str], tuple[int, int]] = {}
        for version in self.loaded_versions():
            doc = version.stats.as_json()
            compute = doc["inference_stats"]["compute_infer"]["ns"]
            activity[(version.config.name, str(version.version))] = (doc["inference_count"], compute)
        # a generative model's unit of work is an output token: energy per inference becomes energy per token
        for model, (tokens, ns) in self.generation.activity().items():
            activity[(model, "tokens")] = (tokens, ns)
        return activity

    def stalled(self, limit_s: float) -> list[str]:
        """Model versions with an execution running longer than ``limit_s``: a wedged backend."""
        return [f"{name}/{version}" for name, version, running_s in self.longest_runs() if running_s > limit_s]

    def longest_runs(self) -> list[tuple[str, str, float]]:
        """(model, version, seconds its longest execution now running has taken; 0 when idle) per loaded
        version: the watchdog and the health board compare it with ``[models] stall_timeout_s``."""
        runs = []
        for version in self.loaded_versions():
            scheduler = version.scheduler
            running_s = scheduler.longest_execution_s() if scheduler is not None else 0.0
            runs.append((version.config.name, version.version_str, running_s))
        return runs

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "edged", "version": __version__, "extensions": list(EXTENSIONS)}

    # --- inference -----------------------------------------------------------------------------------------
    def should_inline(self, name: str, version: str = "") -> bool:
        """Whether a caller on an event loop may execute this model itself (fast models only)."""
        try:
            served = self._registry.resolve(name, version)
        except EdgedError:
            return True  # the submit will fail fast anyway
        return self._fast(served)

    def _fast(self, served: ModelVersion) -> bool:
        p50 = served.exec_p50_us
        return p50 is not None and p50 <= self.settings.inline_execution_max_us

    def submit(self, request: InferRequest, done: Done, inline: bool | None = True) -> None:
        """Queue ``request``; ``done`` gets the response or the error, possibly before submit returns.

        ``inline=None`` executes inline only what `should_inline` allows, deciding on the version it resolves
        anyway (an event loop's path: one lookup, not two). Errors found before queueing (unknown model, bad
        input) are raised here, not passed to ``done``.
        """
        if self._closed:
            raise Unavailable("the server is shutting down")
        # ModelVersion.submit refuses a version that is not READY, with the same message. The default version's
        # cached choice is taken here as Registry.resolve takes it (one call less per request); anything else,
        # a choice made from an older dict of versions or a version no longer READY included, asks resolve.
        record = self._records.get(request.model)
        if record is not None and not request.version:
            chosen_from, served = record.chosen
            if chosen_from is not record.versions or served is None or served.lifecycle.state is not _READY:
                served = self._registry.resolve(request.model, "")
        else:
            served = self._registry.resolve(request.model, request.version)
        if inline is None:
            p50 = served.exec_p50_us  # _fast, without the call: this runs for every request
            inline = p50 is not None and p50 <= self.settings.inline_execution_max_us
        scheduler = served.scheduler
        if scheduler is None or request.outputs or served.lifecycle.state is not _READY:
            served.submit(request, done, inline)  # refuses, or wraps done for classification
            return
        # ModelVersion.submit without the call: a request that names no outputs classifies nothing
        scheduler.submit_one(request, served.validator.check(request), done, inline)

    def submit_many(self, model: str, version: str, calls: Sequence[tuple[InferRequest, Done]],
                    inline: bool = True) -> None:
        """Queue requests for one model version together, so the scheduler can batch them (one group commit).

        Unlike `submit`, every error, also one found before queueing, reaches that request's callback.
        """
        try:
            if self._closed:
                raise Unavailable("the server is shutting down")
            served = self._registry.resolve(model, version)
        except EdgedError as e:
            for _, done in calls:
                done(e)
            return
        served.submit_many(calls, inline)

    def infer(self, request: InferRequest, timeout_s: float | None = None) -> InferResponse:
        """Run ``request`` and wait for its response (thread-safe; batches with concurrent callers)."""
        if self._registry.needs_lazy_load(request.model):
            self.ensure_loaded(request.model)
        waiter = _Waiter()
        self.submit(request, waiter.set, inline=True)
        return waiter.wait(request.model, timeout_s)

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Run ``request`` from asyncio code; requests awaited in the same loop turn share batches."""
        loop = asyncio.get_running_loop()
        submitter = self._last_submitter  # one loop is the usual case: skip the weak dictionary
        if submitter is None or submitter.loop is not loop:
            submitter = self._submitters.get(loop)
            if submitter is None:
                submitter = self._submitters[loop] = LoopSubmitter(self, loop)
            self._last_submitter = submitter
        if self._registry.needs_lazy_load(request.model):  # a lazy load blocks: keep it off the loop
            await loop.run_in_executor(None, self.ensure_loaded, request.model)
        return await submitter.queue(request)

    def record_for(self, name: str) -> ModelRecord:
        return self._registry.record(name)


class _Waiter:
    """A one-shot result slot; a pre-acquired lock is CPython's cheapest cross-thread wake-up."""

    __slots__ = ("_lock", "_result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: InferResponse | EdgedError | None = None

    def set(self, result: InferResponse | EdgedError) -> None:
        self._result = result
        self._lock.release()

    def wait(self, model: str, timeout_s: float | None) -> InferResponse:
        if self._result is None and not self._lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise RequestTimeout(f"model {model}: no response within {timeout_s} s")
        result = self._result
        if isinstance(result, EdgedError):
            raise result
        if result is None:
            raise ModelNotFound(f"model {model}: no result")  # unreachable: set() always stores one
        return result
