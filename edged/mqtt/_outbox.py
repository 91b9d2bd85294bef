"""The durable outbox: every QoS>=1 message edged publishes is stored before it is sent and leaves only on PUBACK.

One thread owns the SQLite file. Producers append to an in-memory list; the thread writes everything that
accumulated since its last pass (group commit, at most 512 messages per transaction), together with the
deletions of messages acknowledged meanwhile, then sends stored messages in order while fewer than
``max_in_flight`` await a PUBACK. While the broker is unreachable messages accumulate on disk, bounded by
count, bytes and age (device elapsed time from ``edged.clock``: a wall clock step neither expires nor keeps
the backlog); each message dropped to keep a bound is counted. After a restart everything still stored is sent
again, in order, with its original message id: delivery is at least once and duplicates are recognisable.

The bounds never cost a result while the broker is connected: then a full outbox makes ``put`` wait for room
(PUBACKs free it), which stops the pipeline worker taking inputs and so their acknowledgements (the intake
slows: ``block`` pauses reading, ``drop_oldest`` drops queued inputs, counted). Only a put that cannot wait
(the network thread's own, which must go on reading the PUBACKs that make room; telemetry) or one that waited
``wait_s`` in vain goes over a bound. A bound is kept by dropping the oldest messages not yet sent (counted
``outbox_full``, or ``outbox_expired`` for age): the send window keeps what is in flight within the bounds, so
a message handed to the broker is never dropped, and each message is counted exactly once, published or
dropped.

Invariants: ``depth`` and ``stored_bytes`` follow what the file holds (every deletion reports what it removed),
and ``depth`` counts a group being written. A failed write (a full disk) loses nothing: its messages and
deletions stay queued, retried with backoff (``_retry``), stored messages keep being sent, ``write_error`` says
why and ``mqtt_outbox`` is degraded until a write succeeds. Past ``PENDING_MAX`` waiting messages ``put``
waits, then refuses (counted ``outbox_busy``; the input stays unacknowledged). The thread is supervised: after
an unexpected exception (a raw SQLite error, a publish or stored callback that raises) the work it had taken
is put back in front, so nothing is lost or reordered, and the loop restarts with backoff. Hand-offs are few:
a producer wakes the thread only when it is not already woken, a PUBACK only when its deletion is due (a group
of them, an empty window, or a window half free with a backlog); other deletions ride along with the next group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edged.clock import Clock, DeviceClock
from edged.config import OutboxConfig
from edged.errors import OutboxError, PayloadError
from edged.mqtt._message import Outbound, run_on_stored
from edged.mqtt._metrics import Metrics
from edged.mqtt._retry import WriteRetry
from edged.mqtt._store import GROUP_BYTES, OutboxStore, Stored, Timed
from edged.mqtt._topics import check_topic_name
from edged.mqtt._window import SendWindow
from edged.supervision import HealthBoard, SupervisedThread

log = logging.getLogger(__name__)

_AGE_CHECK_S = 5.0
_ACK_GROUP = 64  # PUBACKs that make their deletion due at once
_ACK_DELAY_S = 0.05  # the longest a PUBACK waits for its deletion to ride along with a group
# Messages waiting for the outbox thread's next group commit. Past this a producer waits (up to
# PENDING_WAIT_S): a pipeline then stops taking and acknowledging inputs, which is the backpressure.
PENDING_MAX = 4096
PENDING_WAIT_S = 5.0
_ROOM_POLL_S = 0.05  # how often a producer waiting for room asks whether waiting can still help
_DELETE_CHUNK = 64  # acknowledged rows deleted per transaction while the disk is (or was just) full
_FAILING_LOG_S = 60.0  # while writes keep failing, one log line a minute says what is held


class Outbox:
    def __init__(self, path: Path, config: OutboxConfig, metrics: Metrics, clock: Clock | None = None, *,
                 health: HealthBoard | None = None, pending_max: int = PENDING_MAX,
                 pending_wait_s: float = PENDING_WAIT_S) -> None:
        """``clock``: the state directory's one DeviceClock (the daemon's, through the front end)."""
        self._config = config
        self._metrics = metrics
        self._clock: Clock = clock if clock is not None else DeviceClock()
        self._store = OutboxStore(path, config.fsync, self._clock.elapsed())
        if isinstance(self._clock, DeviceClock):
            self._clock.advance_past(self._store.max_elapsed())  # rows newer than the clock's last checkpoint
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # producers, flush() and wait_drained() wait on this one
        self._work = threading.Condition(lock)  # only the thread waits here: a wake-up always reaches it
        self._pending: list[Timed] = []
        self._acked: list[int] = []
        self._acked_since = 0.0  # monotonic time of the oldest PUBACK not yet deleted
        # what is in flight must fit the bounds by itself: bounds are kept by dropping unsent messages only
        self._window = SendWindow(min(config.max_in_flight, config.max_messages), config.max_bytes)
        self._drop_unpublishable()
        self._count, self._bytes = self._store.totals()
        self._committing = 0  # messages taken for the current group commit and not yet counted as stored
        self._unstored_bytes = 0  # payload bytes of the pending and committing messages
        self._connected = self._stopping = False
        self._woken = False  # a notify is on its way to the thread: producers need not send another
        self._passes = 0  # passes of the thread completed: what flush() waits for
        self._flush_wanted = False
        self.wakeups = 0  # notifies sent to the thread: hand-offs, counted per message by the tests
        self._publish: Callable[[Outbound], int | None] | None = None
        self._thread: SupervisedThread | None = None
        self._health = (health or HealthBoard()).component("mqtt_outbox")
        self._pending_max, self._pending_wait_s = pending_max, pending_wait_s
        self._next_age_check, self._age_check_s = 0.0, min(_AGE_CHECK_S, config.max_age_s / 2)
        self._retry = WriteRetry()
        self._failing_logged = 0.0

    def _drop_unpublishable(self) -> None:
        """Rows stored before their topic was checked (an older release) that a broker answers by closing the
        connection (a control character in a reply_to): sent on every reconnect, they would cut edged off."""
        rows, _ = self._store.drop_topics(_refused_topic)
        if rows:
            self._metrics.drop("bad_topic", rows)
            log.warning("mqtt: dropped %d stored message(s) whose topic brokers refuse (a control character or "
                        "noncharacter), written by an older release", rows)

    def id_state(self, client: str) -> tuple[str, dict[int, tuple[int, bytes]]]:
        """(salt, mid -> last answered) for `MessageIds`; read before start(), while no thread owns the file."""
        return self._store.id_salt, self._store.answered(client)

    # --- producers and the connection (any thread) ---------------------------------------------------------
    def put(self, message: Outbound, wait_s: float | None = None, *,
            room_wait: Callable[[], bool] | None = None) -> bool:
        """Queue a message for the next group commit; False (counted, ``on_stored`` never called: the broker
        redelivers its input) when the thread made no room within ``wait_s`` (default: the pending wait).
        With ``room_wait`` a connected full outbox also makes it wait (up to ``wait_s``, and while ``room_wait()``
        says waiting can help) for PUBACKs to make room; then the message goes in anyway and the bound drops the
        oldest unsent one, counted."""
        deadline = time.monotonic() + (self._pending_wait_s if wait_s is None else wait_s)
        with self._cond:
            while len(self._pending) >= self._pending_max and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._metrics.drop("outbox_busy")
                    return False
                self._cond.wait(left)
            while room_wait is not None and self._full(len(message.payload)) and room_wait():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, _ROOM_POLL_S))
            self._pending.append((message, self._clock.wall(), self._clock.elapsed()))
            self._unstored_bytes += len(message.payload)
            self._wake()
            return True

    def _full(self, size: int) -> bool:
        """With the lock held: a connected outbox has no room for ``size`` more bytes (PUBACKs will make it).
        PUBACKed messages not yet deleted are room already; an empty outbox always takes one message."""
        if not self._connected or self._stopping:
            return False
        count = self._count - len(self._acked) + len(self._pending) + self._committing
        size_after = self._bytes + self._unstored_bytes + size
        return count > 0 and (count >= self._config.max_messages or size_after > self._config.max_bytes)

    def set_connected(self, connected: bool) -> None:
        with self._cond:
            self._connected = connected
            self._wake()
            self._cond.notify_all()  # producers waiting for room: a disconnected outbox takes them at once

    def on_acked(self, mid: int, ok: bool) -> bool:
        """Record a PUBACK; False when the mid is not one of ours (yet)."""
        with self._cond:
            seq = self._window.acked(mid)
            if seq is None:
                return False
            self._ack(seq)
        self._metrics.add("published")
        if not ok:
            self._metrics.error("broker_rejected")
        return True

    def _ack(self, seq: int) -> None:
        """With the lock held."""
        if not self._acked:
            self._acked_since = time.monotonic()
        self._acked.append(seq)
        if self._acks_due():
            self._wake()

    def _wake(self) -> None:
        """With the lock held."""
        if not self._woken:
            self._woken = True
            self.wakeups += 1
            self._work.notify()

    def trace(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback`` with every SQL statement the outbox runs (None: stop)."""
        self._store.trace(callback)

    @property
    def depth(self) -> int:
        with self._cond:
            return self._count + len(self._pending) + self._committing

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    @property
    def in_flight(self) -> int:
        return len(self._window.inflight)

    @property
    def write_error(self) -> str:
        """Why the last write failed ("" while writes succeed): a full disk, a read-only file system."""
        return self._retry.error

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self, publish: Callable[[Outbound], int | None]) -> None:
        self._publish = publish
        self._thread = SupervisedThread("edged-mqtt-outbox", self._run, self._health)
        self._thread.start()

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until nothing is pending, stored or in flight (only possible while connected)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._acked or self._committing or self._count or self._window.inflight:
                left = deadline - time.monotonic()
                if left <= 0 or not self._connected:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def flush(self, timeout_s: float) -> bool:
        """Wait until the thread has written (or failed to write) what was put and acknowledged before the call,
        deletions due or not, and sent what it then could; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._passes + 1
            self._flush_wanted = True
            self._wake()
            while self._passes < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
            return True

    def stop(self, timeout_s: float) -> None:
        with self._cond:
            self._stopping = True
            self._work.notify()
            self._cond.notify_all()  # producers blocked in put()
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout_s)
        self._store.close()

    # --- the outbox thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._has_work():
                    self._woken = False  # a notify that found nothing to do must not silence the next ones
                    self._work.wait(self._wait_s())
                    if self._clock.elapsed() >= self._next_age_check:
                        break
                self._woken = self._flush_wanted = False
                pending, self._pending = self._pending, []
                acked, self._acked = self._acked, []
                self._committing = len(pending)
                stopping = self._stopping
                self._cond.notify_all()  # producers blocked in put()
            try:
                go_on = self._pass(pending, acked, stopping)
            finally:
                self._pass_done()
            if not go_on:
                return
            if not self._retry.error:  # healthy again, also after a restart by the supervisor
                self._health.ok()

    def _pass(self, pending: list[Timed], acked: list[int], stopping: bool) -> bool:
        """One pass: write, keep the bounds, acknowledge the inputs, expire, send; False when the thread ends."""
        stored: list[Outbound] = []
        written = self._store_group(pending, acked, stored)
        if written and not stopping:
            self._guarded(self._enforce_bounds)  # before the callbacks, so depth is right once inputs are acked
        run_on_stored(stored)
        if stopping:
            if not written:
                self._metrics.drop("shutdown", len(pending))
            return False
        if written:
            self._guarded(self._expire)
        self._guarded(self._send)  # what is stored still goes out while the disk is full
        return True

    def _pass_done(self) -> None:
        with self._cond:
            self._committing = 0
            self._passes += 1
            self._cond.notify_all()

    def _has_work(self) -> bool:
        """With the lock held."""
        if self._stopping or self._flush_wanted:
            return True
        writable = self._retry.writable(time.monotonic())
        return (writable and (bool(self._pending) or self._acks_due())) or self._can_send()

    def _wait_s(self) -> float:
        """With the lock held: until the next age check, deletion due or write retry."""
        now = time.monotonic()
        wait = self._age_check_s
        if not self._retry.writable(now) and (self._pending or self._acked):
            return min(wait, self._retry.at - now)
        if self._acked:
            wait = min(wait, max(0.001, self._acked_since + _ACK_DELAY_S - now))
        return wait

    def _acks_due(self) -> bool:
        if not self._acked:
            return False
        window = self._window
        return (len(self._acked) >= _ACK_GROUP or not window.inflight
                or time.monotonic() - self._acked_since >= _ACK_DELAY_S
                or (window.more and len(window.inflight) <= window.max_in_flight // 2))

    def _can_send(self) -> bool:
        return self._connected and self._window.sendable()

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except OutboxError as e:  # a deletion to keep a bound failed: as a failed write
            self._write_failed(e)

    def _store_group(self, pending: list[Timed], acked: list[int], stored: list[Outbound]) -> bool:
        """Write a group, adding what was written to ``stored``. On failure what was not written goes back in
        front of what arrived meanwhile: retried later (a handled OutboxError) or by the restarted thread."""
        try:
            self._commit(pending, acked, stored)
        except Exception as e:
            with self._cond:
                self._pending[:0] = pending
                self._committing = 0
                if acked:
                    self._acked[:0] = acked
                    self._acked_since = 0.0  # due as soon as writes are retried
            if not isinstance(e, OutboxError):
                raise
            self._write_failed(e)
            return False
        if self._retry.error:
            with self._cond:
                log.warning("mqtt outbox: writes succeed again after %r", self._retry.succeeded())
        self._store.keep_reserve()
        return True

    def _write_failed(self, error: OutboxError) -> None:
        self._metrics.error("outbox_write")
        self._store.reclaim()  # releases the reserve and empties the WAL: room for the deletions to go first
        now = time.monotonic()
        with self._cond:
            first = self._retry.failed(str(error), now)
            held, acked = len(self._pending), len(self._acked)
        if first:
            self._failing_logged = now
            log.error("mqtt outbox: %s; keeping messages and deletions in memory, retrying", error)
        elif now - self._failing_logged >= _FAILING_LOG_S:
            self._failing_logged = now
            log.error("mqtt outbox: writes still fail (%s): %d result(s) held in memory, %d stored, %d "
                      "acknowledged deletion(s) waiting; free space in %s", error, held, self._count, acked,
                      self._store.path.parent)
        self._health.degraded(str(error))

    def _commit(self, pending: list[Timed], acked: list[int], stored: list[Outbound]) -> None:
        """Write in groups (of one with fsync "always"). After a failed write the deletions go first on their own
        (they free space and need none); groups halve per failure and double per group written (``WriteRetry``),
        so a backlog held while the disk was full is not written one message per fsync. On failure ``pending``
        and ``acked`` keep only what was not written."""
        if self._retry.error and acked:
            self._delete_first(acked, stored)
        done, size = 0, 1
        try:
            while True:
                size = 1 if self._store.per_message else _fitting(pending, done, self._retry.group_size)
                self._commit_group(pending[done:done + size], acked, stored)
                acked.clear()
                done += size
                self._retry.grow()
                if done >= len(pending):
                    break
        except OutboxError:
            self._retry.shrink(size)
            raise
        finally:
            del pending[:done]

    def _delete_first(self, acked: list[int], stored: list[Outbound]) -> None:
        """After a failed write, the deletions alone in small transactions, each checkpointed at once: on a full
        disk the WAL then needs room for a few pages only, which the checkpoint gives back before the next.
        ``acked`` keeps what was not deleted."""
        acked.sort()
        while acked:
            self._commit_group([], acked[:_DELETE_CHUNK], stored)
            del acked[:_DELETE_CHUNK]
            self._store.checkpoint()

    def _commit_group(self, pending: list[Timed], acked: list[int], stored: list[Outbound]) -> None:
        if not pending and not acked:
            return
        seqs, rows, freed = self._store.write(pending, acked)
        with self._cond:
            self._committing -= len(pending)
            written = sum(len(m.payload) for m, _, _ in pending)
            self._count += len(pending) - rows
            self._bytes += written - freed
            self._unstored_bytes -= written
            for seq, (message, _, elapsed) in zip(seqs, pending, strict=True):
                self._window.stored(seq, message, elapsed)
        stored.extend(message for message, _, _ in pending)

    def _enforce_bounds(self) -> None:
        """Drop the oldest unsent messages over a bound; what is in flight fits the bounds (the window)."""
        over_count = self._count - self._config.max_messages
        over_bytes = self._bytes - self._config.max_bytes
        if over_count > 0 or over_bytes > 0:
            with self._cond:
                first = self._window.first_unsent()
            rows, freed, last = self._store.drop_oldest(max(0, over_count), max(0, over_bytes), first)
            self._forget_through(last, rows, freed, "outbox_full")

    def _expire(self) -> None:
        now = self._clock.elapsed()
        if now < self._next_age_check:
            return
        self._next_age_check = now + self._age_check_s
        with self._cond:
            first = self._window.first_unsent()  # one in flight is delivered on its PUBACK: not expired
        rows, freed, last = self._store.drop_older_than(now - self._config.max_age_s, first)
        self._forget_through(last, rows, freed, "outbox_expired")

    def _forget_through(self, last: int, rows: int, freed: int, reason: str) -> None:
        if not rows:
            return
        log.warning("mqtt outbox: dropped %d messages (%d bytes), reason %s", rows, freed, reason)
        self._metrics.drop(reason, rows)
        with self._cond:
            self._count, self._bytes = self._count - rows, self._bytes - freed
            self._window.forget_through(last)
            self._cond.notify_all()  # wait_drained may be done now

    def _send(self) -> None:
        """Publish what the window allows, a batch per lock round trip; stops at a message paho does not take."""
        if self._publish is None:
            raise OutboxError("outbox used before start()")
        while True:
            with self._cond:
                batch = self._window.take(self._store) if self._can_send() else []
            if not batch:
                return
            mids: list[int] = []
            try:
                for _, message, _ in batch:
                    mid = self._publish(message)
                    if mid is None:
                        break
                    mids.append(mid)
            finally:  # also when publish raised: the restarted thread sends the rest first, in order
                refused = self._settle(batch, mids)
            if refused:
                return

    def _settle(self, batch: list[Stored], mids: list[int]) -> bool:
        """Track what was sent, put the rest of the batch back in front; True when some was not sent."""
        with self._cond:
            for (seq, message, _), mid in zip(batch, mids, strict=False):  # mids stop at a refusal
                if self._window.track(seq, mid, len(message.payload)):  # its PUBACK came before its mid was known
                    self._ack(seq)
                    self._metrics.add("published")
            if len(mids) < len(batch):
                self._window.put_back(batch[len(mids):])
                return True
            return False


def _fitting(pending: list[Timed], start: int, count: int) -> int:
    """How many of ``pending[start:]`` the next group takes: at most ``count`` and ``GROUP_BYTES`` of payload
    (always one), so that what a checkpoint may have to add to the main file stays within the reserve."""
    size = total = 0
    for message, _, _ in pending[start:start + count]:
        total += len(message.payload)
        if size and total > GROUP_BYTES:
            break
        size += 1
    return max(1, size)


def _refused_topic(topic: str) -> bool:
    try:
        check_topic_name(topic)
    except PayloadError:
        return True
    return False
