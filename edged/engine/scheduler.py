"""Dynamic batching by group commit: whoever finds an idle instance runs the queue.

A submitter that finds an idle model instance executes the queued requests itself ("inline"), batching every
compatible request that queued up meanwhile; a submitter that finds all instances busy only enqueues, and the
busy executor picks its request up when its current batch ends. So an idle model pays no thread hop (about
70 µs on these machines, docs/field-notes.md), and under load requests batch themselves. Submitters that must not
block (an event loop with a slow model) or models with a queue delay use worker threads instead, one per
instance, started on first need. A request that fails inside a batch is retried alone, so it fails alone.

A batching delay (max_queue_delay_microseconds) counts from the first queued request; a worker waiting it out
is woken early only by a submit that fills the batch. When it ends while a front end still holds requests it
has read (`intake`), the batch waits for them once, for at most the delay again; a lone request never does.

Inline work is bounded from the moment the caller takes the instance, whatever the priorities: at most
INLINE_MAX_BATCHES batches and INLINE_MAX_NS, and INLINE_EXTRA_BATCHES once the caller's own requests are done;
then the rest goes to the workers and the caller returns (its own requests, if overtaken, finish on a worker).
So an event loop whose low-priority request keeps being overtaken never stalls HTTP, MQTT or the watchdog.
Queue policies, priority levels and batch formation live in `queue_policy`; ``preserve_ordering`` in `ordering`.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections.abc import Sequence

from edged.backends.base import ModelInstance
from edged.engine.batch_rows import check_rows, concatenate, selected, split
from edged.engine.intake import Intake
from edged.engine.ordering import ResponseOrder
from edged.engine.queue_policy import Done, Pending, PriorityQueues
from edged.engine.stats import VersionStats
from edged.engine.types import InferRequest, InferResponse
from edged.engine.validation import InputPlan
from edged.errors import EdgedError, InferenceFailed, QueueFull, RequestTimeout, Unavailable
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)

__all__ = ["Done", "Pending", "Scheduler"]

# An inline executor serves other callers' requests for at most this many batches after its own are done,
INLINE_EXTRA_BATCHES = 4
# and runs at most this many batches, for at most this long, in all (its own first batch always runs).
INLINE_MAX_BATCHES = 8
INLINE_MAX_NS = 2_000_000
# Linux rounds a thread's timed waits up by its timer slack (50 µs by default); a worker waiting out a batching
# delay of 100 µs must wake on time, so workers ask for 1 µs.
_PR_SET_TIMERSLACK = 29
WORKER_TIMER_SLACK_NS = 1000


class Scheduler:
    def __init__(self, config: ModelConfig, version: str, instances: Sequence[ModelInstance],
                 stats: VersionStats, intake: Intake | None = None) -> None:
        self._config = config
        self._intake = intake
        self.holds = 0  # batches held past their delay for requests a front end was reading, counted by tests
        self._version = version
        self._stats = stats
        self._idle: list[ModelInstance] = list(instances)
        self._instance_count = len(instances)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # workers wait here for work, and only workers
        self._sleepers = 0  # threads in self._wake.wait(); notifying nobody costs a microsecond, so we skip it
        self.wakeups = 0  # notifies of a sleeping worker: thread hand-offs, counted by tests
        # Workers waiting out a batching delay (or an intake hold): they wake at its end by themselves, so a
        # submit wakes nobody unless it fills the batch. Waking them per submit took the GIL from the event loop
        # in the middle of reading the requests that were to join the batch.
        self._delaying = 0
        self._held_for = 0  # enqueued_ns of the first request of the batch last held for the intake
        # `close` waits here for the queue to drain. Its own condition: a notify meant for a worker must never
        # be spent on it, or queued requests wait with an idle instance and a sleeping worker.
        self._settled = threading.Condition(self._lock)
        batching = config.dynamic_batching
        self._executing = 0
        self._max_batch = config.max_batch_size if (batching and config.max_batch_size > 0) else 0
        self._preferred = tuple(sorted(batching.preferred_batch_size)) if batching else ()
        self._target = self._preferred[-1] if self._preferred else self._max_batch  # rows that end a delay
        self._queue = PriorityQueues(batching, self._max_batch, self._preferred)
        self._order = ResponseOrder() if batching and batching.preserve_ordering else None
        self._delay_ns = batching.max_queue_delay_microseconds * 1000 if batching else 0
        self._output_names = [t.name for t in config.output]
        self._workers: list[threading.Thread] = []
        self._running_since: dict[int, int] = {}  # id(instance) → perf_counter_ns when its execution began
        self._closed = False
        self._told_batch_failure = False
        self.last_used = time.monotonic()

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
                if inline and not self._delay_ns and self._idle:
                    instance = self._idle.pop()
                    self._executing += 1
                else:
                    self._wake_worker_locked()
        if error is not None:
            self._finish_error(item, error)
        elif instance is not None:
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
            return QueueFull(f"model {self._config.name}: queue is full ({bound} requests waiting at priority "
                             f"level {item.level}); retry later")
        if self._order is not None:  # its place in the order is taken now, under the lock, in queueing order
            item.done = self._order.slot(item.done)
        return None

    def _wake_worker_locked(self) -> None:
        """Queued work that no caller runs: make sure workers exist, and wake one only if an instance is free for
        it. While all are busy, whoever finishes takes the queue; a worker woken now would only go back to sleep,
        after taking the GIL from the threads that have work."""
        if not self._workers:
            self._ensure_workers_locked()
        if self._sleepers and self._idle and not (self._delaying and not self._batch_full_locked()):
            self.wakeups += 1
            self._wake.notify()

    def _notify_locked(self, everyone: bool = False) -> None:
        if self._sleepers:
            self.wakeups += 1
            if everyone or self._closed:  # closing: each worker must see it, not just one
                self._wake.notify_all()
            else:
                self._wake.notify()
        if self._closed:  # an execution ended or work moved: `close` may be waiting for the queue to drain
            self._settled.notify_all()

    def _wait_locked(self, timeout_s: float | None = None) -> None:
        self._sleepers += 1
        try:
            self._wake.wait(timeout_s)
        finally:
            self._sleepers -= 1

    @property
    def delaying(self) -> int:
        """Workers now waiting out a batching delay or an intake hold."""
        return self._delaying

    @property
    def in_flight(self) -> int:
        return self._queue.count + self._executing

    def longest_execution_s(self) -> float:
        """How long the longest execution now running has taken (0 when idle); the watchdog reads it."""
        started = list(self._running_since.values())
        return (time.perf_counter_ns() - min(started)) / 1e9 if started else 0.0

    # --- executors -----------------------------------------------------------------------------------------
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
                    self._finish_timeout(item)
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

    def _ensure_workers_locked(self, closing: bool = False) -> None:
        if self._workers or (self._closed and not closing):
            return
        for index in range(self._instance_count):
            thread = threading.Thread(target=self._worker, name=f"edged-{self._config.name}-{index}",
                                      daemon=True)
            self._workers.append(thread)
            thread.start()

    def _worker(self) -> None:
        _precise_timers()
        self._lock.acquire()
        try:
            while True:
                if not (self._queue.count and self._idle):
                    if self._closed and not self._queue.count:
                        return  # closed and drained
                    self._wait_locked()
                    continue
                wait_s, held = self._batch_wait_locked()
                if wait_s > 0 and not self._closed:
                    self._delaying += 1
                    try:
                        self._wait_locked(wait_s)
                    finally:
                        self._delaying -= 1
                    if held and self._intake is not None:
                        self._intake.release(self._poke)
                    continue
                instance = self._idle.pop()
                self._executing += 1
                batch, expired = self._take_batch_locked()
                self._lock.release()
                try:
                    for item in expired:
                        self._finish_timeout(item)
                    if batch:
                        self._execute(instance, batch)
                finally:
                    self._lock.acquire()
                    self._idle.append(instance)
                    self._executing -= 1
                    self._notify_locked(everyone=True)
        finally:
            self._lock.release()

    def _batch_wait_locked(self) -> tuple[float, bool]:
        """Seconds to keep waiting for a fuller batch, or 0 to run now; and whether the wait is an intake hold.

        The wait is max_queue_delay_microseconds from the first queued request. Past it, the batch is held
        only while a front end is reading requests it will submit together (`edged.engine.intake`), once, until
        they are submitted and at most for the delay once more: a lone request waits its delay, never the hold."""
        if not self._delay_ns or not self._max_batch:
            return 0.0, False
        level = self._queue.urgent()
        if level is None:
            return 0.0, False
        if level.rows() >= self._target:
            return 0.0, False
        first = level.first().enqueued_ns
        remaining = first + self._delay_ns - time.perf_counter_ns()
        if remaining > 0:
            return remaining / 1e9, False
        intake = self._intake
        # held once: for the requests being read now, not for the iterations after them
        if intake is None or not intake.is_open or first == self._held_for:
            return 0.0, False
        remaining += self._delay_ns
        if remaining <= 0 or not intake.hold(self._poke):
            return 0.0, False
        self.holds += 1
        self._held_for = first
        return remaining / 1e9, True

    def _batch_full_locked(self) -> bool:
        level = self._queue.urgent()
        return level is not None and level.rows() >= self._target

    def _poke(self) -> None:
        """The intake closed: holding workers look at the queue again (every worker: any one may hold)."""
        with self._lock:
            self._notify_locked(everyone=True)

    # --- batch formation -----------------------------------------------------------------------------------
    def _take_batch_locked(self) -> tuple[list[Pending], list[Pending]]:
        queue = self._queue
        expired: list[Pending] = []
        if queue.next_deadline_ns:  # the clock is read only when some queued request has a deadline
            now = time.perf_counter_ns()
            if queue.next_deadline_ns < now:
                expired = queue.expire(now)
        return queue.take(), expired

    # --- execution -----------------------------------------------------------------------------------------
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

    def _finish_timeout(self, item: Pending) -> None:
        waited_us = (time.perf_counter_ns() - item.enqueued_ns) // 1000
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

    # --- shutdown ------------------------------------------------------------------------------------------
    def close(self, timeout_s: float) -> bool:
        """Refuse new requests, let queued ones finish within ``timeout_s``; True if all finished."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            if self._queue.count:
                self._ensure_workers_locked(closing=True)
            self._notify_locked(everyone=True)
            while self._queue.count + self._executing and time.monotonic() < deadline:
                self._settled.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            leftover = self._queue.drain()
            clean = not leftover and not self._executing
            self._wake.notify_all()  # closed and empty: every sleeping worker leaves now (joined below)
        for item in leftover:
            self._finish_error(item, Unavailable(f"model {self._config.name} unloaded before the request ran"))
        for thread in self._workers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return clean


def _precise_timers() -> None:
    """Set the calling thread's timer slack to WORKER_TIMER_SLACK_NS (Linux; elsewhere waits stay as they are)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_TIMERSLACK, WORKER_TIMER_SLACK_NS, 0, 0, 0) != 0:
            log.debug("prctl(PR_SET_TIMERSLACK) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.debug("cannot set the timer slack: %s", e)


def _all_finished(items: Sequence[Pending]) -> bool:
    if len(items) == 1:  # the common case, without a generator
        return items[0].request is None
    return all(item.request is None for item in items)

