"""The outbox's send side: stored messages loaded for sending, in order, and those sent awaiting a PUBACK.

Only a page of stored rows is held in memory (``ready``); the rest stays on disk (``backlog``) and is loaded
when the page runs out, so a long outage costs disk, not memory. No lock of its own and no I/O but the page
loads: every method is called with the outbox's lock held.
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
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.inflight: dict[int, int] = {}  # mid -> seq
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

    def acked(self, mid: int) -> int | None:
        """The seq a PUBACK acknowledges; None when the mid is not known yet (remembered for ``track``)."""
        seq = self.inflight.pop(mid, None)
        if seq is None:
            now = time.monotonic()
            if len(self._early) > _EARLY_ACKS_MAX:
                self._early = {m: t for m, t in self._early.items() if now - t < _EARLY_ACK_S}
            self._early[mid] = now
        return seq

    def track(self, seq: int, mid: int) -> bool:
        """A sent message awaits its PUBACK; True when that came before its mid was known (acknowledged)."""
        early = self._early.pop(mid, None)
        if early is not None and time.monotonic() - early < _EARLY_ACK_S:
            return True
        self.inflight[mid] = seq
        return False

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
        count = min(self.room(), len(self.ready))
        return [self.ready.popleft() for _ in range(count)]

    def put_back(self, rows: list[Stored]) -> None:
        """Messages taken but not sent go back in front, in order."""
        self.ready.extendleft(reversed(rows))

    def forget_through(self, last: int) -> None:
        """Rows up to seq ``last`` were deleted from the file (bounds, age)."""
        while self.ready and self.ready[0][0] <= last:
            self.ready.popleft()
        self._last_loaded = max(self._last_loaded, last)
