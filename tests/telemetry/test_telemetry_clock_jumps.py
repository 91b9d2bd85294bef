"""Telemetry ages by device elapsed time: a wall clock stepped 10 years either way (an offline boot, then NTP)
neither empties the history nor keeps it forever, and ``--since 1h`` is the last hour of device life.

The live source is a fake of the `TelemetrySource` Protocol fed with recorded tegrastats lines that stamps its
samples as the tegrastats source does (``t`` = the wall clock) from an injected `ManualClock`: a subprocess's
wall clock cannot be stepped without moving the whole machine's.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from pathlib import Path

import pytest
from telemetry_data import SYSFS, recorded_lines

from edged.cli.main import main
from edged.clock import DeviceClock, ManualClock, read_boot_id, state_file_in
from edged.config import TelemetryConfig
from edged.supervision import HealthBoard
from edged.telemetry import Sample, TelemetryReader, TelemetryService, parse_tegrastats
from edged.telemetry._schema import SCHEMA_VERSION
from edged.telemetry._store import Record, TelemetryStore

STEP_S = 10.0
SAMPLES = 3 * 360  # three hours of device life
JUMP_AT = SAMPLES - 180  # the wall clock steps 30 minutes before the end
TEN_YEARS_S = 10 * 365.25 * 86400


class SteppedRecording:
    """Recorded lines, one per STEP_S of device life; the wall clock steps by ``jump_s`` at sample JUMP_AT."""

    name = "recorded"

    def __init__(self, clock: ManualClock, jump_s: float) -> None:
        self._clock = clock
        self._jump_s = jump_s
        self._lines = recorded_lines("orin_nano_jp6.log")
        self._index = 0

    def next_sample(self, stop: threading.Event) -> Sample | None:
        if self._index >= SAMPLES or stop.is_set():
            return None
        if self._index == JUMP_AT:
            self._clock.jump_wall(self._jump_s)
        self._clock.advance(STEP_S)
        line = self._lines[self._index % len(self._lines)]
        self._index += 1
        return parse_tegrastats(line, t=self._clock.wall())

    def close(self) -> None:
        self._index = SAMPLES


@pytest.fixture(params=[TEN_YEARS_S, -TEN_YEARS_S], ids=["plus_10_years", "minus_10_years"])
def jumped_history(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, float]:
    clock = ManualClock(wall=1_700_000_000.0, elapsed=50_000.0)
    config = TelemetryConfig(raw_retention_s=3600, minute_retention_s=2 * 3600, flush_interval_s=0.05,
                             batch_size=30)
    path = tmp_path / "telemetry.db"
    service = TelemetryService(config, str(path), source=SteppedRecording(clock, request.param), clock=clock)
    service.start()
    assert service.wait_samples(SAMPLES, timeout=60)
    service.stop()
    return path, request.param


def test_since_1h_is_the_last_hour_of_device_life_across_the_step(jumped_history: tuple[Path, float],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path, jump = jumped_history
    points = TelemetryReader(str(path)).points(3600, "gpu_load_pct")
    assert len(points) == 361  # every 10 s of the last hour, both sides of the step
    newest = points[-1].elapsed
    assert points[0].elapsed == newest - 3600
    walls = [p.t for p in points]
    assert max(walls) - min(walls) > abs(jump) / 2  # shown with the wall time each was recorded at
    assert main(["telemetry", "query", "--db", str(path), "--since", "1h", "--series", "gpu_load_pct"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 361


def test_retention_neither_drops_the_backlog_nor_keeps_it_forever(jumped_history: tuple[Path, float]) -> None:
    path, _ = jumped_history
    conn = sqlite3.connect(path)
    newest, oldest = conn.execute("SELECT MAX(t), MIN(t) FROM samples").fetchone()
    assert newest - 3600 - 60 <= oldest <= newest - 3600  # raw: an hour (plus the minute not yet rolled up)
    gpu = conn.execute("SELECT id FROM names WHERE name = 'gpu_load_pct'").fetchone()[0]
    buckets = [b for (b,) in conn.execute("SELECT bucket FROM rollup_1m WHERE name_id = ? ORDER BY bucket", (gpu,))]
    assert newest - 2 * 3600 <= buckets[0] <= newest - 2 * 3600 + 60  # minutes: two hours, none lost
    assert buckets[-1] >= newest - 120
    assert buckets == [buckets[0] + 60 * i for i in range(len(buckets))]


def test_a_v2_database_keyed_by_wall_time_is_moved_behind_the_device_clock(tmp_path: Path) -> None:
    """Upgrading: the old history keeps its spacing and its wall times and sits just before device time now."""
    path = str(tmp_path / "telemetry.db")
    store = TelemetryStore(path, TelemetryConfig(), clock=ManualClock(elapsed=2e9))
    t0 = 1_800_000_000.0
    sample = parse_tegrastats(recorded_lines("orin_nano_jp6.log")[0])
    store.flush([Record(Sample(**{**sample.__dict__, "t": t0 + i})) for i in range(0, 7200, 10)], [])
    store.stop()
    conn = sqlite3.connect(path)  # what edged with schema v2 left: no wall columns, t in wall time
    conn.executescript("ALTER TABLE samples DROP COLUMN wall; ALTER TABLE events DROP COLUMN wall; "
                       "PRAGMA user_version = 2;")
    conn.close()
    TelemetryStore(path, TelemetryConfig(), clock=ManualClock(elapsed=5000.0)).stop()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    newest, oldest, wall = conn.execute("SELECT MAX(t), MIN(t), MAX(wall) FROM samples").fetchone()
    assert newest <= 5000.0 and newest - oldest == 7190 and wall == t0 + 7190
    assert conn.execute("SELECT MIN(bucket) % 3600 FROM rollup_1h").fetchone()[0] in (0, None)
    summary = TelemetryReader(path).summary(3600)
    assert summary["to"] == t0 + 7190 and summary["to_elapsed"] == newest


def test_a_nan_offset_in_clock_json_no_longer_fails_every_telemetry_write(tmp_path):
    """The NaN offset made every sample's key NaN: "NOT NULL constraint failed: samples.t", for good."""
    state = state_file_in(tmp_path)
    state.write_text(f'{{"boot_id": "{read_boot_id()}", "offset": NaN, "last_elapsed": NaN}}', encoding="utf-8")
    config = TelemetryConfig(source="sysfs", sysfs_root=str(SYSFS / "orin_nano_jp6"), interval_s=0.05,
                             flush_interval_s=0.05)
    board = HealthBoard()
    service = TelemetryService(config, str(tmp_path / "t.db"), health=board, clock=DeviceClock(state))
    service.start()
    try:
        assert service.wait_samples(3, timeout=20)
    finally:
        service.stop()
    assert service.snapshot()["store_error"] is None and board.component("telemetry_writer").health.state == "ok"
    rows = sqlite3.connect(tmp_path / "t.db").execute("SELECT COUNT(*), MAX(t) FROM samples").fetchone()
    assert rows[0] >= 3 and math.isfinite(rows[1])


def test_rows_keyed_at_an_infinite_time_are_dropped_when_the_database_opens(tmp_path):
    """Written while clock.json held an infinite offset: the newest row stayed inf for good, retention never
    reached it and every --since window was measured back from it, so no window held a finite row."""
    path = str(tmp_path / "t.db")
    store = TelemetryStore(path, TelemetryConfig())
    line = recorded_lines("orin_nano_jp6.log")[0]
    store.flush([Record(parse_tegrastats(line, t=1_700_000_000.0 + i), elapsed=1_000.0 + i) for i in range(5)], [])
    store.flush([Record(parse_tegrastats(line, t=1_700_000_100.0), elapsed=math.inf)], [])
    store.stop()
    assert TelemetryReader(path).newest() == math.inf
    TelemetryStore(path, TelemetryConfig()).stop()
    reader = TelemetryReader(path)
    assert reader.newest() == 1_004.0
    assert reader.summary(3600)["samples"] == 5
