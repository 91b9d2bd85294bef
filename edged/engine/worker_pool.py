"""The scheduler's shared state and its worker threads: who sleeps, who is woken, how long a batch waits.

One lock guards the queue, the idle instances and the counters below; `edged.engine.scheduler` submits and runs
work inline under the same lock, and this module owns everything that happens on a worker thread. Workers are
started on first need, one per instance, and a worker is woken only when an instance is free for it: while all
are busy, whoever finishes takes the queue, and a worker woken then would only take the GIL from the threads that
have work. `close` has its own condition, so a notify meant for a worker is never spent on it.

A batching delay (max_queue_delay_microseconds) counts from the first queued request; a worker waiting it out
is woken early only by a submit that fills the batch. When it ends while a front end still holds requests it
has read (`intake`), the batch waits for them once, for at most the delay again; a lone request never does.

A lone request of a model its caller may run (inline) has no worker at all when the delay is short
(CALLER_DELAY_MAX_NS): its caller holds an instance, waits the delay out itself and runs the batch, so the
request pays neither the hop to a worker nor the one back (about 70 µs each, docs/field-notes.md), and the
wait sleeps only until shortly before its end (edged.engine.delay_wait): a sleep ends 20-130 µs late (p50).
A submit that fills the batch wakes that caller and no worker. Only a submit that finds nothing queued, running
or waiting, no front end holding requests it has read, and the model's previous batch run alone after its
delay (solo traffic) is lone: the caller's thread (an event loop) does nothing else while it waits, so the bet
is taken only where nothing else was seen arriving. What arrives while it waits stays unread, so a batch run alone
after such a wait proves nothing: every CALLER_PROBE_EVERY-th lone batch in a row is left to a worker, with the
loop free to read, and under concurrent traffic that batch fills and the bet stops (at most that many batches of
one when a burst begins).
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections.abc import Sequence

from edged.backends.base import ModelInstance
from edged.engine.batch_execution import BatchExecution
from edged.engine.delay_wait import Lateness, spin_until
from edged.engine.intake import Intake
from edged.engine.queue_policy import Pending, PriorityQueues
from edged.engine.stats import VersionStats
from edged.errors import Unavailable
from edged.repository.model_config import ModelConfig

log = logging.getLogger(__name__)

__all__ = ["CALLER_DELAY_MAX_NS", "WORKER_TIMER_SLACK_NS", "WorkerPool", "precise_timers"]

# Linux rounds a thread's timed waits up by its timer slack (50 µs by default); a worker waiting out a batching
# delay of 100 µs must wake on time, so workers ask for 1 µs.
_PR_SET_TIMERSLACK = 29
WORKER_TIMER_SLACK_NS = 1000
# The longest batching delay a lone request's caller waits out itself: its thread (an event loop) is blocked
# meanwhile, as by an inline execution, so no longer than the inline work a loop already lends (INLINE_MAX_NS,
# inline_execution_max_us); past a few hundred µs the two hops are a small share of the delay anyway.
CALLER_DELAY_MAX_NS = 500_000
# A caller that waits out a delay blocks its event loop, so requests arriving meanwhile stay unread and the batch
# runs alone: under concurrent traffic the bet would confirm itself forever (a gRPC client at concurrency 16 got
# batches of one). Every so many lone batches in a row, one is left to a worker instead, with the loop free to
# read: if others were waiting, they join it and the traffic is no longer taken for lone.
CALLER_PROBE_EVERY = 8
SOLO_EVIDENCE = 2
_MAX_WAIT_S = 3600.0  # the longest single timed wait of a worker (see _wait_locked)


class WorkerPool(BatchExecution):
    """The queue, the idle instances and the workers that run what no submitter runs inline."""

    def __init__(self, config: ModelConfig, version: str, instances: Sequence[ModelInstance],
                 stats: VersionStats, intake: Intake | None) -> None:
        super().__init__(config, version, stats)
        self._intake = intake
        self.holds = 0  # batches held past their delay for requests a front end was reading, counted by tests
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
        # The expirer: one thread, started with the first request that has a deadline, that refuses queued
        # requests at their deadlines while no worker can (every instance busy with a run that takes minutes or
        # never ends). Its own condition: a notify meant for a worker is never spent on it.
        self._expirer: threading.Thread | None = None
        self._expirer_wake = threading.Condition(self._lock)
        self._expiry_at = 0  # the deadline the expirer sleeps until (0: until woken)
        self._held_for = 0  # enqueued_ns of the first request of the batch last held for the intake
        # A caller waiting out the delay itself (`_wait_out_delay`), on its own condition: a submit that fills its
        # batch must wake it, and never a worker in its place.
        self._caller_waiting = False
        self._caller_wake = threading.Condition(self._lock)
        # Batches in a row that a worker took and ran one request alone after the delay; from SOLO_EVIDENCE on,
        # the traffic is taken for lone (one such batch also happens now and then under concurrent traffic).
        self._solo = 0
        self._caller_runs = 0  # lone batches in a row whose caller waited the delay out (CALLER_PROBE_EVERY)
        self._lateness = Lateness()  # of the caller's sleeps, so it wakes before the delay's end and spins the rest
        self._precise = threading.local()  # .set: this thread's timer slack is WORKER_TIMER_SLACK_NS
        # `close` waits here for the queue to drain. Its own condition: a notify meant for a worker must never
        # be spent on it, or queued requests wait with an idle instance and a sleeping worker.
        self._settled = threading.Condition(self._lock)
        batching = config.dynamic_batching
        self._executing = 0
        self._max_batch = config.max_batch_size if (batching and config.max_batch_size > 0) else 0
        self._preferred = tuple(sorted(batching.preferred_batch_size)) if batching else ()
        self._target = self._preferred[-1] if self._preferred else self._max_batch  # rows that end a delay
        self._queue = PriorityQueues(batching, self._max_batch, self._preferred)
        self._delay_ns = batching.max_queue_delay_microseconds * 1000 if batching else 0
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def delaying(self) -> int:
        """Workers now waiting out a batching delay or an intake hold."""
        return self._delaying

    @property
    def in_flight(self) -> int:
        return self._queue.count + self._executing

    # --- waking and waiting --------------------------------------------------------------------------------
    def _wake_worker_locked(self) -> None:
        """Queued work that no caller runs: make sure workers exist, and wake one only if an instance is free for
        it. While all are busy, whoever finishes takes the queue; a worker woken now would only go back to sleep,
        after taking the GIL from the threads that have work."""
        if self._caller_waiting:  # the waiting caller runs what is queued: wake it once the batch is full, only it
            if self._batch_full_locked():
                self._caller_wake.notify()
            return
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
            # capped: a wait past what the platform's clock holds raises OverflowError and would end the worker; a
            # worker woken early recomputes its wait and sleeps again
            self._wake.wait(None if timeout_s is None else min(timeout_s, _MAX_WAIT_S))
        finally:
            self._sleepers -= 1

    # --- workers -------------------------------------------------------------------------------------------
    def _ensure_workers_locked(self, closing: bool = False) -> None:
        if self._workers or (self._closed and not closing):
            return
        for index in range(self._instance_count):
            thread = threading.Thread(target=self._worker, name=f"edged-{self._config.name}-{index}",
                                      daemon=True)
            self._workers.append(thread)
            thread.start()

    def _worker(self) -> None:
        precise_timers()
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
                        self._wait_locked(self._until_deadline_s(wait_s))
                    finally:
                        self._delaying -= 1
                    if held and self._intake is not None:
                        self._intake.release(self._poke)
                    self._expire_while_delaying_locked()
                    continue
                instance = self._idle.pop()
                self._executing += 1
                batch, expired = self._take_batch_locked()
                if self._delay_ns:  # only a worker's batch says it: the loop was free to read while it waited
                    self._solo = self._solo + 1 if len(batch) == 1 else 0
                self._lock.release()
                try:
                    for index in range(len(expired)):  # no loop variable left holding the last one
                        self._finish_unrun(expired[index])
                    if batch:
                        self._execute(instance, batch)
                finally:
                    # wait for the next batch holding nothing of this one: its inputs may be views of a
                    # shared-memory region, which cannot be unmapped while an array over it lives
                    batch = expired = []
                    self._lock.acquire()
                    self._idle.append(instance)
                    self._executing -= 1
                    self._notify_locked(everyone=True)
        finally:
            self._lock.release()

    # --- deadlines while every instance is busy ------------------------------------------------------------
    def _watch_deadline_locked(self, deadline_ns: int) -> None:
        """A request with this deadline was queued: the expirer wakes for it if it sleeps past it."""
        if self._expirer is None:
            if self._closed:
                return
            self._expirer = threading.Thread(target=self._expire_on_time, name=f"edged-{self._config.name}-expiry",
                                             daemon=True)
            self._expirer.start()
        elif not self._expiry_at or deadline_ns < self._expiry_at:
            self._expirer_wake.notify()

    def _expire_on_time(self) -> None:
        """Refuse (REJECT) or move back (DELAY) queued requests when their deadline passes, whether or not an
        instance is free: a request's timeout does not wait for a run that takes minutes, or a wedged backend."""
        with self._lock:
            while not self._closed:
                nearest = self._queue.next_deadline_ns if self._queue.count else 0
                now = time.perf_counter_ns()
                if nearest and nearest < now:
                    self._expire_while_delaying_locked()
                    continue
                self._expiry_at = nearest
                try:
                    self._expirer_wake.wait(None if not nearest else min((nearest - now) / 1e9 + 1e-4, _MAX_WAIT_S))
                finally:
                    self._expiry_at = 0

    # --- the batching delay and the intake hold ------------------------------------------------------------
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

    def _until_deadline_s(self, wait_s: float) -> float:
        """``wait_s``, cut short to the earliest deadline of a queued request: as Triton's batcher, a request
        whose timeout is shorter than the batching delay is refused at its timeout, not at the delay's end."""
        nearest = self._queue.next_deadline_ns
        if not nearest:
            return wait_s
        return min(wait_s, max(0.0, (nearest - time.perf_counter_ns()) / 1e9) + 1e-4)

    def _expire_while_delaying_locked(self) -> None:
        """Finish (REJECT) or move back (DELAY) the requests whose timeout passed while the batch waited."""
        queue = self._queue
        if not queue.next_deadline_ns or queue.next_deadline_ns >= time.perf_counter_ns():
            return
        expired = queue.expire(time.perf_counter_ns())
        if not expired:
            return
        self._lock.release()
        try:
            for index in range(len(expired)):
                self._finish_unrun(expired[index])
        finally:
            expired = []
            self._lock.acquire()

    def _caller_waits_locked(self, inline: bool) -> bool:
        """Whether the caller of the lone request just queued waits out the delay itself (module docstring). A
        yes is counted: it is the decision itself, taken once per such request, and every CALLER_PROBE_EVERY-th
        is a no (the probe)."""
        if not (inline and self._solo >= SOLO_EVIDENCE and 0 < self._delay_ns <= CALLER_DELAY_MAX_NS and self._idle
                and self._queue.count == 1 and not (self._executing or self._delaying or self._closed)
                and not (self._intake is not None and self._intake.is_open)):
            return False
        if self._caller_runs >= CALLER_PROBE_EVERY - 1:  # this one goes to a worker: the probe
            self._caller_runs = 0
            return False
        self._caller_runs += 1
        return True

    def _wait_out_delay(self, instance: ModelInstance) -> None:
        """Wait on the caller's thread, which holds ``instance``, until the batch is full or its delay is over (or
        the pool closes): asleep while more than `Lateness.spin_ns` is left, since a sleep ends that late. Should
        the wait be interrupted, the instance goes back to the pool and the queue to the workers."""
        if not getattr(self._precise, "set", False):
            precise_timers()
            self._precise.set = True
        try:
            self._wait_for_batch()
        except BaseException:
            with self._lock:
                self._idle.append(instance)
                self._executing -= 1
                self._ensure_workers_locked()
                self._notify_locked()
            raise

    def _wait_for_batch(self) -> None:
        with self._lock:
            self._delaying += 1
            self._caller_waiting = True
            try:
                while not self._closed:
                    level = self._queue.urgent()
                    if level is None or level.rows() >= self._target:
                        return
                    end = level.first().enqueued_ns + self._delay_ns
                    wake = end - self._lateness.spin_ns
                    now = time.perf_counter_ns()
                    if now >= end:
                        return
                    if now < wake:
                        if not self._caller_wake.wait((wake - now) / 1e9):  # timed out, not woken by a submit
                            self._lateness.observe(time.perf_counter_ns() - wake)
                        continue
                    self._lock.release()  # submits from other threads may join while it spins
                    try:
                        spin_until(end)
                    finally:
                        self._lock.acquire()
            finally:
                self._caller_waiting = False
                self._delaying -= 1

    def _batch_full_locked(self) -> bool:
        level = self._queue.urgent()
        return level is not None and level.rows() >= self._target

    def _poke(self) -> None:
        """The intake closed: holding workers look at the queue again (every worker: any one may hold)."""
        with self._lock:
            self._notify_locked(everyone=True)

    # --- batch formation -----------------------------------------------------------------------------------
    def _take_batch_locked(self) -> tuple[list[Pending], list[Pending]]:
        """The next batch, and the requests taken out without running (timed out, or their caller gone: their
        place in a batch goes to the next request)."""
        queue = self._queue
        expired: list[Pending] = []
        if queue.next_deadline_ns:  # the clock is read only when some queued request has a deadline
            now = time.perf_counter_ns()
            if queue.next_deadline_ns < now:
                expired = queue.expire(now)
        batch = queue.take()
        while batch and _any_cancelled(batch):
            expired += [item for item in batch if _cancelled(item)]
            batch = [item for item in batch if not _cancelled(item)] or queue.take()
        return batch, expired

    # --- shutdown ------------------------------------------------------------------------------------------
    def close(self, timeout_s: float) -> bool:
        """Refuse new requests, let queued ones finish within ``timeout_s``; True if all finished."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            if self._queue.count:
                self._ensure_workers_locked(closing=True)
            self._notify_locked(everyone=True)
            self._caller_wake.notify_all()
            self._expirer_wake.notify_all()  # the expirer leaves: close refuses what is left at its deadline
            while self._queue.count + self._executing and time.monotonic() < deadline:
                self._settled.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            leftover = self._queue.drain()
            clean = not leftover and not self._executing
            self._wake.notify_all()  # closed and empty: every sleeping worker leaves now (joined below)
        for item in leftover:
            self._finish_error(item, Unavailable(f"model {self._config.name} unloaded before the request ran"))
        for thread in [*self._workers, *([self._expirer] if self._expirer is not None else [])]:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return clean


def _cancelled(item: Pending) -> bool:
    cancellation = item.request.cancellation
    return cancellation is not None and cancellation.cancelled


def _any_cancelled(batch: list[Pending]) -> bool:
    for item in batch:
        cancellation = item.request.cancellation
        if cancellation is not None and cancellation.cancelled:
            return True
    return False


def precise_timers() -> None:
    """Set the calling thread's timer slack to WORKER_TIMER_SLACK_NS (Linux; elsewhere waits stay as they are)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_TIMERSLACK, WORKER_TIMER_SLACK_NS, 0, 0, 0) != 0:
            log.debug("prctl(PR_SET_TIMERSLACK) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.debug("cannot set the timer slack: %s", e)
