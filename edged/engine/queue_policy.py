"""Triton's queue policy: one queue per priority level, each under its ModelQueuePolicy, and batch formation.

What it guarantees (the scheduler holds its lock around every call; nothing here locks):

- Levels are served most urgent first: level 1 before level 2 (Triton's priority order). A request's priority 0,
  or one above ``priority_levels``, gets ``default_priority_level``, as Triton does.
- A level's policy is its ``priority_queue_policy`` entry, else ``default_queue_policy``:
  - ``max_queue_size`` bounds that level's queue (Triton: per level); 0, Triton's "unbounded", means
    DEFAULT_MAX_QUEUE, since a device with a few GB cannot hold an unbounded queue. The levels without a
    ``priority_queue_policy`` entry share the one bound of ``default_queue_policy`` (edged: with up to 2**64
    levels, a bound per level would bound nothing).
  - ``default_timeout_microseconds`` is how long a request may wait. A request's own ``timeout`` parameter may
    shorten it when ``allow_timeout_override`` is true, never lengthen it (Triton); on a level without a default
    timeout the request's own timeout applies (edged: a caller's deadline is honoured).
  - ``timeout_action: REJECT`` fails a timed-out request with RequestTimeout. ``DELAY`` moves it behind every
    request of its level that has not timed out, where it waits without a deadline: Triton's "delayed until all
    other requests at the same (or higher) priority levels that have not reached their timeouts are processed".
- Every queued request with a deadline is checked, not only the head of a queue: a request without a deadline
  never shields expired ones behind it.
- A batch comes from the most urgent level with work: its requests that have not timed out first, then its
  delayed ones, in order, while they share the input signature and fit ``max_batch_size``; it is cut back to a
  preferred batch size where one fits.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from edged.engine.types import InferRequest, InferResponse
from edged.engine.validation import InputPlan
from edged.errors import EdgedError
from edged.repository.model_config import DynamicBatching, QueuePolicy

Done = Callable[[InferResponse | EdgedError], None]
# Triton leaves max_queue_size 0 as unbounded; a device with a few GB cannot, so 0 means this many.
DEFAULT_MAX_QUEUE = 1024


class Pending:
    __slots__ = ("batch_size", "deadline_ns", "delayed", "done", "enqueued_ns", "inputs", "level", "request",
                 "signature")

    def __init__(self, request: InferRequest, plan: InputPlan, done: Done, timeout_ns: int, level: int) -> None:
        self.request = request
        self.batch_size, self.inputs, self.signature = plan
        self.done = done
        self.level = level
        self.delayed = False  # timed out under timeout_action DELAY: waits behind its level's other requests
        self.enqueued_ns = time.perf_counter_ns()
        self.deadline_ns = self.enqueued_ns + timeout_ns if timeout_ns > 0 else 0


@dataclass(frozen=True)
class LevelPolicy:
    timeout_ns: int
    allow_override: bool
    max_queue: int
    delay: bool

    @classmethod
    def of(cls, policy: QueuePolicy) -> LevelPolicy:
        return cls(policy.default_timeout_microseconds * 1000, policy.allow_timeout_override,
                   policy.max_queue_size or DEFAULT_MAX_QUEUE, policy.timeout_action == "DELAY")

    def timeout_for(self, request_timeout_us: int) -> int:
        """The request's wait limit in ns (0: none)."""
        wanted = request_timeout_us * 1000
        if not self.timeout_ns:
            return wanted
        if wanted and self.allow_override and wanted < self.timeout_ns:
            return wanted
        return self.timeout_ns


class Level:
    """One priority level's queue: requests in arrival order, then those delayed by timeout_action DELAY."""

    __slots__ = ("delayed", "next_deadline_ns", "policy", "ready", "size")

    def __init__(self, policy: LevelPolicy) -> None:
        self.policy = policy
        self.ready: deque[Pending] = deque()
        self.delayed: deque[Pending] = deque()
        self.size = 0
        self.next_deadline_ns = 0  # at or before the earliest deadline in `ready`; 0: none there

    def push_front(self, item: Pending) -> None:
        (self.delayed if item.delayed else self.ready).appendleft(item)
        self.size += 1
        self._note(item.deadline_ns)

    def push(self, item: Pending) -> None:
        self.ready.append(item)
        self.size += 1
        if item.deadline_ns:
            self._note(item.deadline_ns)

    def _note(self, deadline_ns: int) -> None:
        if deadline_ns and (not self.next_deadline_ns or deadline_ns < self.next_deadline_ns):
            self.next_deadline_ns = deadline_ns

    def expire(self, now_ns: int, expired: list[Pending]) -> None:
        """Take out (REJECT) or move behind (DELAY) every request whose deadline passed, wherever it waits."""
        kept: deque[Pending] = deque()
        nearest = 0
        for item in self.ready:
            deadline = item.deadline_ns
            if deadline and deadline < now_ns:
                if self.policy.delay:
                    item.deadline_ns = 0
                    item.delayed = True
                    self.delayed.append(item)
                else:
                    expired.append(item)
                    self.size -= 1
                continue
            kept.append(item)
            if deadline and (not nearest or deadline < nearest):
                nearest = deadline
        self.ready = kept
        self.next_deadline_ns = nearest

    def first(self) -> Pending:
        return self.ready[0] if self.ready else self.delayed[0]

    def rows(self) -> int:
        return sum(item.batch_size for item in self.ready) + sum(item.batch_size for item in self.delayed)

    def take(self, max_batch: int) -> list[Pending]:
        first = (self.ready if self.ready else self.delayed).popleft()
        batch = [first]
        if max_batch:
            total, signature = first.batch_size, first.signature
            for queue in (self.ready, self.delayed):
                while queue and queue[0].signature == signature and total + queue[0].batch_size <= max_batch:
                    item = queue.popleft()
                    batch.append(item)
                    total += item.batch_size
                if queue:  # the batch ended here; delayed requests never jump over a ready one
                    break
        self.size -= len(batch)
        return batch


class PriorityQueues:
    def __init__(self, batching: DynamicBatching | None, max_batch: int, preferred: tuple[int, ...]) -> None:
        self._level_count = batching.priority_levels if batching else 0
        self._default_level = (batching.default_priority_level or 1) if self._level_count and batching else 1
        self._default_policy = LevelPolicy.of(batching.default_queue_policy if batching else QueuePolicy())
        self._policies = {level: LevelPolicy.of(policy)
                          for level, policy in (batching.priority_queue_policy if batching else {}).items()}
        self._max_batch = max_batch
        self._preferred = preferred
        # Levels that keep their queue while empty; any other level (up to 2**64 may be configured) exists only
        # while requests wait in it.
        self._kept = {self._default_level, *self._policies}
        self._levels: dict[int, Level] = {}
        self._order: list[int] = []  # the keys of _levels, most urgent first
        for level in sorted(self._kept):
            self._level(level)
        self.count = 0
        self._shared = 0  # requests waiting in levels without their own policy: they share its bound
        # At or before the earliest deadline of any queued request; 0: none has one, no clock needs reading.
        self.next_deadline_ns = 0
        # Without priority levels every request goes to one level: the per-request path skips the level lookups.
        self._only = self._levels[self._default_level] if self._level_count <= 1 else None

    def _level(self, key: int) -> Level:
        level = self._levels.get(key)
        if level is None:
            level = self._levels[key] = Level(self._policies.get(key, self._default_policy))
            bisect.insort(self._order, key)
        return level

    def _drop_if_empty(self, key: int, level: Level) -> None:
        if not level.size and key not in self._kept:
            del self._levels[key]
            self._order.remove(key)

    def pending(self, request: InferRequest, plan: InputPlan, done: Done) -> Pending:
        only = self._only
        if only is not None:
            policy = only.policy
            timeout_ns = policy.timeout_for(request.timeout_us) if request.timeout_us else policy.timeout_ns
            return Pending(request, plan, done, timeout_ns, self._default_level)
        priority = request.priority
        key = priority if 0 < priority <= self._level_count else self._default_level
        policy = self._policies.get(key, self._default_policy)
        return Pending(request, plan, done, policy.timeout_for(request.timeout_us), key)

    def shares_bound(self, level: int) -> bool:
        """Whether ``level`` counts against the one bound of the levels without a ``priority_queue_policy``."""
        return self._only is None and level not in self._policies

    def push(self, item: Pending) -> int:
        """Queue ``item``; 0 when queued, else the max_queue_size that it would exceed."""
        deadline = item.deadline_ns
        if deadline and (not self.next_deadline_ns or deadline < self.next_deadline_ns):
            self.next_deadline_ns = deadline
        only = self._only
        if only is not None:  # one level: its size is the shared count too
            if only.size >= only.policy.max_queue:
                return only.policy.max_queue
            only.ready.append(item)  # Level.push without the call: this runs for every request
            only.size += 1
            if deadline and (not only.next_deadline_ns or deadline < only.next_deadline_ns):
                only.next_deadline_ns = deadline
            self.count += 1
            return 0
        shared = item.level not in self._policies
        bound = self._default_policy.max_queue if shared else self._policies[item.level].max_queue
        level = self._level(item.level)
        if (self._shared if shared else level.size) >= bound:
            self._drop_if_empty(item.level, level)
            return bound
        level.push(item)
        self.count += 1
        self._shared += shared
        return 0

    def push_front(self, items: list[Pending]) -> None:
        """Put ``items`` (taken earlier, in order) back at the front of their queues."""
        for item in reversed(items):
            self._level(item.level).push_front(item)
            self._shared += item.level not in self._policies
            deadline = item.deadline_ns
            if deadline and (not self.next_deadline_ns or deadline < self.next_deadline_ns):
                self.next_deadline_ns = deadline
        self.count += len(items)

    def expire(self, now_ns: int) -> list[Pending]:
        expired: list[Pending] = []
        for key in list(self._order):
            level = self._levels[key]
            if level.next_deadline_ns and level.next_deadline_ns < now_ns:
                before = len(expired)
                level.expire(now_ns, expired)
                if key not in self._policies:
                    self._shared -= len(expired) - before
                self._drop_if_empty(key, level)
        self.count -= len(expired)
        self.next_deadline_ns = min((level.next_deadline_ns for level in self._levels.values()
                                     if level.next_deadline_ns), default=0)
        return expired

    def urgent(self) -> Level | None:
        """The most urgent level with work."""
        return next((level for key in self._order if (level := self._levels[key]).size), None)

    def take(self) -> list[Pending]:
        """The next batch (empty when nothing waits)."""
        only = self._only
        if only is not None:
            if not only.size:
                return []
            batch = only.take(self._max_batch)
            self.count -= len(batch)
            return self._trim(batch) if len(batch) > 1 else batch
        for key in self._order:
            level = self._levels[key]
            if level.size:
                batch = level.take(self._max_batch)
                self.count -= len(batch)
                if key not in self._policies:
                    self._shared -= len(batch)
                if len(batch) > 1:
                    batch = self._trim(batch)
                self._drop_if_empty(key, level)
                return batch
        return []

    def _trim(self, batch: list[Pending]) -> list[Pending]:
        """``batch`` cut back to the largest preferred size it holds; below the smallest nothing can be cut."""
        preferred = self._preferred
        total = sum(item.batch_size for item in batch)
        if not preferred or total < preferred[0] or total in preferred:
            return batch
        running = 0
        best = len(batch)
        for index, item in enumerate(batch, start=1):
            running += item.batch_size
            if running in self._preferred:
                best = index
        self.push_front(batch[best:])
        return batch[:best]

    def drain(self) -> list[Pending]:
        """Every queued request, most urgent first; the queues are left empty."""
        items = [item for key in self._order for level in (self._levels[key],)
                 for item in (*level.ready, *level.delayed)]
        for level in self._levels.values():
            level.ready.clear()
            level.delayed.clear()
            level.size = 0
            level.next_deadline_ns = 0
        for key in [key for key in self._order if key not in self._kept]:
            del self._levels[key]
            self._order.remove(key)
        self.count = self._shared = self.next_deadline_ns = 0
        return items
