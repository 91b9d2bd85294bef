"""Outbox ages follow device elapsed time: wall clock steps of ten years neither expire nor keep the backlog;
files written before ages were recorded are migrated; a new boot's clock never runs behind the stored rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edged.clock import DeviceClock, ManualClock, state_file_in
from edged.config import MqttConfig, OutboxConfig
from edged.engine import InferenceService
from edged.mqtt import MqttFrontEnd
from edged.mqtt._message import Outbound
from edged.mqtt._metrics import Metrics
from edged.mqtt._outbox import Outbox

TEN_YEARS_S = 10 * 365.25 * 86400
OLD_SCHEMA = """
CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL, topic TEXT NOT NULL,
    payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, correlation BLOB, content_type TEXT,
    user_props BLOB, created REAL NOT NULL)
"""


def expired(metrics: Metrics) -> int:
    return metrics.snapshot()["drops"].get("outbox_expired", 0)


@pytest.mark.parametrize("step_s", [TEN_YEARS_S, -TEN_YEARS_S], ids=["forward", "backward"])
def test_a_ten_year_wall_clock_step_neither_expires_nor_keeps_the_backlog(tmp_path: Path, step_s: float) -> None:
    clock, metrics = ManualClock(), Metrics()
    outbox = Outbox(tmp_path / "o.sqlite3", OutboxConfig(max_age_s=3600.0), metrics, clock)
    outbox.start(lambda message: None)  # never connected: the backlog waits
    for i in range(5):
        outbox.put(Outbound("t/x", b"result", 1, message_id=f"m-{i}"))
    assert outbox.flush(10) and outbox.depth == 5
    clock.advance(1800.0)
    clock.jump_wall(step_s)  # NTP arrives after an offline boot with the RTC in 1970 or 2038
    outbox.put(Outbound("t/x", b"after the step", 1, message_id="m-5"))
    clock.advance(1799.0)
    assert outbox.flush(10)
    assert outbox.depth == 6 and expired(metrics) == 0
    clock.advance(6.0)  # the first five are now older than max_age_s (checked every 5 s of elapsed time)
    assert outbox.flush(10)
    assert expired(metrics) == 5 and outbox.depth == 1
    clock.advance(1800.0)
    assert outbox.flush(10)
    assert expired(metrics) == 6 and outbox.depth == 0
    outbox.stop(5)


def test_an_outbox_file_without_elapsed_times_is_migrated_and_ages_from_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(OLD_SCHEMA)
        rows = [(f"old-{i}", "t/x", b"kept", 0.0) for i in range(3)]  # wall times from a clock in 1970
        db.executemany("INSERT INTO outbox (message_id, topic, payload, qos, retain, created) "
                       "VALUES (?, ?, ?, 1, 0, ?)", rows)
    clock, metrics, sent = ManualClock(), Metrics(), []
    outbox = Outbox(path, OutboxConfig(max_age_s=100.0), metrics, clock)
    assert outbox.depth == 3

    def publish(message: Outbound) -> int:  # taken, never acknowledged
        sent.append(message.message_id)
        return len(sent)

    outbox.start(publish)  # not connected: the rows wait unsent (one in flight would be delivered, not expired)
    clock.advance(99.0)
    assert outbox.flush(10) and outbox.depth == 3 and expired(metrics) == 0
    clock.advance(6.0)
    assert outbox.flush(10) and expired(metrics) == 3 and outbox.depth == 0
    outbox.set_connected(True)
    outbox.put(Outbound("t/x", b"new", 1, message_id="new-0"))
    assert outbox.flush(10) and sent == ["new-0"]  # the migrated file takes and sends new rows
    outbox.stop(5)
    with sqlite3.connect(path) as db:
        assert "elapsed" in {row[1] for row in db.execute("PRAGMA table_info(outbox)")}


def test_a_new_boot_clock_is_advanced_past_the_newest_stored_row(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    before = ManualClock(elapsed=50_000.0)
    first = Outbox(path, OutboxConfig(max_age_s=1000.0), Metrics(), before)
    first.start(lambda message: None)
    first.put(Outbound("t/x", b"x", 1, message_id="m-0"))
    assert first.flush(10)
    first.stop(5)
    # the clock state file was lost: the new boot's elapsed time would start near zero
    clock = DeviceClock(tmp_path / "clock.json", boottime=lambda: 10.0, boot_id="another-boot")
    metrics = Metrics()
    second = Outbox(path, OutboxConfig(max_age_s=1000.0), metrics, clock)
    assert clock.elapsed() >= 50_000.0
    second.start(lambda message: None)
    assert second.flush(10) and second.depth == 1 and expired(metrics) == 0
    second.stop(5)


def test_the_front_end_ages_its_outbox_by_the_state_directory_clock_it_is_given(
        service: InferenceService, tmp_path: Path) -> None:
    """One DeviceClock per state directory (the daemon's): a second one would checkpoint over the first."""
    state = tmp_path / "state"
    clock = DeviceClock(state_file_in(state))
    front = MqttFrontEnd(service, MqttConfig(broker="mqtt://127.0.0.1:1", device_id="clock1"), state,
                         version="test", clock=clock)
    try:
        assert front.clock is clock and front._outbox._clock is clock
    finally:
        front._outbox.stop(1)
