"""The outbox's counters equal its SQLite file whatever interleaves: puts, sends, PUBACKs, expiry and bounds.

A second connection reads the real file; the outbox runs its real thread. ``flush()`` is the sync point: after
it every put and PUBACK before the call has reached the file.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from conftest import wait_until
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edged.clock import ManualClock
from edged.config import OutboxConfig
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._outbox import Outbox


class Broker:
    """The publish side of the outbox: hands out mids as paho does and remembers which await a PUBACK."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_mid = 0
        self.unacked: list[int] = []
        self.sent: list[str] = []

    def publish(self, message: Outbound) -> int:
        with self.lock:
            self.next_mid += 1
            self.unacked.append(self.next_mid)
            self.sent.append(message.message_id)
            return self.next_mid

    def take(self, index: int) -> int | None:
        with self.lock:
            return self.unacked.pop(index % len(self.unacked)) if self.unacked else None


def file_totals(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()
    return int(count), int(size)


def test_pubacks_of_messages_dropped_in_flight_do_not_count_twice_and_drain_returns(tmp_path: Path) -> None:
    """Issue #12: with max_messages=10 the depth went to -5 and wait_drained never returned True. And (review of
    the bounded outbox) the bound dropped messages in flight, which were then PUBACKed and counted published as
    well: now what is in flight fits the bound and is never dropped; only unsent messages are."""
    path = tmp_path / "outbox.sqlite3"
    metrics = Metrics()
    outbox = Outbox(path, OutboxConfig(max_messages=10, max_in_flight=256), metrics)
    broker = Broker()
    outbox.start(broker.publish)
    outbox.set_connected(True)
    for i in range(10):
        outbox.put(Outbound("t/x", f"{i:04d}".encode(), 1, message_id=f"id-{i}"))
    wait_until(lambda: len(broker.sent) == 10, what="10 sent")
    for i in range(10, 25):  # none acknowledged yet, and no producer waits for room: 15 over the bound
        outbox.put(Outbound("t/x", f"{i:04d}".encode(), 1, message_id=f"id-{i}"))
    wait_until(lambda: metrics.snapshot()["drops"].get("outbox_full", 0) == 15, what="15 dropped by the bound")
    assert outbox.flush(5)
    assert broker.sent == [f"id-{i}" for i in range(10)]  # the window keeps to the bound: nothing more went out
    assert outbox.depth == file_totals(path)[0] == 10 and outbox.in_flight == 10
    while (mid := broker.take(0)) is not None:
        outbox.on_acked(mid, True)
    assert outbox.wait_drained(5), f"not drained: depth {outbox.depth}, in flight {outbox.in_flight}"
    assert outbox.depth == 0 and outbox.stored_bytes == 0 and file_totals(path) == (0, 0)
    snapshot = metrics.snapshot()
    assert snapshot["counts"]["published"] == 10 and snapshot["drops"]["outbox_full"] == 15  # 25 produced
    outbox.stop(5)


def test_a_connected_bounded_outbox_makes_producers_wait_and_loses_nothing(tmp_path: Path) -> None:
    """Review of the bounded outbox: max_messages = 50 and a burst of 1500 while the broker was connected, and
    about 1000 results were dropped (those in flight counted dropped and published). A producer that may wait
    for room now waits for the PUBACKs instead: every message is published once and nothing is dropped."""
    metrics = Metrics()
    outbox = Outbox(tmp_path / "outbox.sqlite3", OutboxConfig(max_messages=20, max_in_flight=256), metrics)
    broker = Broker()
    acking = threading.Event()

    def puback_all() -> None:  # the broker's PUBACKs, as they come in on the network thread
        while not acking.is_set():
            while (mid := broker.take(0)) is not None:
                outbox.on_acked(mid, True)
            acking.wait(0.002)

    acker = threading.Thread(target=puback_all)
    outbox.start(broker.publish)
    outbox.set_connected(True)
    acker.start()
    try:
        peak = 0
        for i in range(600):
            assert outbox.put(Outbound("t/x", b"p" * 16, 1, message_id=f"id-{i}"), room_wait=lambda: True)
            peak = max(peak, outbox.depth)
        assert outbox.wait_drained(10), f"not drained: depth {outbox.depth}, in flight {outbox.in_flight}"
    finally:
        acking.set()
        acker.join(5)
        outbox.stop(5)
    snapshot = metrics.snapshot()
    assert snapshot["drops"] == {} and snapshot["counts"]["published"] == 600
    assert sorted(broker.sent) == sorted(f"id-{i}" for i in range(600))
    # the waiting producers kept it to the bound, plus PUBACKed messages whose deletion rides with the next write
    assert peak <= 2 * 20, peak


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="edged-outbox-prop-"))
        self.path = self.dir / "outbox.sqlite3"
        self.clock = ManualClock()
        self.metrics = Metrics()
        self.config = OutboxConfig(max_messages=8, max_bytes=400, max_age_s=100.0, max_in_flight=4)
        self.outbox = Outbox(self.path, self.config, self.metrics, self.clock)
        self.broker = Broker()
        self.outbox.start(self.broker.publish)
        self.connected = False
        self.puts = 0

    @rule(size=st.integers(min_value=1, max_value=120))
    def put(self, size: int) -> None:
        self.puts += 1
        self.outbox.put(Outbound("t/x", b"p" * size, 1, message_id=f"m-{self.puts}"))

    @rule(connected=st.booleans())
    def connection(self, connected: bool) -> None:
        self.connected = connected
        self.outbox.set_connected(connected)

    @rule(index=st.integers(min_value=0, max_value=50), ok=st.booleans())
    def puback(self, index: int, ok: bool) -> None:
        mid = self.broker.take(index)
        if mid is not None:
            self.outbox.on_acked(mid, ok)

    @rule(seconds=st.sampled_from([1.0, 30.0, 60.0, 101.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(years=st.sampled_from([-10, 10]))
    def wall_clock_steps(self, years: int) -> None:
        self.clock.jump_wall(years * 365.25 * 86400)

    @rule()
    def settle(self) -> None:
        assert self.outbox.flush(10)

    @invariant()
    def counters_equal_the_file(self) -> None:
        assert self.outbox.flush(10)
        count, size = file_totals(self.path)
        assert (self.outbox.depth, self.outbox.stored_bytes) == (count, size)
        assert self.outbox.in_flight <= self.config.max_in_flight
        assert count <= self.config.max_messages and size <= self.config.max_bytes

    @precondition(lambda self: self.puts > 0)
    @rule()
    def drain(self) -> None:
        """Acknowledge everything, as a broker that comes back does: the outbox must empty and say so."""
        self.connection(True)
        for _ in range(200):
            while (mid := self.broker.take(0)) is not None:
                self.outbox.on_acked(mid, True)
            if self.outbox.wait_drained(0.05):
                break
        assert self.outbox.wait_drained(5), f"depth {self.outbox.depth}, in flight {self.outbox.in_flight}"
        assert file_totals(self.path) == (0, 0)

    def teardown(self) -> None:
        self.outbox.stop(5)
        shutil.rmtree(self.dir, ignore_errors=True)


OutboxMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_counters_equal_the_database_over_random_interleavings = OutboxMachine.TestCase
