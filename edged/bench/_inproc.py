"""The in-process transport: the engine driven by callbacks, threads or coroutines, beside raw onnxruntime.

Three kinds of caller keep ``concurrency`` requests in flight:

- ``callbacks``: completion callbacks through `InferenceService.submit`, as perf_analyzer's ``--async`` mode keeps
  its concurrency; no thread or coroutine per request, so what is measured is the engine. The front ends (socket
  server, MQTT) use the engine this way.
- ``threads``: one thread per request calling the blocking `infer()`; every request pays a thread wake-up and a
  GIL hand-off, which dominate with a fast model.
- ``asyncio``: coroutines on one event loop awaiting `infer_async()`; each request pays a future and a task wake-up.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.bench._stats import Result, summarize
from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import EdgedError
from edged.repository.datatypes import numpy_dtype


def make_inputs(service: InferenceService, model: str, batch: int) -> dict[str, Any]:
    config = service.model_config(model)
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in config.input:
        dims = [d if d > 0 else 1 for d in spec.dims]
        shape = [batch, *dims] if config.max_batch_size > 0 else dims
        inputs[spec.name] = rng.random(shape).astype(numpy_dtype(spec.data_type))
    return inputs


def start_service(repository: Path, model: str) -> InferenceService:
    service = InferenceService(repository, ModelsConfig(control_mode="explicit", startup_models=(model,)))
    service.start()
    return service


def set_batching(service: InferenceService, model: str, enabled: bool) -> None:
    """Reload ``model`` with dynamic batching on (as configured, or an empty block) or off."""
    config = service.model_config(model)
    if enabled:
        from edged.repository.model_config import DynamicBatching
        config = dataclasses.replace(config, dynamic_batching=config.dynamic_batching or DynamicBatching())
    else:
        config = dataclasses.replace(config, dynamic_batching=None)
    service.load_model(model, config)


def run_engine(service: InferenceService, label: str, model: str, inputs: dict[str, Any], concurrency: int,
               duration_s: float, batch: int) -> Result:
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    start_line = threading.Barrier(concurrency + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        own = latencies[index]
        start_line.wait()
        end = deadline[0]
        clock = time.perf_counter
        while True:
            began = clock()
            if began >= end:
                return
            try:
                service.infer(InferRequest(model, inputs))
            except Exception:
                errors[index] += 1
                continue
            own.append((clock() - began) * 1e6)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + duration_s
    began = time.perf_counter()
    start_line.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    merged = [value for own in latencies for value in own]
    return summarize(label, "inproc-threads", model, concurrency, batch, merged, sum(errors), elapsed)


def run_engine_callbacks(service: InferenceService, label: str, model: str, inputs: dict[str, Any],
                         concurrency: int, duration_s: float, batch: int) -> Result:
    """``concurrency`` requests kept in flight: each completion callback submits the next request."""
    clock = time.perf_counter
    began = [0.0] * concurrency
    latencies: list[float] = []
    counters = {"errors": 0, "in_flight": concurrency}
    guard = threading.Lock()
    finished = threading.Event()
    end = clock() + duration_s

    def retire() -> None:
        with guard:
            counters["in_flight"] -= 1
            if not counters["in_flight"]:
                finished.set()

    def submit(slot: int) -> None:
        began[slot] = clock()
        try:
            # inline=False: completions run on the engine's worker, which then runs what they queued
            service.submit(InferRequest(model, inputs), callbacks[slot], inline=False)
        except EdgedError:
            with guard:
                counters["errors"] += 1
            retire()  # refused before queueing: this slot stops rather than spin on the error

    def complete(slot: int, result: object) -> None:
        now = clock()
        if isinstance(result, EdgedError):
            with guard:
                counters["errors"] += 1
        else:
            latencies.append((now - began[slot]) * 1e6)
        if now < end:
            submit(slot)
        else:
            retire()

    callbacks = [functools.partial(complete, slot) for slot in range(concurrency)]
    started = clock()
    for slot in range(concurrency):
        submit(slot)
    if not finished.wait(duration_s + 60):
        raise TimeoutError(f"{label}: requests still in flight 60 s after the measurement ended")
    elapsed = clock() - started
    return summarize(label, "inproc-callbacks", model, concurrency, batch, latencies, counters["errors"], elapsed)


def run_raw_onnxruntime(model_path: Path, label: str, model: str, inputs: dict[str, Any], duration_s: float,
                        batch: int) -> Result:
    """The physical limit: a bare ``session.run`` loop with the same thread settings as edged's default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    latencies: list[float] = []
    clock = time.perf_counter
    end = clock() + duration_s
    began_all = clock()
    while True:
        began = clock()
        if began >= end:
            break
        session.run(names, inputs)
        latencies.append((clock() - began) * 1e6)
    return summarize(label, "raw-onnxruntime", model, 1, batch, latencies, 0, clock() - began_all)


def run_engine_asyncio(service: InferenceService, label: str, model: str, inputs: dict[str, Any],
                       concurrency: int, duration_s: float, batch: int) -> Result:
    """``concurrency`` coroutines on one event loop, each awaiting `InferenceService.infer_async` in a loop."""
    import asyncio

    latencies: list[float] = []
    errors = [0]

    async def worker(end: float) -> None:
        clock = time.perf_counter
        while True:
            began = clock()
            if began >= end:
                return
            try:
                await service.infer_async(InferRequest(model, inputs))
            except Exception:
                errors[0] += 1
                continue
            latencies.append((clock() - began) * 1e6)

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(worker(began + duration_s) for _ in range(concurrency)))
        return time.perf_counter() - began

    elapsed = asyncio.run(main())
    return summarize(label, "inproc-asyncio", model, concurrency, batch, latencies, errors[0], elapsed)


def execution_counts(service: InferenceService, model: str) -> tuple[int, int]:
    """(inferences, executions) of the model's default version so far: their ratio is the mean batch size."""
    stats = service.statistics(model)["model_stats"]
    return (sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats))
