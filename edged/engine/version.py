"""One version of one model: its config, instances, scheduler, validator, statistics and lifecycle."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edged.backends import Backend, ModelInstance
from edged.engine.classification import classify, load_labels
from edged.engine.intake import Intake
from edged.engine.lifecycle import Lifecycle, ModelState
from edged.engine.scheduler import Done, Scheduler
from edged.engine.stats import VersionStats
from edged.engine.types import InferRequest, InferResponse
from edged.engine.validation import RequestValidator
from edged.engine.warmup import warmup_samples
from edged.errors import EdgedError, InferenceFailed, ModelLoadError, ModelNotReady, OutOfMemory, Unavailable
from edged.repository import confined_path, with_confined_parameters
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)


class WarmupStalled(ModelLoadError):
    """A warm-up run went past ``[models] stall_timeout_s``: its instances are abandoned to the stuck run."""


class ModelVersion:
    def __init__(self, config: ModelConfig, version: int, model_dir: Path, max_elements: int,
                 intake: Intake | None = None) -> None:
        self.config = config
        self._intake = intake
        self.version = version
        self.version_str = str(version)
        self.model_dir = model_dir
        self.path = model_dir / str(version) / config.model_filename
        self.lifecycle = Lifecycle()
        self.stats = VersionStats(config.name, self.version_str)
        self.validator = RequestValidator(config, max_elements)
        self.max_elements = max_elements  # [server] max_tensor_elements: no request, nor generated warm-up, is larger
        self.instances: list[ModelInstance] = []
        self.scheduler: Scheduler | None = None
        self.exec_p50_us: float | None = None  # measured during warm-up; decides inline execution
        self.footprint_bytes: int | None = None
        self.load_peak_bytes: int | None = None  # what the load added to the process's peak RSS (VmHWM)
        self.load_seconds: float | None = None
        self._labels: dict[str, list[str]] | None = None  # label files, read on the first classification

    @property
    def state(self) -> ModelState:
        return self.lifecycle.state

    @property
    def in_flight(self) -> int:
        return self.scheduler.in_flight if self.scheduler else 0

    @property
    def last_used(self) -> float:
        return self.scheduler.last_used if self.scheduler else 0.0

    def load(self, backend: Backend, warmup: bool, stopping: threading.Event | None = None,
             stall_timeout_s: float | None = None) -> None:
        """Create the instances and warm them up; on failure the version is FAILED and holds nothing. When
        ``stopping`` is set (the daemon stops) the load gives up before its next instance and closes the ones
        it made: one instance's load is the most a stop waits for. A warm-up run still going after
        ``stall_timeout_s`` (a wedged backend) fails the load; its instances are abandoned, not closed (closing
        one under a native run could crash the process), and freed when the run ends, if it ever does."""
        started = time.monotonic()
        try:
            # confined again here: the folder may have changed since the registry checked the config
            self.path = confined_path(self.model_dir, self.config.model_filename, "default_model_filename",
                                      under=self.version_str, must_exist=False)
            if not self.path.is_file():
                raise ModelLoadError(f"model {self.config.name} version {self.version}: model file {self.path} "
                                     "does not exist")
            runtime_config = with_confined_parameters(self.config, self.model_dir)
            count = self.config.instance_count
            for index in range(count):
                self._give_up_if_stopping(stopping, f"after {index} of its {count} instances")
                self.instances.append(backend.load(self.path, runtime_config, index))
            self.scheduler = Scheduler(self.config, self.version_str, self.instances, self.stats, self._intake)
            if warmup:
                self._warm_up(stopping, stall_timeout_s)
        except WarmupStalled as e:
            self.instances = []  # abandoned to the stuck run's thread (see above)
            self.lifecycle.move(ModelState.FAILED, str(e))
            raise
        except EdgedError as e:
            self._close_instances()
            self.lifecycle.move(ModelState.FAILED, str(e))
            raise
        except Exception as e:  # a runtime raising something unexpected must not take the daemon down
            self._close_instances()
            reason = f"model {self.config.name} version {self.version}: load failed: {e}"
            self.lifecycle.move(ModelState.FAILED, reason)
            raise ModelLoadError(reason) from e
        self.load_seconds = time.monotonic() - started
        self.lifecycle.move(ModelState.READY)

    def _give_up_if_stopping(self, stopping: threading.Event | None, progress: str) -> None:
        if stopping is not None and stopping.is_set():
            raise Unavailable(f"model {self.config.name} version {self.version}: load abandoned {progress}: the "
                              "daemon is stopping")

    def _warm_up(self, stopping: threading.Event | None, stall_timeout_s: float | None) -> None:
        # the config's dims are the client's shape: reshaped as a request's inputs are before they reach the model
        samples = ((self.validator.reshaped(inputs), count)  # made one at a time, as they are run
                   for inputs, count in warmup_samples(self.config, self.model_dir, self.max_elements))
        output_names = [t.name for t in self.config.output]
        timings: list[float] = []
        for inputs, count in samples:
            for instance in self.instances:
                for _ in range(count + 2):  # two extra runs to time the steady state
                    # checked on every run, not once per instance: a stop waits for one run, not for `count`
                    self._give_up_if_stopping(stopping, "during warm-up")
                    try:
                        timings.append(self._timed_run(instance, inputs, output_names, stall_timeout_s))
                    except OutOfMemory as e:  # the device's memory, not the model, is short: a 503, not a 400
                        raise OutOfMemory(f"model {self.config.name} version {self.version}: warm-up ran out of "
                                          f"memory: {e}") from e
                    except WarmupStalled:
                        raise
                    except EdgedError as e:
                        raise ModelLoadError(f"model {self.config.name} version {self.version}: warm-up "
                                             f"failed: {e}") from e
            del inputs  # before the next sample is made: one sample's memory at a time
        if timings:
            self.exec_p50_us = statistics.median(timings[-3:])

    def _timed_run(self, instance: ModelInstance, inputs: dict[str, Any], output_names: list[str],
                   stall_timeout_s: float | None) -> float:
        """One warm-up run and its duration in microseconds. With ``stall_timeout_s`` it runs on a thread of its
        own, waited for that long: a run that never returns (a wedged backend) cannot hold the load, and with it
        the start and every model after this one, for ever."""
        if stall_timeout_s is None:
            began = time.perf_counter_ns()
            instance.run(inputs, output_names)
            return (time.perf_counter_ns() - began) / 1000
        outcome: list[float | BaseException] = []
        finished = threading.Event()

        def run() -> None:
            began = time.perf_counter_ns()
            try:
                instance.run(inputs, output_names)
                outcome.append((time.perf_counter_ns() - began) / 1000)
            except BaseException as e:  # handed to the load's thread, which raises it
                outcome.append(e)
            finally:
                finished.set()

        threading.Thread(target=run, name=f"warmup-{self.config.name}-{self.version}", daemon=True).start()
        if not finished.wait(stall_timeout_s):
            raise WarmupStalled(f"model {self.config.name} version {self.version}: load failed: a warm-up run was "
                                f"still running after {stall_timeout_s:g} s ([models] stall_timeout_s): the backend "
                                "is wedged; fix the model (or raise stall_timeout_s if its runs are that slow) and "
                                "load it again")
        (result,) = outcome
        if isinstance(result, BaseException):
            raise result
        return result

    def submit(self, request: InferRequest, done: Done, inline: bool) -> None:
        scheduler = self.scheduler
        if scheduler is None or self.lifecycle.state is not ModelState.READY:
            raise ModelNotReady(f"model {self.config.name} version {self.version} is "
                                f"{self.lifecycle.state.value.lower()}")
        plan = self.validator.check(request)
        if request.outputs and any(o.class_count for o in request.outputs):
            done = self._classifying(request, done)
        scheduler.submit_one(request, plan, done, inline)

    def _classifying(self, request: InferRequest, done: Done) -> Done:
        """Wrap ``done`` so outputs asked for with ``classification: k`` come back as Triton's top-k strings."""
        if self._labels is None:
            self._labels = load_labels(self.config, self.model_dir)
        labels = self._labels
        counts = {o.name: o.class_count for o in request.outputs if o.class_count}
        batched = self.config.max_batch_size > 0

        def finish(result: InferResponse | EdgedError) -> None:
            if isinstance(result, InferResponse):
                try:
                    for name, count in counts.items():
                        result.outputs[name] = classify(result.outputs[name], count, labels.get(name), batched,
                                                        self.config.name, name)
                except EdgedError as e:
                    result = e
                except Exception as e:  # the request's failure: raised on, it was never answered
                    log.exception("model %s: classification of %s failed", self.config.name, list(counts))
                    result = InferenceFailed(f"model {self.config.name}: classification failed: {e}")
            done(result)

        return finish

    def submit_many(self, calls: Sequence[tuple[InferRequest, Done]], inline: bool) -> None:
        """Queue several requests at once so they can share a batch; a request that fails validation gets
        its error through its own callback, the others still run."""
        scheduler = self.scheduler
        if scheduler is None or self.lifecycle.state is not ModelState.READY:
            error = ModelNotReady(f"model {self.config.name} version {self.version} is "
                                  f"{self.lifecycle.state.value.lower()}")
            for _, done in calls:
                done(error)
            return
        items = []
        for request, done in calls:
            try:
                plan = self.validator.check(request)
                if request.outputs and any(o.class_count for o in request.outputs):
                    done = self._classifying(request, done)
                items.append(scheduler.pending(request, plan, done))
            except EdgedError as e:
                done(e)
        if items:
            scheduler.submit(items, inline)

    def unload(self, timeout_s: float) -> None:
        """Stop taking requests, finish queued ones within ``timeout_s``, then drop the instances."""
        if self.lifecycle.state is ModelState.READY:
            self.lifecycle.move(ModelState.UNLOADING)
        if self.scheduler is not None and not self.scheduler.close(timeout_s):
            log.warning("model %s version %s: requests still running after %.1f s; unloading anyway",
                        self.config.name, self.version, timeout_s)
        self._close_instances()
        self.scheduler = None
        if self.lifecycle.state is not ModelState.UNLOADED:
            self.lifecycle.move(ModelState.UNLOADED, "unloaded")

    def _close_instances(self) -> None:
        for instance in self.instances:
            try:
                instance.close()
            except Exception:
                log.exception("model %s: closing an instance failed", self.config.name)
        for instance in self.instances:
            try:
                instance.release_memory()
            except Exception:
                log.exception("model %s: releasing memory failed", self.config.name)
        self.instances = []

    def describe_instances(self) -> list[dict[str, Any]]:
        return [{"device": i.info.device, "providers": list(i.info.providers), "fallback": i.info.fallback,
                 **i.info.details} for i in self.instances]
