"""A bounded hand-off queue between the network thread and a worker, with a backpressure policy.

``block`` makes the producer (paho's network thread) wait for room, which stops reading from the broker: the
broker queues for us (set its max_queued_messages). ``drop_oldest`` never waits: it drops the oldest queued
message and counts it.

A ``block`` queue takes a flow-controlled item over its capacity (``flow_controlled``: a QoS 1/2 input, of
which the broker should send only so many unacknowledged: edged's v5 Receive Maximum, the broker's
max_inflight_messages), up to ``FLOW_LIMIT`` items: the network thread then need not stop reading, and goes on
reading the PUBACKs that make room in a full outbox, which the pipeline worker waits for. The limit is far
above the capacity because brokers count loosely (mosquitto 2.0.11 sent most of a 1500-input burst to a
Receive Maximum of 64); it bounds memory should a broker ignore flow control altogether, together with
``FLOW_LIMIT_BYTES`` of such items' payloads past the capacity (4096 camera frames would be gigabytes).

A ``drop_oldest`` queue built with ``hold_flow_controlled`` (the request topics') likewise takes flow-controlled
items past its capacity up to those limits before it drops: a backlog of QoS 1/2 requests that waited in the
session while edged was down, which the broker may send all at once, is served rather than refused.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")
FLOW_LIMIT = 4096
FLOW_LIMIT_BYTES = 64 << 20


class BoundedQueue(Generic[T]):
    def __init__(self, capacity: int, policy: str, *, hold_flow_controlled: bool = False) -> None:
        self._capacity = capacity
        self._policy = policy
        self._hold = hold_flow_controlled  # drop_oldest: flow-controlled items get the block queue's room
        self._items: deque[T] = deque()
        self._sizes: deque[int] = deque()  # each item's payload bytes, as put() was told
        self._bytes = 0  # their sum
        self._cond = threading.Condition()
        self._closed = False
        self._takers = 0  # threads waiting in take(): only they need a notify
        self._blocked = 0  # producers waiting in put() for room
        self.wakeups = 0  # notifies of a waiting taker: hand-offs from the producer's thread to a worker's

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T, flow_controlled: bool = False, size: int = 0) -> T | None:
        """Queue ``item`` (``size``: its payload bytes); returns the item dropped to make room (drop_oldest),
        the item itself when the queue is closed, else None."""
        limit = max(self._capacity, FLOW_LIMIT) if flow_controlled else self._capacity
        with self._cond:
            while self._policy == "block" and not self._closed and (
                    len(self._items) >= limit
                    or (len(self._items) >= self._capacity and self._bytes + size > FLOW_LIMIT_BYTES)):
                self._blocked += 1
                try:
                    self._cond.wait(0.5)
                finally:
                    self._blocked -= 1
            if self._closed:
                return item
            dropped = None
            if self._policy != "block" and (
                    len(self._items) >= (limit if self._hold else self._capacity)
                    or (self._hold and len(self._items) >= self._capacity
                        and self._bytes + size > FLOW_LIMIT_BYTES)):
                dropped = self._items.popleft()
                self._bytes -= self._sizes.popleft()
            self._items.append(item)
            self._sizes.append(size)
            self._bytes += size
            if self._takers:  # takers wait only while empty: one notify per burst, not one per item
                self._takers = 0  # all of them are woken now
                self.wakeups += 1
                self._cond.notify_all()
            return dropped

    def take(self, most: int, timeout_s: float = 0.5) -> list[T]:
        """Up to ``most`` items, waiting up to ``timeout_s`` for the first; [] when closed and empty."""
        with self._cond:
            if not self._items and not self._closed:
                self._takers += 1
                if not self._cond.wait(timeout_s):  # timed out: no put counted this taker off
                    self._takers = max(0, self._takers - 1)
            count = min(most, len(self._items))
            batch = [self._items.popleft() for _ in range(count)]
            for _ in range(count):
                self._bytes -= self._sizes.popleft()
            if batch:
                self._cond.notify_all()
            return batch

    def close(self) -> None:
        """Refuse new items; what is queued can still be taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def clear(self) -> int:
        with self._cond:
            count = len(self._items)
            self._items.clear()
            self._sizes.clear()
            self._bytes = 0
            return count

    def producer_waits(self) -> bool:
        """A producer (the network thread) waits for room: it reads nothing, PUBACKs included, meanwhile."""
        return self._blocked > 0

    @property
    def finished(self) -> bool:
        return self._closed and not self._items
