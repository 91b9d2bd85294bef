"""Waiting out a short batching delay on time: asleep until shortly before its end, then awake.

A timed wait on Linux ends late by the time the kernel takes to get a sleeping thread running again, even with
1 µs timer slack: on the 2-core VM of docs/benchmarks.md 45-130 µs at p50 for waits of 20-400 µs, as much as
a delay of 100 µs itself, and on an idle CPU in a deep idle state (a Jetson at rest) possibly more. So a waiter
that must end on time sleeps only until `Lateness.spin_ns` before its end and spends the rest awake, and
`spin_ns` follows how late its sleeps have ended: a machine that wakes on time spins little, one that wakes late
spins at most SPIN_MAX_NS per wait. The estimate is a value with no I/O; the waiter (edged.engine.worker_pool)
feeds it under its lock.
"""

from __future__ import annotations

import time

__all__ = ["SPIN_MAX_NS", "Lateness", "spin_until"]

# The longest a waiter stays awake before its deadline: what one lone request may cost in CPU beyond its run.
SPIN_MAX_NS = 200_000
# spin_ns is this multiple of the average lateness: the average sits below the slow half of the wake-ups.
_MARGIN = 3 / 2
# Each new observation moves the average by this fraction of the difference (an exponential moving average).
_WEIGHT = 1 / 8


class Lateness:
    """How late this waiter's timed sleeps have ended, and so how long before a deadline it stops sleeping."""

    __slots__ = ("average_ns",)

    def __init__(self) -> None:
        self.average_ns = 0.0  # nothing observed: sleep up to the deadline until a sleep shows how late it ends

    @property
    def spin_ns(self) -> int:
        return min(SPIN_MAX_NS, int(self.average_ns * _MARGIN))

    def observe(self, late_ns: int) -> None:
        """A sleep meant to end at some instant ended ``late_ns`` after it (early ends count as on time)."""
        late = min(max(late_ns, 0), SPIN_MAX_NS)  # one stall of a loaded machine must not set the spin alone
        self.average_ns += (late - self.average_ns) * _WEIGHT


def spin_until(end_ns: int) -> None:
    """Stay awake until perf_counter_ns reaches ``end_ns`` (at most SPIN_MAX_NS away: the caller bounds it)."""
    clock = time.perf_counter_ns
    while clock() < end_ns:
        pass
