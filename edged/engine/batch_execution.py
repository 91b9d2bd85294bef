"""Running one formed batch on one model instance and handing each request its result.

This is the part of the scheduler that holds no lock: it is entered with an instance the caller owns and a
batch already taken from the queue, and it returns once every request of the batch has its result. A batch
that fails is run again one request at a time, so only a bad request fails (its failure is its own result, not
the batch's); a backend's foreign exception becomes `InferenceFailed`. Every execution is timed into
`VersionStats` and listed in ``_running_since`` while it runs, which is what the watchdog reads.
`edged.engine.worker_pool` (the workers, the delay) and `edged.engine.scheduler` (submission, the inline paths)
build on it, in that order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from edged.backends.base import ModelInstance
from edged.engine.batch_rows import check_rows, concatenate, output_reshapes, reshape_outputs, selected, split
from edged.engine.queue_policy import Pending
from edged.engine.stats import VersionStats
from edged.engine.types import InferResponse
from edged.errors import EdgedError, InferenceFailed, RequestCancelled, RequestTimeout
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)

__all__ = ["BatchExecution"]


class BatchExecution:
    """Executes batches for one model version; the state its subclasses' lone-request path also writes."""

    def __init__(self, config: ModelConfig, version: str, stats: VersionStats) -> None:
        self._config = config
        self._version = version
        self._stats = stats
        self._output_names = [t.name for t in config.output]
        self._output_reshapes = output_reshapes(config)
        self._batching = config.max_batch_size > 0
        self._running_since: dict[int, int] = {}  # id(instance) → perf_counter_ns when its execution began
        self._told_batch_failure = False
        self.last_used = time.monotonic()

    def longest_execution_s(self) -> float:
        """How long the longest execution now running has taken (0 when idle); the watchdog reads it."""
        started = list(self._running_since.values())
        return (time.perf_counter_ns() - min(started)) / 1e9 if started else 0.0

    def _execute(self, instance: ModelInstance, batch: list[Pending]) -> None:
        self.last_used = time.monotonic()  # for eviction (least recently used); per execution, not per request
        start = time.perf_counter_ns()
        self._running_since[id(instance)] = start
        try:
            self._execute_batch(instance, batch, start)
        finally:
            self._running_since.pop(id(instance), None)

    def _execute_batch(self, instance: ModelInstance, batch: list[Pending], start: int) -> None:
        try:
            inputs = batch[0].inputs if len(batch) == 1 else concatenate(batch)
            merged = time.perf_counter_ns()
            outputs = instance.run(inputs, self._output_names)
            ran = time.perf_counter_ns()
            if self._output_reshapes:
                outputs = reshape_outputs(self._config.name, outputs, self._output_reshapes, self._batching)
            if len(batch) == 1:
                item = batch[0]
                request = item.request
                responses: list[InferResponse] = [InferResponse(
                    self._config.name, self._version, selected(request, outputs, self._output_names), request.id)]
                total_batch = item.batch_size
            else:
                total_batch = sum([item.batch_size for item in batch])
                check_rows(self._config.name, outputs, total_batch)
                responses = split(self._config.name, self._version, self._output_names, batch, outputs, total_batch)
        except Exception as e:
            if len(batch) > 1:  # find the culprit: each request alone, so only a bad one fails
                if not self._told_batch_failure:
                    self._told_batch_failure = True
                    log.warning("model %s: a batch of %d requests failed (%s); running each alone (said once)",
                                self._config.name, len(batch), e)
                for item in batch:
                    self._execute_batch(instance, [item], time.perf_counter_ns())
                return
            error = e if isinstance(e, EdgedError) else InferenceFailed(f"model {self._config.name}: {e}")
            if not isinstance(e, EdgedError):
                log.exception("model %s: backend raised an unexpected error", self._config.name)
            self._finish_error(batch[0], error)
            return
        finished = time.perf_counter_ns()
        self._stats.record_batch(total_batch, merged - start, ran - merged, finished - ran, start, finished,
                                 [batch[0].enqueued_ns] if len(batch) == 1 else [item.enqueued_ns for item in batch])
        self._deliver(batch, responses)

    def _finish_unrun(self, item: Pending) -> None:
        """A request taken out of the queue without running: its caller went away, or its timeout passed."""
        waited_us = (time.perf_counter_ns() - item.enqueued_ns) // 1000
        cancellation = item.request.cancellation
        if cancellation is not None and cancellation.cancelled:
            self._finish_error(item, RequestCancelled(
                f"model {self._config.name}: request cancelled by its caller after {waited_us} µs in the queue; "
                "it was not run"))
            return
        self._finish_error(item, RequestTimeout(
            f"model {self._config.name}: request timed out after {waited_us} µs in the queue"))

    def _finish_error(self, item: Pending, error: EdgedError) -> None:
        self._stats.record_request(False, time.perf_counter_ns() - item.enqueued_ns, 0)
        self._deliver((item,), (error,))

    def _deliver(self, items: Sequence[Pending], results: Sequence[InferResponse | EdgedError]) -> None:
        """Hand each item its result (one call per batch, the loop inside: this runs per request)."""
        for item, result in zip(items, results, strict=True):
            done = item.done
            item.request = None  # type: ignore[assignment]  # marks the item finished for inline executors
            try:
                done(result)
            except Exception:
                log.exception("model %s: a completion callback raised", self._config.name)
