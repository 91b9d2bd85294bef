"""Dynamic batching by group commit: whoever finds an idle instance runs the queue.

A submitter that finds an idle model instance executes the queued requests itself ("inline"), batching every
compatible request that queued up meanwhile; a submitter that finds all instances busy only enqueues, and the
busy executor picks its request up when its current batch ends. So an idle model pays no thread hop (about
70 µs on these machines, docs/field-notes.md), and under load requests batch themselves. Submitters that must not
block (an event loop with a slow model) or models with a queue delay use worker threads instead, one per
instance, started on first need (a lone request with a short delay excepted: its caller waits, `worker_pool`).
A lone request on an idle model with nothing queued skips the queue altogether (`_run_alone`); every call
on that path is paid per request, so it stays one straight method here.

Inline work is bounded from the moment the caller takes the instance, whatever the priorities: at most
INLINE_MAX_BATCHES batches and INLINE_MAX_NS, and INLINE_EXTRA_BATCHES once the caller's own requests are done;
then the rest goes to the workers and the caller returns (its own requests, if overtaken, finish on a worker).
So an event loop whose low-priority request keeps being overtaken never stalls HTTP, MQTT or the watchdog.

The parts, each building on the one before: `batch_execution` runs a formed batch and delivers its results
(a request that fails inside a batch is retried alone, so it fails alone); `worker_pool` holds the lock, the
queue and the idle instances, runs the worker threads and the batching delay and intake hold; this module adds
submission and the inline paths. Queue policies, priority levels and batch formation live in `queue_policy`;
``preserve_ordering`` in `ordering`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from edged.backends.base import ModelInstance
from edged.engine.batch_rows import reshape_outputs, selected
from edged.engine.intake import Intake
from edged.engine.ordering import ResponseOrder
from edged.engine.queue_policy import Done, Pending
from edged.engine.stats import VersionStats
from edged.engine.types import InferRequest, InferResponse
from edged.engine.validation import InputPlan
from edged.engine.worker_pool import WorkerPool
from edged.errors import EdgedError, InferenceFailed, QueueFull, Unavailable
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)

__all__ = ["Done", "Pending", "Scheduler"]

# An inline executor serves other callers' requests for at most this many batches after its own are done,
INLINE_EXTRA_BATCHES = 4
# and runs at most this many batches, for at most this long, in all (its own first batch always runs).
INLINE_MAX_BATCHES = 8
INLINE_MAX_NS = 2_000_000


class Scheduler(WorkerPool):
    """Submission and the inline paths of one model version; the worker side is `WorkerPool`'s."""

    def __init__(self, config: ModelConfig, version: str, instances: Sequence[ModelInstance],
                 stats: VersionStats, intake: Intake | None = None) -> None:
        super().__init__(config, version, instances, stats, intake)
        batching = config.dynamic_batching
        self._order = ResponseOrder() if batching and batching.preserve_ordering else None

    # --- submission ----------------------------------------------------------------------------------------
    def pending(self, request: InferRequest, plan: InputPlan, done: Done) -> Pending:
        return self._queue.pending(request, plan, done)

    def submit(self, items: Sequence[Pending], inline: bool) -> None:
        """Queue ``items``; with ``inline`` the caller may execute them (and others) before returning."""
        rejected: list[tuple[Pending, EdgedError]] = []
        instance: ModelInstance | None = None
        with self._lock:
            for item in items:
                error = self._admit_locked(item)
                if error is not None:
                    rejected.append((item, error))
            if self._queue.count:
                if inline and not self._delay_ns and self._idle:
                    instance = self._idle.pop()
                    self._executing += 1
                else:
                    self._wake_worker_locked()
        for item, error in rejected:
            self._finish_error(item, error)
        if instance is not None:
            self._drain_inline(instance, items)

    def submit_one(self, request: InferRequest, plan: InputPlan, done: Done, inline: bool) -> None:
        """`submit` for a single request, the path nearly every request takes (without the lists)."""
        instance: ModelInstance | None = None
        with self._lock:
            if (inline and self._idle and not self._queue.count and not self._delay_ns and self._order is None
                    and not self._closed):
                # Nothing waits and nothing orders responses: the request runs now, without the trip through
                # the queue (it could only be taken straight back out, alone).
                instance = self._idle.pop()
                self._executing += 1
        if instance is not None:
            self._run_alone(instance, request, plan, done)
            return
        item = self._queue.pending(request, plan, done)
        error: EdgedError | None = None
        with self._lock:
            error = self._admit_locked(item)
            if error is None:
                if inline and self._idle and (not self._delay_ns or self._caller_waits_locked(inline)):
                    instance = self._idle.pop()
                    self._executing += 1
                else:
                    self._wake_worker_locked()
        if error is not None:
            self._finish_error(item, error)
        elif instance is not None:
            if self._delay_ns:  # a lone request: its caller waits the delay out and runs it (worker_pool)
                self._wait_out_delay(instance)
            self._drain_inline(instance, (item,))

    def _run_alone(self, instance: ModelInstance, request: InferRequest, plan: InputPlan, done: Done) -> None:
        """What `_execute` and `_drain_inline` do for one request that never queued, in one straight line: this
        is a lone request's whole engine path, so every call saved here is saved per request."""
        start = time.perf_counter_ns()
        key = id(instance)
        try:
            self.last_used = time.monotonic()
            self._running_since[key] = start
            batch_size, inputs, _ = plan
            try:
                merged = time.perf_counter_ns()
                outputs = instance.run(inputs, self._output_names)
                ran = time.perf_counter_ns()
                if self._output_reshapes:
                    outputs = reshape_outputs(self._config.name, outputs, self._output_reshapes, self._batching)
                if request.outputs or len(outputs) != len(self._output_names):
                    outputs = selected(request, outputs, self._output_names)
                result: InferResponse | EdgedError = InferResponse(self._config.name, self._version, outputs,
                                                                   request.id)
            except Exception as e:
                if not isinstance(e, EdgedError):
                    log.exception("model %s: backend raised an unexpected error", self._config.name)
                result = e if isinstance(e, EdgedError) else InferenceFailed(f"model {self._config.name}: {e}")
                self._stats.record_request(False, time.perf_counter_ns() - start, 0)
            else:
                self._stats.record_alone(batch_size, merged - start, ran - merged, start, time.perf_counter_ns())
            finally:
                self._running_since.pop(key, None)
            try:
                done(result)
            except Exception:
                log.exception("model %s: a completion callback raised", self._config.name)
            with self._lock:
                if not self._queue.count:
                    self._idle.append(instance)
                    self._executing -= 1
                    if self._closed:
                        self._notify_locked()
                    return
        except BaseException:
            with self._lock:
                self._idle.append(instance)
                self._executing -= 1
                self._notify_locked()
            raise
        # Requests queued behind this one while it ran: this caller serves them, as after any inline batch.
        finished = self._queue.pending(request, plan, done)
        finished.enqueued_ns, finished.request = start, None  # type: ignore[assignment]
        self._drain_inline(instance, (finished,))

    def _admit_locked(self, item: Pending) -> EdgedError | None:
        if self._closed:
            return Unavailable(f"model {self._config.name} version {self._version} is unloading")
        bound = self._queue.push(item)
        if bound:
            if self._queue.shares_bound(item.level):
                return QueueFull(f"model {self._config.name}: queue is full ({bound} requests waiting at the "
                                 f"priority levels without their own priority_queue_policy, level {item.level} "
                                 "among them: default_queue_policy's max_queue_size bounds them together); retry "
                                 "later")
            return QueueFull(f"model {self._config.name}: queue is full ({bound} requests waiting at priority "
                             f"level {item.level}); retry later")
        if self._order is not None:  # its place in the order is taken now, under the lock, in queueing order
            item.done = self._order.slot(item.done)
        if item.deadline_ns:
            self._watch_deadline_locked(item.deadline_ns)
        return None

    # --- the inline executor ------------------------------------------------------------------------------
    def _drain_inline(self, instance: ModelInstance, own: Sequence[Pending]) -> None:
        """Execute what the queue holds, ``own`` first (queued), within the inline share."""
        ran = extra = 0
        started = own[0].enqueued_ns  # queued just now, by this caller: no clock read for the start
        try:
            while True:
                with self._lock:
                    mine_done = _all_finished(own)
                    # its share (module docstring) spent? Its first batch always runs. An empty queue needs no
                    # look (the usual end of a lone request's drain).
                    if not self._queue.count or (ran and (ran >= INLINE_MAX_BATCHES or extra >= INLINE_EXTRA_BATCHES
                                                          or time.perf_counter_ns() - started >= INLINE_MAX_NS)):
                        batch: list[Pending] = []
                        expired: list[Pending] = []
                    else:
                        batch, expired = self._take_batch_locked()
                    if not batch:
                        if self._queue.count:  # what the caller leaves goes to a worker
                            self._ensure_workers_locked()
                        self._idle.append(instance)
                        self._executing -= 1
                        # wake a worker only if one sleeps and there is work for it (or to let it see the close)
                        if self._closed or (self._queue.count and self._sleepers):
                            self._notify_locked()
                        instance = None  # type: ignore[assignment]
                for item in expired:
                    self._finish_unrun(item)
                if instance is None:
                    return
                ran += 1
                if mine_done:
                    extra += 1
                self._execute(instance, batch)
        except BaseException:
            if instance is not None:
                with self._lock:
                    self._idle.append(instance)
                    self._executing -= 1
                    self._notify_locked()
            raise


def _all_finished(items: Sequence[Pending]) -> bool:
    if len(items) == 1:  # the common case, without a generator
        return items[0].request is None
    return all(item.request is None for item in items)
