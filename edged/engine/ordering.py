"""``preserve_ordering``: responses leave in the order their requests were queued, whatever ran first.

Triton's dynamic batcher, with ``preserve_ordering: true``, returns responses "in the same order as the order of
requests sent to the scheduler": a request that was overtaken by a higher-priority one, or that ran on a slower
instance, holds back the responses of the requests queued after it. Every result counts, errors (a timeout, an
unload) included, so one request can never hold the others back forever. A request refused before it is queued
(queue full, unloading) is answered at once: it never had a place in the order.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from edged.engine.types import InferResponse
from edged.errors import EdgedError

log = logging.getLogger(__name__)

Result = InferResponse | EdgedError
Done = Callable[[Result], None]


class _Slot:
    __slots__ = ("done", "result")

    def __init__(self, done: Done) -> None:
        self.done = done
        self.result: Result | None = None


class ResponseOrder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: deque[_Slot] = deque()
        self._releasing = False  # one thread at a time hands results out, so they leave in order

    def slot(self, done: Done) -> Done:
        """Take the next place in the order (call in queueing order); the returned callback fills it."""
        slot = _Slot(done)
        with self._lock:
            self._slots.append(slot)

        def fill(result: Result) -> None:
            with self._lock:
                slot.result = result
                if self._releasing:
                    return  # the releasing thread will reach it
                self._releasing = True
            self._release()

        return fill

    def _release(self) -> None:
        while True:
            with self._lock:
                if not self._slots or self._slots[0].result is None:
                    self._releasing = False
                    return
                head = self._slots.popleft()
            result = head.result
            if result is None:  # unreachable: checked under the lock above
                continue
            try:
                head.done(result)
            except Exception:  # one caller's failing callback must not stop the responses queued after it
                log.exception("a completion callback raised")
