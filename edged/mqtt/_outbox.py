"""The durable outbox: every QoS>=1 message edged publishes is stored before it is sent and leaves only on PUBACK.

One thread owns the SQLite file. Producers append to an in-memory list; the thread writes everything that
accumulated since its last pass in one transaction (group commit), together with the deletions of messages
acknowledged meanwhile, then sends stored messages in order while fewer than ``max_in_flight`` await a PUBACK.
While the broker is unreachable messages accumulate on disk, bounded by count, bytes and age; each message
dropped to keep a bound is counted. After a restart everything still stored is sent again, in order, with its
original message id: delivery is at least once and duplicates are recognisable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from edged.config import OutboxConfig
from edged.errors import OutboxError
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._store import OutboxStore, Stored
from edged.supervision import HealthBoard, SupervisedThread

log = logging.getLogger(__name__)

_PAGE = 1024
_AGE_CHECK_S = 5.0
_EARLY_ACKS_MAX = 1024
_EARLY_ACK_S = 2.0  # paho reuses a mid only after 65,535 others
# Messages waiting for the outbox thread's next group commit. Past this a producer waits (up to
# PENDING_WAIT_S): a pipeline then stops taking and acknowledging inputs, which is the backpressure.
PENDING_MAX = 4096
PENDING_WAIT_S = 5.0


class Outbox:
    def __init__(self, path: Path, config: OutboxConfig, metrics: Metrics, *, health: HealthBoard | None = None,
                 pending_max: int = PENDING_MAX, pending_wait_s: float = PENDING_WAIT_S) -> None:
        self._config = config
        self._metrics = metrics
        self._store = OutboxStore(path, config.fsync)
        self._cond = threading.Condition()
        self._pending: list[tuple[Outbound, float]] = []
        self._acked: list[int] = []
        self._inflight: dict[int, int] = {}  # mid -> seq
        # PUBACKs that arrived before publish() returned their mid (mid -> when); paho calls on_publish with its
        # own lock held, so publish() cannot be wrapped in ours without a lock-order inversion.
        self._early: dict[int, float] = {}
        self._sent_sizes: dict[int, int] = {}
        self._ready: deque[Stored] = deque()
        self._backlog = True  # rows on disk not yet loaded into _ready
        self._last_loaded = 0
        self._count, self._bytes = self._store.totals()
        self._connected = False
        self._stopping = False
        self._publish: Callable[[Outbound], int | None] | None = None
        self._thread: SupervisedThread | None = None
        self._health = (health or HealthBoard()).component("mqtt_outbox")
        self._pending_max, self._pending_wait_s = pending_max, pending_wait_s
        self._committing = 0
        self._next_age_check = 0.0
        self._age_check_s = min(_AGE_CHECK_S, config.max_age_s / 2)

    # --- producers and the connection (any thread) ---------------------------------------------------------
    def put(self, message: Outbound, wait_s: float | None = None) -> bool:
        """Queue a message for the next group commit; False (counted, ``on_stored`` never called, so its input
        stays unacknowledged and the broker redelivers it) when the outbox thread did not make room within
        ``wait_s`` (default: the outbox's pending wait)."""
        deadline = time.monotonic() + (self._pending_wait_s if wait_s is None else wait_s)
        with self._cond:
            while len(self._pending) >= self._pending_max and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._metrics.drop("outbox_busy")
                    return False
                self._cond.wait(left)
            self._pending.append((message, time.time()))
            self._cond.notify_all()
            return True

    def set_connected(self, connected: bool) -> None:
        with self._cond:
            self._connected = connected
            self._cond.notify()

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
            self._acked.append(seq)
            self._cond.notify()
        self._metrics.add("published")
        if not ok:
            self._metrics.error("broker_rejected")
        return True

    @property
    def depth(self) -> int:
        with self._cond:
            return self._count + len(self._pending) + self._committing

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self, publish: Callable[[Outbound], int | None]) -> None:
        self._publish = publish
        self._thread = SupervisedThread("edged-mqtt-outbox", self._run, self._health)
        self._thread.start()

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until nothing is pending, stored or in flight (only possible while connected)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._acked or self._committing or self._count or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0 or not self._connected:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def stop(self, timeout_s: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout_s)
        self._store.close()

    # --- the outbox thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        write_failed = False
        while True:
            with self._cond:
                while not (self._stopping or self._pending or self._acked or self._can_send()):
                    self._cond.wait(self._age_check_s)
                    if time.monotonic() >= self._next_age_check:
                        break
                pending, self._pending = self._pending, []
                acked, self._acked = self._acked, []
                self._committing = len(pending)  # taken but not yet counted as stored
                stopping = self._stopping
                self._cond.notify_all()  # producers blocked in put()
            try:
                self._commit(pending, acked)
                write_failed = write_failed and not (pending or acked)  # healthy again once a write succeeds
                if stopping:
                    return
                self._expire()
                self._send()
            except OutboxError as e:
                log.exception("mqtt outbox: a write failed; %d messages not stored", len(pending))
                self._metrics.error("outbox_write", max(1, len(pending)))
                self._health.degraded(str(e))
                write_failed = True
                time.sleep(0.1)
            finally:
                with self._cond:
                    self._committing = 0
            if not write_failed:
                self._health.ok()

    def _can_send(self) -> bool:
        return self._connected and (bool(self._ready) or self._backlog) and \
            len(self._inflight) < self._config.max_in_flight

    def _commit(self, pending: list[tuple[Outbound, float]], acked: list[int]) -> None:
        if not pending and not acked:
            return
        try:
            seqs = self._store.write(pending, acked)
        except OutboxError:
            raise
        except Exception:  # not stored: the restarted thread writes the batch again, in order
            with self._cond:
                self._pending[:0] = pending
                self._acked[:0] = acked
                self._committing = 0
            raise
        added = sum(len(m.payload) for m, _ in pending)
        with self._cond:
            self._committing = 0
            self._count += len(pending) - len(acked)
            self._bytes += added - self._acked_bytes(acked)
            for seq, (message, created) in zip(seqs, pending, strict=True):
                if self._backlog or len(self._ready) >= _PAGE:
                    self._backlog = True
                else:
                    self._ready.append((seq, message, created))
                    self._last_loaded = seq
        self._enforce_bounds()
        self._stored(pending)

    @staticmethod
    def _stored(pending: list[tuple[Outbound, float]]) -> None:
        """Every stored message's callback runs (each acknowledges an input) even if one raises; the first
        exception is raised afterwards, for the supervisor to count."""
        failure: Exception | None = None
        for message, _ in pending:
            try:
                if message.on_stored is not None:
                    message.on_stored()
            except Exception as e:
                failure = failure or e
        if failure is not None:
            raise failure

    def _acked_bytes(self, acked: list[int]) -> int:
        sizes = self._sent_sizes
        return sum(sizes.pop(seq, 0) for seq in acked)

    def _enforce_bounds(self) -> None:
        over_count = self._count - self._config.max_messages
        over_bytes = self._bytes - self._config.max_bytes
        if over_count <= 0 and over_bytes <= 0:
            return
        rows, freed, last = self._store.drop_oldest(max(0, over_count), max(0, over_bytes))
        self._forget_through(last, rows, freed, "outbox_full")

    def _expire(self) -> None:
        now = time.monotonic()
        if now < self._next_age_check:
            return
        self._next_age_check = now + self._age_check_s
        rows, freed, last = self._store.drop_older_than(time.time() - self._config.max_age_s)
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
            for seq in [s for s in self._sent_sizes if s <= last]:
                del self._sent_sizes[seq]

    def _send(self) -> None:
        while True:
            with self._cond:
                if not self._can_send():
                    return
                if not self._ready:
                    self._refill()
                    if not self._ready:
                        return
                seq, message, _ = self._ready.popleft()
            if not self._send_one(seq, message):
                return

    def _refill(self) -> None:
        rows = self._store.load(self._last_loaded, _PAGE)
        self._ready.extend(rows)
        if rows:
            self._last_loaded = rows[-1][0]
        self._backlog = len(rows) == _PAGE

    def _send_one(self, seq: int, message: Outbound) -> bool:
        if self._publish is None:
            raise OutboxError("outbox used before start()")
        try:
            mid = self._publish(message)
        except Exception:  # the restarted thread sends it again, first
            with self._cond:
                self._ready.appendleft((seq, message, 0.0))
            raise
        with self._cond:
            if mid is None:
                self._ready.appendleft((seq, message, 0.0))
                return False
            self._sent_sizes[seq] = len(message.payload)
            early = self._early.pop(mid, None)
            if early is not None and time.monotonic() - early < _EARLY_ACK_S:
                self._acked.append(seq)
                self._metrics.add("published")
            else:
                self._inflight[mid] = seq
        return True
