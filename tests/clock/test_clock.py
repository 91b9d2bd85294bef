"""DeviceClock: elapsed time continues across daemon restarts and reboots and ignores wall-clock jumps."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from edged.clock import DeviceClock, ManualClock, state_file_in

TEN_YEARS_S = 10 * 365.25 * 86400


class Ticks:
    """A boottime source the test moves by hand (a fake of the kernel's clock, not of our own classes)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_elapsed_ignores_wall_jumps_in_both_directions(tmp_path: Path) -> None:
    wall = [1_700_000_000.0]
    ticks = Ticks(100.0)
    clock = DeviceClock(state_file_in(tmp_path), wall=lambda: wall[0], boottime=ticks, boot_id="boot-a")
    before = clock.elapsed()
    for jump in (TEN_YEARS_S, -2 * TEN_YEARS_S):
        wall[0] += jump
        ticks.now += 1.0
        assert clock.elapsed() == before + (ticks.now - 100.0)
    assert clock.wall() == wall[0]


def test_a_restart_within_one_boot_keeps_the_offset(tmp_path: Path) -> None:
    ticks = Ticks(50.0)
    first = DeviceClock(state_file_in(tmp_path), boottime=ticks, boot_id="boot-a")
    first.advance_past(500.0)
    ticks.now = 60.0
    second = DeviceClock(state_file_in(tmp_path), boottime=ticks, boot_id="boot-a")
    assert second.elapsed() == first.elapsed() == 510.0


def test_a_new_boot_continues_from_the_last_checkpoint(tmp_path: Path) -> None:
    ticks = Ticks(1_000.0)
    first = DeviceClock(state_file_in(tmp_path), boottime=ticks, boot_id="boot-a")
    ticks.now = 1_200.0
    first.checkpoint()
    ticks.now = 5.0  # rebooted: CLOCK_BOOTTIME starts again near zero
    second = DeviceClock(state_file_in(tmp_path), boottime=ticks, boot_id="boot-b")
    assert second.elapsed() == 1_205.0


def test_advance_past_raises_elapsed_to_rows_recorded_after_the_checkpoint(tmp_path: Path) -> None:
    ticks = Ticks(5.0)
    clock = DeviceClock(state_file_in(tmp_path), boottime=ticks, boot_id="boot-b")
    clock.advance_past(9_000.0)
    assert clock.elapsed() == 9_000.0
    clock.advance_past(10.0)  # never backwards
    assert clock.elapsed() == 9_000.0


def test_a_corrupt_state_file_starts_from_zero_offset(tmp_path: Path) -> None:
    state_file_in(tmp_path).write_text("{not json", encoding="utf-8")
    clock = DeviceClock(state_file_in(tmp_path), boottime=Ticks(7.0), boot_id="boot-a")
    assert clock.elapsed() == 7.0


def test_manual_clock_jumps_wall_only() -> None:
    clock = ManualClock(wall=0.0, elapsed=10.0)
    clock.jump_wall(TEN_YEARS_S)
    clock.advance(2.0)
    assert (clock.wall(), clock.elapsed()) == (TEN_YEARS_S + 2.0, 12.0)


@pytest.mark.parametrize("offset, last, expected", [
    ("NaN", 1_200.0, 1_207.0),  # the last checkpoint is good: continue from it
    ("Infinity", "NaN", 7.0),  # nothing usable: from zero (the stores then move it past their rows)
    ("-Infinity", 1_200.0, 1_207.0),
    (-5.0, 1_200.0, 1_207.0),
])
def test_a_state_file_with_a_nan_or_infinite_offset_is_refused_with_a_log_line(tmp_path: Path, caplog, offset,
                                                                               last, expected) -> None:
    """json reads NaN and Infinity: the offset was used, elapsed time stayed NaN or inf and every checkpoint
    wrote it back, so telemetry writes failed for good."""
    state = state_file_in(tmp_path)
    def token(value: float | str) -> str:  # NaN and Infinity as json.dumps writes them
        return value if isinstance(value, str) else json.dumps(value)

    state.write_text(f'{{"boot_id": "boot-a", "offset": {token(offset)}, "last_elapsed": {token(last)}}}',
                     encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="edged.clock"):
        clock = DeviceClock(state, boottime=Ticks(7.0), boot_id="boot-a")
    assert clock.elapsed() == expected
    assert any(str(state) in r.getMessage() and "not a usable time" in r.getMessage() for r in caplog.records)
    document = json.loads(state.read_text(encoding="utf-8"))
    assert math.isfinite(document["offset"]) and math.isfinite(document["last_elapsed"])


def test_advance_past_ignores_an_infinite_row_time(tmp_path: Path) -> None:
    """A row written while the offset was inf (its t is inf) brought the infinite offset back at the next open."""
    clock = DeviceClock(state_file_in(tmp_path), boottime=Ticks(5.0), boot_id="boot-b")
    clock.advance_past(float("inf"))
    clock.advance_past(float("nan"))
    assert clock.elapsed() == 5.0
