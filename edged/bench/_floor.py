"""The in-process floor a server's latency is compared with: edged's engine, warm, in the measuring process.

A server's overhead is its p50 minus this floor's, so the floor must be what the server itself does for the
request, measured under the same conditions: the engine is `InferenceService` on the same repository copy the
daemon serves (the same config.pbtxt, so the same onnxruntime session options and defaults), it runs requests
as the daemon does for a model this slow (handed to the engine's worker, which idles between requests as the
daemon's does while a client's next request travels: ``gap_s``), on random data as perf_analyzer sends, and it
stays loaded and warm for the whole run, so each measurement is a short window taken right beside the
server's. On a loaded machine the wall time of a run is mostly waiting for a core (10-12 ms of CPU in 47-97 ms
of p50 for camera_frame, docs/benchmarks.md) and a loop that never sleeps waits longer than a thread woken
per request, so the engine's CPU per inference comes with every window: the load-robust floor.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.bench._inproc import start_service
from edged.bench._stats import Result, summarize
from edged.engine import InferRequest
from edged.errors import EdgedError
from edged.repository.datatypes import numpy_dtype

GAP_S = 0.002  # between requests: about what a shared-memory request spends outside the server's compute


def random_inputs(config: Any, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """One request's inputs at the model's shape, random over each type's range (integers too)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in config.input:
        dims = [d if d > 0 else 1 for d in spec.dims]
        shape = [batch, *dims] if config.max_batch_size > 0 else dims
        dtype = np.dtype(numpy_dtype(spec.data_type))
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            inputs[spec.name] = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        elif dtype.kind == "b":
            inputs[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            inputs[spec.name] = rng.random(shape).astype(dtype)
    return inputs


class EngineFloor:
    """``model`` loaded once from ``repository``; `measure` runs it at concurrency 1 for a short window."""

    def __init__(self, repository: Path, model: str, warmup_s: float = 2.0, gap_s: float = GAP_S) -> None:
        self.model = model
        self.gap_s = gap_s
        self._service = start_service(repository, model)
        self._inputs = random_inputs(self._service.model_config(model))
        self.measure(warmup_s)

    def measure(self, duration_s: float) -> tuple[Result, float]:
        """(latencies of the window, this process's CPU seconds per inference in it)."""
        latencies: list[float] = []
        errors = 0
        cpu = time.process_time()
        started = time.perf_counter()
        while not latencies or time.perf_counter() < started + duration_s:
            time.sleep(self.gap_s)
            outcome, latency = self._one()
            if isinstance(outcome, EdgedError):
                errors += 1
                if errors > 3:
                    raise outcome
                continue
            latencies.append(latency)
        result = summarize(f"{self.model} in process", "inproc-floor", self.model, 1, 1, latencies, errors,
                           time.perf_counter() - started)
        return result, (time.process_time() - cpu) / len(latencies)

    def _one(self) -> tuple[object, float]:
        finished = threading.Event()
        outcome: list[object] = []

        def done(result: object) -> None:
            outcome.append(result)
            finished.set()

        began = time.perf_counter()
        # inline=False: to the engine's worker, as the daemon hands a model this slow
        self._service.submit(InferRequest(self.model, self._inputs), done, inline=False)
        if not finished.wait(60):
            raise TimeoutError(f"{self.model}: no answer within 60 s")
        return outcome[0], (time.perf_counter() - began) * 1e6

    def close(self) -> None:
        self._service.close()
