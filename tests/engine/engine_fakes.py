"""Test backends that stand in for a runtime at the hardware edge: they compute y = 2x (output "output") and
-x (output "negated", when the config lists it), and can be told by their config parameters to fail on a marker
value, to be slow (to run, to load each instance, to close), or to count concurrent executions."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import InstanceInfo
from edged.config import ModelsConfig
from edged.engine import InferenceService
from edged.engine.scheduler import Scheduler
from edged.errors import InferenceFailed, ModelLoadError
from edged.repository.model_config import ModelConfig, ModelSignature

# Shared across instances of one test process on purpose: tests read how many ran at once.
CONCURRENCY = {"now": 0, "max": 0, "calls": 0, "batches": []}
LOCK = threading.Lock()
RELEASE = threading.Event()


class DoublingInstance:
    def __init__(self, config: ModelConfig) -> None:
        self.info = InstanceInfo(device="cpu", details={"fake": True})
        self._delay = float(config.parameters.get("delay_s", "0"))
        self._fail_marker = float(config.parameters.get("fail_on", "nan"))
        self._block = config.parameters.get("block_until_released", "") == "true"
        self._first_row_only = config.parameters.get("first_row_only", "") == "true"  # a model that cannot batch
        self._close_s = float(config.parameters.get("close_delay_s", "0"))  # a runtime slow to free its engine

    def run(self, inputs: Mapping[str, Any], output_names: Sequence[str]) -> dict[str, Any]:
        x = inputs["input"]
        with LOCK:
            CONCURRENCY["now"] += 1
            CONCURRENCY["calls"] += 1
            CONCURRENCY["max"] = max(CONCURRENCY["max"], CONCURRENCY["now"])
            CONCURRENCY["batches"].append(int(x.shape[0]))
        try:
            if self._block:
                RELEASE.wait(30)
            if self._delay:
                time.sleep(self._delay)
            if np.any(x == self._fail_marker):
                raise InferenceFailed(f"input holds the marker value {self._fail_marker}")
            computed = {"output": lambda: x * 2, "negated": lambda: -x}  # a config may list either or both
            rows = 1 if self._first_row_only else len(x)
            return {name: computed[name]()[:rows] for name in output_names}
        finally:
            with LOCK:
                CONCURRENCY["now"] -= 1

    def release_memory(self) -> None:
        return

    def close(self) -> None:
        if self._close_s:
            time.sleep(self._close_s)


class DoublingBackend:
    name = "doubling"

    def describe(self, model_path: Path) -> ModelSignature:
        raise ModelLoadError("the doubling test backend needs a full config")

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> DoublingInstance:
        # A runtime slow to build each instance (a large engine): uninterruptible, as a real backend's load is.
        # The line on stdout lets a test see from the daemon's log that the load is under way.
        load_delay_s = float(config.parameters.get("load_delay_s", "0"))
        if load_delay_s:
            print(f"doubling backend: loading {config.name} instance {instance_index}", flush=True)
            time.sleep(load_delay_s)
        return DoublingInstance(config)

    def runtime_info(self) -> dict[str, Any]:
        return {"available": True}

    def available_gpus(self) -> tuple[int, ...]:
        return ()


class CrashingBackend(DoublingBackend):
    """A runtime with a bug: describing a model file (auto-complete of a config without inputs and outputs) raises
    something that is not an edged error, as a third-party runtime may."""

    name = "crashing"

    def describe(self, model_path: Path) -> ModelSignature:
        raise RuntimeError(f"simulated runtime bug describing {model_path.name}")


def reset() -> None:
    with LOCK:
        CONCURRENCY.update(now=0, max=0, calls=0, batches=[])
    RELEASE.clear()


# What a test puts in ModelsConfig.backends to serve models with `backend: "doubling"`.
BACKENDS = {"doubling": "engine_fakes:DoublingBackend", "crashing": "engine_fakes:CrashingBackend"}


def start_service(repo: Path) -> InferenceService:
    """A started service over ``repo`` with the doubling backend, warm-up off, fakes reset."""
    reset()
    service = InferenceService(repo, ModelsConfig(backends=BACKENDS, warmup=False))
    service.start()
    assert service.ready
    return service


def wait_until_running() -> None:
    """Wait until some execution has started (with block_until_released: it now holds its instance)."""
    for _ in range(5000):
        if CONCURRENCY["now"]:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the first request never started running")


def delayed_service(repo: Path, delay_us: int) -> InferenceService:
    """A service whose one model "m" doubles its input, batches up to 16 and waits ``delay_us`` for a batch."""
    # imported here: daemons load this module as a backend (engine_fakes:DoublingBackend) where tests/ is not
    # on the path, so it may import only edged and numpy at its top
    from modelgen import add_custom_model

    add_custom_model(repo, "m", "doubling", f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}",
                     max_batch=16)
    return start_service(repo)


def scheduler_of(service: InferenceService) -> Scheduler:
    scheduler = service.record_for("m").versions[1].scheduler
    assert scheduler is not None
    return scheduler
