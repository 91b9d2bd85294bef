"""The durable outbox: every QoS>=1 message edged publishes is stored before it is sent and leaves only on PUBACK.

One thread owns the SQLite file. Producers append to an in-memory list; the thread writes everything that
accumulated since its last pass in one transaction (group commit), together with the deletions of messages
acknowledged meanwhile, then sends stored messages in order while fewer than ``max_in_flight`` await a PUBACK.
While the broker is unreachable messages accumulate on disk, bounded by count, bytes and age (device elapsed
time from ``edged.clock``, so a wall clock step neither expires nor keeps the backlog); each message dropped
to keep a bound is counted. After a restart everything still stored is sent again, in order, with its
original message id: delivery is at least once and duplicates are recognisable.

Invariants: ``depth`` and ``stored_bytes`` follow what the file really holds (every deletion reports what it
removed), so rows dropped while in flight are never subtracted twice. A failed write (a full disk) loses
nothing: its messages and deletions stay queued and are retried with backoff until space returns, stored
messages keep being sent meanwhile, and ``disk`` says why. Hand-offs are few: a producer wakes the thread only
when it is not already woken, and a PUBACK only when its deletion is due (a group of them, an empty window,
or a window half free with a backlog); other deletions ride along with the next group commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from edged.clock import Clock, DeviceClock
from edged.config import OutboxConfig
from edged.errors import OutboxError
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._store import OutboxStore, Stored, Timed

log = logging.getLogger(__name__)

_PAGE = 1024
_AGE_CHECK_S = 5.0
_EARLY_ACKS_MAX = 1024
_EARLY_ACK_S = 2.0  # paho reuses a mid only after 65,535 others
_GROUP_MAX = 512  # messages per transaction
_ACK_GROUP = 64  # PUBACKs that make their deletion due at once
_ACK_DELAY_S = 0.05  # the longest a PUBACK waits for its deletion to ride along with a group
_RETRY_MIN_S, _RETRY_MAX_S = 0.1, 2.0  # after a failed write (a full disk)


class Outbox:
    def __init__(self, path: Path, config: OutboxConfig, metrics: Metrics, clock: Clock | None = None) -> None:
        self._config = config
        self._metrics = metrics
        self._clock: Clock = clock if clock is not None else DeviceClock()
        self._store = OutboxStore(path, config.fsync, self._clock.elapsed())
        if isinstance(self._clock, DeviceClock):
            self._clock.advance_past(self._store.max_elapsed())  # rows newer than the clock's last checkpoint
        self._cond = threading.Condition()
        self._pending: list[Timed] = []
        self._acked: list[int] = []
        self._acked_since = 0.0  # monotonic time of the oldest PUBACK not yet deleted
        self._inflight: dict[int, int] = {}  # mid -> seq
        # PUBACKs that arrived before publish() returned their mid (mid -> when); paho calls on_publish with its
        # own lock held, so publish() cannot be wrapped in ours without a lock-order inversion.
        self._early: dict[int, float] = {}
        self._ready: deque[Stored] = deque()
        self._backlog = True  # rows on disk not yet loaded into _ready
        self._last_loaded = 0
        self._count, self._bytes = self._store.totals()
        self._connected = False
        self._stopping = False
        self._woken = False  # a notify is on its way to the thread: producers need not send another
        self._passes = 0  # passes of the thread completed: what flush() waits for
        self._flush_wanted = False
        self.wakeups = 0  # notifies sent to the thread: hand-offs, counted per message by the tests
        self._publish: Callable[[Outbound], int | None] | None = None
        self._thread: threading.Thread | None = None
        self._next_age_check = 0.0
        self._age_check_s = min(_AGE_CHECK_S, config.max_age_s / 2)
        self._write_error = ""
        self._group_size = _GROUP_MAX
        self._retry_s = 0.0
        self._retry_at = 0.0

    # --- producers and the connection (any thread) ---------------------------------------------------------
    def put(self, message: Outbound) -> None:
        with self._cond:
            self._pending.append((message, self._clock.wall(), self._clock.elapsed()))
            self._wake()

    def set_connected(self, connected: bool) -> None:
        with self._cond:
            self._connected = connected
            self._wake()

    def on_acked(self, mid: int, ok: bool) -> bool:
        """Record a PUBACK; False when the mid is not one of ours (yet)."""
        with self._cond:
            seq = self._inflight.pop(mid, None)
            if seq is None:
                now = time.monotonic()
                if len(self._early) > _EARLY_ACKS_MAX:
                    self._early = {m: t for m, t in self._early.items() if now - t < _EARLY_ACK_S}
                self._early[mid] = now
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
            self._cond.notify()

    def trace(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback`` with every SQL statement the outbox runs (None: stop)."""
        self._store.trace(callback)

    @property
    def depth(self) -> int:
        with self._cond:
            return self._count + len(self._pending)

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def write_error(self) -> str:
        """Why the last write failed ("" while writes succeed): a full disk, a read-only file system."""
        return self._write_error

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self, publish: Callable[[Outbound], int | None]) -> None:
        self._publish = publish
        self._thread = threading.Thread(target=self._run, name="edged-mqtt-outbox", daemon=True)
        self._thread.start()

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until nothing is pending, stored or in flight (only possible while connected)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._acked or self._count or self._inflight:
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
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._store.close()

    # --- the outbox thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._has_work():
                    self._woken = False  # a notify that found nothing to do must not silence the next ones
                    self._cond.wait(self._wait_s())
                    if self._clock.elapsed() >= self._next_age_check:
                        break
                self._woken = self._flush_wanted = False
                pending, self._pending = self._pending, []
                acked, self._acked = self._acked, []
                stopping = self._stopping
            if not self._store_group(pending, acked):
                if stopping:
                    self._metrics.drop("shutdown", len(pending))
                    return
                self._guarded(self._send)  # what is stored still goes out while the disk is full
                self._pass_done()
                continue
            if stopping:
                return
            self._guarded(self._enforce_bounds)
            self._guarded(self._expire)
            self._guarded(self._send)
            self._pass_done()

    def _pass_done(self) -> None:
        with self._cond:
            self._passes += 1
            self._cond.notify_all()

    def _has_work(self) -> bool:
        """With the lock held."""
        if self._stopping or self._flush_wanted:
            return True
        writable = time.monotonic() >= self._retry_at
        return (writable and (bool(self._pending) or self._acks_due())) or self._can_send()

    def _wait_s(self) -> float:
        """With the lock held: until the next age check, deletion due or write retry."""
        now = time.monotonic()
        wait = self._age_check_s
        if self._retry_at > now and (self._pending or self._acked):
            return min(wait, self._retry_at - now)
        if self._acked:
            wait = min(wait, max(0.001, self._acked_since + _ACK_DELAY_S - now))
        return wait

    def _acks_due(self) -> bool:
        if not self._acked:
            return False
        return (len(self._acked) >= _ACK_GROUP or not self._inflight
                or time.monotonic() - self._acked_since >= _ACK_DELAY_S
                or ((bool(self._ready) or self._backlog) and len(self._inflight) <= self._config.max_in_flight // 2))

    def _can_send(self) -> bool:
        return self._connected and (bool(self._ready) or self._backlog) and \
            len(self._inflight) < self._config.max_in_flight

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except OutboxError as e:
            self._write_failed(e)

    def _store_group(self, pending: list[Timed], acked: list[int]) -> bool:
        """Write a group; on failure put it back in front of what arrived meanwhile, to retry later."""
        try:
            self._commit(pending, acked)
        except OutboxError as e:
            with self._cond:
                self._pending[:0] = pending
                if acked:
                    self._acked[:0] = acked
                    self._acked_since = 0.0  # due as soon as writes are retried
            self._write_failed(e)
            return False
        if self._write_error:
            log.warning("mqtt outbox: writes succeed again after %r", self._write_error)
            with self._cond:
                self._write_error, self._retry_s, self._retry_at = "", 0.0, 0.0
        return True

    def _write_failed(self, error: OutboxError) -> None:
        if not self._write_error:
            log.error("mqtt outbox: %s; keeping messages and deletions in memory, retrying", error)
        self._metrics.error("outbox_write")
        self._store.reclaim()
        with self._cond:
            self._write_error = str(error)
            self._retry_s = min(_RETRY_MAX_S, max(_RETRY_MIN_S, self._retry_s * 2))
            self._retry_at = time.monotonic() + self._retry_s

    def _commit(self, pending: list[Timed], acked: list[int]) -> None:
        """Write in groups of at most ``_GROUP_MAX`` (one with fsync "always"). After a failed write the
        deletions go first on their own (they free space and need none) and groups shrink by half per failure:
        a backlog held in memory while the disk was full goes back as space returns. On failure ``pending`` and
        ``acked`` keep only what was not written."""
        if self._write_error and acked and pending:
            self._commit_group([], acked)
            acked.clear()
        size = 1 if self._store.per_message else self._group_size
        done = 0
        try:
            while True:
                self._commit_group(pending[done:done + size], acked)
                acked.clear()
                done += size
                if done >= len(pending):
                    break
        except OutboxError:
            self._group_size = max(1, size // 2)
            raise
        finally:
            del pending[:done]
        self._group_size = min(_GROUP_MAX, self._group_size * 2)

    def _commit_group(self, pending: list[Timed], acked: list[int]) -> None:
        if not pending and not acked:
            return
        seqs, rows, freed = self._store.write(pending, acked)
        for message, _, _ in pending:
            if message.on_stored is not None:
                message.on_stored()
        with self._cond:
            self._count += len(pending) - rows
            self._bytes += sum(len(m.payload) for m, _, _ in pending) - freed
            for seq, (message, _, elapsed) in zip(seqs, pending, strict=True):
                if self._backlog or len(self._ready) >= _PAGE:
                    self._backlog = True
                else:
                    self._ready.append((seq, message, elapsed))
                    self._last_loaded = seq

    def _enforce_bounds(self) -> None:
        over_count = self._count - self._config.max_messages
        over_bytes = self._bytes - self._config.max_bytes
        if over_count <= 0 and over_bytes <= 0:
            return
        rows, freed, last = self._store.drop_oldest(max(0, over_count), max(0, over_bytes))
        self._forget_through(last, rows, freed, "outbox_full")

    def _expire(self) -> None:
        now = self._clock.elapsed()
        if now < self._next_age_check:
            return
        self._next_age_check = now + self._age_check_s
        rows, freed, last = self._store.drop_older_than(now - self._config.max_age_s)
        self._forget_through(last, rows, freed, "outbox_expired")

    def _forget_through(self, last: int, rows: int, freed: int, reason: str) -> None:
        if not rows:
            return
        log.warning("mqtt outbox: dropped %d messages (%d bytes), reason %s", rows, freed, reason)
        self._metrics.drop(reason, rows)
        with self._cond:
            self._count -= rows
            self._bytes -= freed
            while self._ready and self._ready[0][0] <= last:
                self._ready.popleft()
            self._last_loaded = max(self._last_loaded, last)
            self._cond.notify_all()  # wait_drained may be done now

    def _send(self) -> None:
        """Publish what the window allows, a batch per lock round trip; stops at a message paho does not take."""
        if self._publish is None:
            raise OutboxError("outbox used before start()")
        while True:
            with self._cond:
                batch = self._sendable()
            if not batch:
                return
            mids: list[int] = []
            for _, message, _ in batch:
                mid = self._publish(message)
                if mid is None:
                    break
                mids.append(mid)
            with self._cond:
                for (seq, _, _), mid in zip(batch, mids, strict=False):  # mids stop at a refusal
                    self._track(seq, mid)
                if len(mids) < len(batch):
                    self._ready.extendleft(reversed(batch[len(mids):]))
                    return

    def _sendable(self) -> list[Stored]:
        """With the lock held: the next stored messages that fit in the window."""
        if not self._can_send():
            return []
        if not self._ready:
            self._refill()
        count = min(self._config.max_in_flight - len(self._inflight), len(self._ready))
        return [self._ready.popleft() for _ in range(count)]

    def _refill(self) -> None:
        rows = self._store.load(self._last_loaded, _PAGE)
        self._ready.extend(rows)
        if rows:
            self._last_loaded = rows[-1][0]
        self._backlog = len(rows) == _PAGE

    def _track(self, seq: int, mid: int) -> None:
        """With the lock held: a sent message awaits its PUBACK, unless that came before its mid was known."""
        early = self._early.pop(mid, None)
        if early is not None and time.monotonic() - early < _EARLY_ACK_S:
            self._ack(seq)
            self._metrics.add("published")
        else:
            self._inflight[mid] = seq
