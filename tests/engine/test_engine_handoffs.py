"""Thread hand-offs inside the engine, counted so that they cannot creep back (issue #12 §4): a caller that runs
its batches inline wakes no engine worker, even once the workers exist and sleep."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from modelgen import add_model, mlp_weights

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, InferResponse
from edged.errors import EdgedError

CALLS = 200


def test_inline_batches_wake_no_sleeping_worker(tmp_path: Path) -> None:
    add_model(tmp_path, "mlp", None, {1: mlp_weights()})
    service = InferenceService(tmp_path, ModelsConfig(warmup=False))
    service.start()
    try:
        request = InferRequest("mlp", {"input": np.zeros((1, 64), np.float32)})
        first = threading.Event()
        service.submit(request, lambda result: first.set(), inline=False)  # starts the workers
        assert first.wait(60)
        scheduler = service.version_info("mlp").scheduler
        assert scheduler is not None
        # The worker that ran the first request notifies its peers after its callback has returned, in the same
        # critical section that ends its execution: read the count once that section is over, not at first.set().
        before = _wakeups_once_idle(scheduler)
        results: list[InferResponse | EdgedError] = []
        for _ in range(CALLS):
            service.submit_many("mlp", "", [(request, results.append), (request, results.append)], inline=True)
        assert len(results) == 2 * CALLS  # each ran on this thread before submit_many returned
        assert all(isinstance(r, InferResponse) for r in results)
        assert scheduler.wakeups - before == 0  # before: one notify of a sleeping worker per call
    finally:
        service.close()


def _wakeups_once_idle(scheduler) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while True:
        with scheduler._lock:
            if scheduler.in_flight == 0:
                return int(scheduler.wakeups)
        assert time.monotonic() < deadline, "the first request's worker never finished"
        time.sleep(0.001)
