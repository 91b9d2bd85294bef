"""Intake: whether a front end holds requests it has read but not yet submitted, so batches can wait for them.

A front end on an event loop parses the requests of one loop iteration one after another and submits them
together at the end of the iteration (edged.serving._infer). A worker whose batching delay expires in the
middle of that iteration would take a partial batch and leave the requests being parsed to the next one. So
the front end opens the intake when it starts holding requests back and closes it once it has submitted them;
a worker whose delay has expired while the intake is open waits for the close, once per batch and at most
the delay once more (the scheduler bounds it), and the close wakes it. One intake per service: it does not say
which model the held requests are for, so a batch of another model may wait for that one flush too.

Guarantees: `open` and `close` cost an attribute store and a check, with no lock, unless a worker is holding; a
worker that registers as holding and then still sees the intake open is woken by the close that follows (it
registers before it looks, under its own scheduler's lock, which `close` takes to wake it). A lone request never
sees an open intake, so it waits its delay and no longer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Intake:
    def __init__(self) -> None:
        self.is_open = False
        self._lock = threading.Lock()
        self._holders: list[Callable[[], None]] = []

    def open(self) -> None:
        """Requests are being read that will be submitted together (call `close` once they are)."""
        self.is_open = True

    def close(self) -> None:
        """What was held back has been submitted: wake the workers that waited for it."""
        self.is_open = False
        if self._holders:
            with self._lock:
                holders, self._holders = self._holders, []
            for wake in holders:
                wake()

    def hold(self, wake: Callable[[], None]) -> bool:
        """Register ``wake`` for the next `close` and say whether the intake is open (False: do not wait)."""
        with self._lock:
            self._holders.append(wake)
        if self.is_open:
            return True
        self.release(wake)
        return False

    def release(self, wake: Callable[[], None]) -> None:
        """``wake`` no longer waits (its hold ended without a close)."""
        with self._lock:
            if wake in self._holders:
                self._holders.remove(wake)
