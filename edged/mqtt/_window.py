"""The outbox's send side: stored messages loaded for sending, in order, and those sent awaiting a PUBACK.

Only a page of stored rows is held in memory (``ready``); the rest stays on disk (``backlog``) and is loaded
when the page runs out, so a long outage costs disk, not memory. No lock of its own and no I/O but the page
loads: every method is called with the outbox's lock held.

What is in flight stays within the outbox's bounds on its own (at most ``max_messages`` messages and
``max_bytes`` payload bytes), so that the bounds can always be kept by dropping messages not yet sent: a
message handed to the broker is never dropped, since it is delivered (and counted published) on its PUBACK.
"""

from __future__ import annotations

import time
from collections import deque

from edged.mqtt._message import Outbound
from edged.mqtt._store import OutboxStore, Stored

PAGE = 1024
_EARLY_ACKS_MAX = 1024
_EARLY_ACK_S = 2.0  # paho reuses a mid only after 65,535 others


class SendWindow:
    def __init__(self, max_in_flight: int, max_bytes: int | None = None) -> None:
        self.max_in_flight = max_in_flight
        self._max_bytes = max_bytes
        self.inflight: dict[int, tuple[int, int]] = {}  # mid -> (seq, payload bytes)
        self.inflight_bytes = 0
        # PUBACKs that arrived before publish() returned their mid (mid -> when); paho calls on_publish with its
        # own lock held, so publish() cannot be wrapped in ours without a lock-order inversion.
        self._early: dict[int, float] = {}
        self.ready: deque[Stored] = deque()
        self.backlog = True  # rows on disk not yet loaded into ready
        self._last_loaded = 0

    @property
    def more(self) -> bool:
        """Stored messages not yet sent."""
        return bool(self.ready) or self.backlog

    def room(self) -> int:
        return self.max_in_flight - len(self.inflight)

    def sendable(self) -> bool:
        """Something stored may be sent now: the window has room for the next message (or it is still on disk)."""
        if not self.more or self.room() <= 0:
            return False
        return not self.ready or not self.inflight or len(self.ready[0][1].payload) <= self._bytes_free()

    def acked(self, mid: int) -> int | None:
        """The seq a PUBACK acknowledges; None when the mid is not known yet (remembered for ``track``)."""
        entry = self.inflight.pop(mid, None)
        if entry is None:
            now = time.monotonic()
            if len(self._early) > _EARLY_ACKS_MAX:
                self._early = {m: t for m, t in self._early.items() if now - t < _EARLY_ACK_S}
            self._early[mid] = now
            return None
        self.inflight_bytes -= entry[1]
        return entry[0]

    def track(self, seq: int, mid: int, size: int) -> bool:
        """A sent message (``size`` payload bytes) awaits its PUBACK; True when that came before its mid was
        known (acknowledged)."""
        early = self._early.pop(mid, None)
        if early is not None and time.monotonic() - early < _EARLY_ACK_S:
            return True
        self.inflight[mid] = (seq, size)
        self.inflight_bytes += size
        return False

    def first_unsent(self) -> int:
        """The lowest seq that may still be unsent: rows from here on were never handed to the broker."""
        return self.ready[0][0] if self.ready else self._last_loaded + 1

    def stored(self, seq: int, message: Outbound, elapsed: float) -> None:
        """A message just written: kept in memory while the page has room and nothing older is on disk only."""
        if self.backlog or len(self.ready) >= PAGE:
            self.backlog = True
        else:
            self.ready.append((seq, message, elapsed))
            self._last_loaded = seq

    def take(self, store: OutboxStore) -> list[Stored]:
        """The next stored messages that fit in the window, loading a page from disk when needed."""
        if not self.ready:
            rows = store.load(self._last_loaded, PAGE)
            self.ready.extend(rows)
            if rows:
                self._last_loaded = rows[-1][0]
            self.backlog = len(rows) == PAGE
        batch: list[Stored] = []
        room, free = self.room(), self._bytes_free()
        while self.ready and len(batch) < room:
            size = len(self.ready[0][1].payload)
            if size > free and (batch or self.inflight):  # the first one alone may go: nothing else could
                break
            free -= size
            batch.append(self.ready.popleft())
        return batch

    def _bytes_free(self) -> int:
        return (1 << 62) if self._max_bytes is None else self._max_bytes - self.inflight_bytes

    def put_back(self, rows: list[Stored]) -> None:
        """Messages taken but not sent go back in front, in order."""
        self.ready.extendleft(reversed(rows))

    def forget_through(self, last: int) -> None:
        """Unsent rows up to seq ``last`` were deleted from the file (bounds, age); none of them is in flight."""
        while self.ready and self.ready[0][0] <= last:
            self.ready.popleft()
        self._last_loaded = max(self._last_loaded, last)
