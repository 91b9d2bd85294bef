"""After a failed outbox write (a full disk, a read-only file system): when to try again, and how much at once.

A failed write loses nothing: its messages and deletions stay queued in memory. They are retried with
backoff (0.1 s doubling up to 2 s) so that a full disk is not hammered, and the group written per transaction
halves with each failure (from at most 512 messages) so that a backlog held in memory goes back in pieces that
fit the space as it returns; each group written doubles the next one again. A small state machine with no
I/O and no lock: the outbox thread changes it under the outbox's lock, which is also where it is read.
"""

from __future__ import annotations

GROUP_MAX = 512  # messages per transaction
RETRY_MIN_S, RETRY_MAX_S = 0.1, 2.0


class WriteRetry:
    def __init__(self) -> None:
        self.error = ""  # why the last write failed; "" while writes succeed
        self.group_size = GROUP_MAX
        self.at = 0.0  # monotonic time before which no write is tried
        self._delay_s = 0.0

    def writable(self, now: float) -> bool:
        return now >= self.at

    def failed(self, error: str, now: float) -> bool:
        """Record a failed write; True when it is the first of a run of failures."""
        first = not self.error
        self.error = error
        self._delay_s = min(RETRY_MAX_S, max(RETRY_MIN_S, self._delay_s * 2))
        self.at = now + self._delay_s
        return first

    def succeeded(self) -> str:
        """Record a successful write; the error of the failures it ends ("" if there were none)."""
        previous, self.error, self._delay_s, self.at = self.error, "", 0.0, 0.0
        return previous

    def shrink(self, size: int) -> None:
        """A group of ``size`` messages did not fit."""
        self.group_size = max(1, size // 2)

    def grow(self) -> None:
        """A group was written."""
        self.group_size = min(GROUP_MAX, self.group_size * 2)
