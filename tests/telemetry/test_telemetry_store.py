"""The SQLite store: migrations, rollups, retention, readers beside the writer, and SIGKILL during writes."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from sqlite_faults import flaky_sqlite

from edged.clock import ManualClock
from edged.config import TelemetryConfig
from edged.telemetry import Rail, Sample, TelemetryReader
from edged.telemetry._derived import ModelInterval
from edged.telemetry._query import Window, split_window
from edged.telemetry._schema import SCHEMA_VERSION
from edged.telemetry._store import Record, TelemetryStore


def sample(t: float, gpu: int, temp: float = 40.0, vdd_in: int = 5000) -> Sample:
    return Sample(t=t, ram_used_mb=1000, ram_total_mb=8000, gpu_load_pct=gpu, temps_c={"cpu": temp},
                  power_mw={"VDD_IN": Rail(vdd_in, vdd_in)})


def test_a_new_database_is_migrated_to_the_current_schema(tmp_path):
    store = TelemetryStore(str(tmp_path / "t.db"), TelemetryConfig())
    store.stop()
    conn = sqlite3.connect(tmp_path / "t.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"samples", "rails", "temperatures", "engine_loads", "model_stats", "events", "rollup_1m",
            "rollup_1h", "names"} <= tables
    TelemetryStore(str(tmp_path / "t.db"), TelemetryConfig()).stop()  # reopening does not migrate again


def test_minute_and_hour_rollups_keep_min_mean_max(tmp_path):
    path = str(tmp_path / "t.db")
    store = TelemetryStore(path, TelemetryConfig())
    t0 = 1_800_000_000.0  # a multiple of 3600
    # two hours at 1 Hz; minute m has GPU loads m % 10 + (0, 1, 2, ...)
    records = [Record(sample(t0 + i, gpu=(i // 60) % 10 + i % 3), power_in_mw=5000) for i in range(7201)]
    for i in range(0, len(records), 500):
        store.flush(records[i:i + 500], [])
    store.stop()
    conn = sqlite3.connect(path)
    gpu_id = conn.execute("SELECT id FROM names WHERE name = 'gpu_load_pct'").fetchone()[0]
    row = conn.execute("SELECT min, mean, max, n FROM rollup_1m WHERE bucket = ? AND name_id = ?",
                       (t0 + 60 * 7, gpu_id)).fetchone()
    assert row == (7.0, 8.0, 9.0, 60)
    hours = conn.execute("SELECT bucket, min, max, n FROM rollup_1h WHERE name_id = ? ORDER BY bucket",
                         (gpu_id,)).fetchall()
    assert hours == [(t0, 0.0, 11.0, 3600), (t0 + 3600, 0.0, 11.0, 3600)]
    summary = TelemetryReader(path).summary(3600 * 3)
    assert summary["series"]["power_mw:VDD_IN"]["mean"] == 5000.0
    assert summary["series"]["temp_c:cpu"]["n"] == 7201  # whole hours, then the raw sample not rolled up yet


def _day_with_models(path: str, seconds: int = 3 * 3600 + 1234) -> float:
    """Samples at 1 Hz with two models whose energy varies per interval; returns the first timestamp."""
    store = TelemetryStore(path, TelemetryConfig())
    t0 = 1_800_000_000.0 + 17.5  # not on a minute boundary
    records = [Record(sample(t0 + i, gpu=i % 7, temp=40 + i % 11, vdd_in=4000 + i % 997), power_in_mw=5000,
                      models=(ModelInterval("digits", 1.0, 1 + i % 3, 1000, 0.5 + i % 5),
                              ModelInterval("yolo", 1.0, i % 2, 9000, 3.0 * (i % 2))))
               for i in range(seconds)]
    for i in range(0, len(records), 500):
        store.flush(records[i:i + 500], [])
    store.stop()
    return t0


def _from_raw_rows(path: str, start: float) -> tuple[dict[str, float], dict[str, tuple[float, float, float]]]:
    conn = sqlite3.connect(path)
    energy = {name.removeprefix("model:"): e / n for name, e, n in conn.execute(
        "SELECT n.name, SUM(energy_mj), SUM(inferences) FROM model_stats m JOIN names n ON n.id = m.name_id "
        "WHERE t >= ? GROUP BY n.name", (start,))}
    temps = conn.execute("SELECT MIN(celsius), AVG(celsius), MAX(celsius), COUNT(*) FROM temperatures WHERE t >= ?",
                         (start,)).fetchone()
    power = conn.execute("SELECT MIN(now_mw), AVG(now_mw), MAX(now_mw), COUNT(*) FROM rails WHERE t >= ?",
                         (start,)).fetchone()
    return energy, {"temp_c:cpu": temps, "power_mw:VDD_IN": power}


@pytest.mark.parametrize("since_s", [50, 3000, 2 * 3600 + 77, 24 * 3600])
def test_summary_from_rollups_equals_the_raw_rows_over_any_window(tmp_path, since_s):
    path = str(tmp_path / "t.db")
    _day_with_models(path)
    summary = TelemetryReader(path).summary(since_s)
    energy, series = _from_raw_rows(path, summary["from"])
    assert summary["energy_per_inference_mj"] == pytest.approx(energy, rel=1e-12)
    for name, (lo, mean, hi, n) in series.items():
        got = summary["series"][name]
        assert (got["min"], got["max"], got["n"]) == (lo, hi, n)
        assert got["mean"] == pytest.approx(mean, rel=1e-12)


def test_a_day_is_read_from_hour_rollups_and_raw_rows_only_at_the_edges():
    w = split_window(start=1000.5, rolled_1m=90_000.0, rolled_1h=86_400.0)
    assert w == Window(raw=((1000.5, 1020.0), (90_000.0, float("inf"))),
                       minutes=((1020.0, 3600.0), (86_400.0, 90_000.0)), hours=((3600.0, 86_400.0),))
    assert split_window(1000.5, None, None).raw == ((1000.5, float("inf")),)  # nothing rolled up yet
    assert split_window(1000.5, 5000.0, None).minutes == ((1020.0, 5000.0),)


def test_a_v1_database_migrates_and_keeps_answering_energy_per_inference(tmp_path):
    path = str(tmp_path / "t.db")
    t0 = _day_with_models(path)
    conn = sqlite3.connect(path)  # what edged with schema v1 left behind: no model rollups
    conn.executescript("DROP TABLE model_rollup_1m; DROP TABLE model_rollup_1h; ALTER TABLE samples DROP COLUMN "
                       "wall; ALTER TABLE events DROP COLUMN wall; PRAGMA user_version = 1;")
    conn.close()
    before = TelemetryReader(path).summary(24 * 3600)  # a reader never migrates: it falls back to raw rows
    # a device clock already past the history: the v3 step keeps every time where it is
    TelemetryStore(path, TelemetryConfig(), clock=ManualClock(elapsed=t0 + 10 * 86400)).stop()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT MIN(bucket) FROM model_rollup_1m").fetchone()[0] == t0 - 17.5
    assert conn.execute("SELECT MIN(bucket) FROM model_rollup_1h").fetchone()[0] == t0 - 17.5
    after = TelemetryReader(path).summary(24 * 3600)
    assert after["energy_per_inference_mj"] == pytest.approx(before["energy_per_inference_mj"], rel=1e-12)


def test_raw_rows_older_than_the_window_are_deleted_after_rollup(tmp_path):
    path = str(tmp_path / "t.db")
    store = TelemetryStore(path, TelemetryConfig(raw_retention_s=600))
    t0 = 1_800_000_000.0
    records = [Record(sample(t0 + i, gpu=1)) for i in range(1800)]
    for i in range(0, 1800, 300):
        store.flush(records[i:i + 300], [])
    store.stop()
    conn = sqlite3.connect(path)
    oldest = conn.execute("SELECT MIN(t) FROM samples").fetchone()[0]
    assert oldest >= t0 + 1799 - 600 - 60
    assert conn.execute("SELECT MIN(t) FROM rails").fetchone()[0] >= oldest
    assert conn.execute("SELECT MIN(bucket) FROM rollup_1m").fetchone()[0] == t0  # aggregates outlive raw


def test_readers_are_not_blocked_while_the_writer_holds_a_transaction(tmp_path):
    path = str(tmp_path / "t.db")
    store = TelemetryStore(path, TelemetryConfig())
    store.flush([Record(sample(1_800_000_000.0 + i, gpu=5)) for i in range(120)], [])
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM samples")
    try:
        reader = TelemetryReader(path)
        assert len(reader.points(3600, "gpu_load_pct")) == 120  # sees the last committed state at once
    finally:
        writer.execute("ROLLBACK")
        store.stop()


_WRITER = textwrap.dedent("""
    import sys
    from edged.config import TelemetryConfig
    from edged.telemetry import Rail, Sample
    from edged.telemetry._store import Record, TelemetryStore
    path, start = sys.argv[1], int(sys.argv[2])
    store = TelemetryStore(path, TelemetryConfig(batch_size=50, flush_interval_s=60),
                           on_flush=lambda n: print(start + n, flush=True))
    store.start()
    for i in range(start, start + 10**7):
        s = Sample(t=1_800_000_000.0 + i, ram_used_mb=1, ram_total_mb=2, gpu_load_pct=i % 100,
                   temps_c={"cpu": 40.0, "gpu": 41.0}, power_mw={"VDD_IN": Rail(i % 9000, None)})
        store.put(Record(s, power_in_mw=i % 9000))
""")


@pytest.mark.slow
def test_sigkill_during_writes_never_corrupts_and_loses_at_most_the_unflushed_batch(tmp_path):
    path = str(tmp_path / "t.db")
    rng = random.Random(7)
    acknowledged = 0
    for _ in range(12):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(acknowledged)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        for _ in range(rng.randint(1, 6)):  # wait for a few committed batches, then kill mid-stream
            line = child.stdout.readline()
            assert line, "the writer died on its own"
            acknowledged = int(line)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        conn.close()
        assert stored >= acknowledged  # nothing committed was lost
        acknowledged = stored  # the next writer continues after what survived


def test_a_name_inserted_by_a_rolled_back_batch_is_not_reused_for_another_model(tmp_path):
    """The id of ``model:a`` from a failed batch was cached; the next new name got the same id, and a's later
    rows were filed under ``model:b``."""
    path = str(tmp_path / "t.db")
    with flaky_sqlite(fail_on="INTO model_stats"):
        store = TelemetryStore(path, TelemetryConfig())

    def record(t: float, model: str) -> Record:
        return Record(sample(t, gpu=10), power_in_mw=5000, models=(ModelInterval(model, 1.0, 2, 1000, 50.0),))

    with pytest.raises(sqlite3.OperationalError):
        store.flush([record(1.0, "a")], [])  # rolled back, with the names row it inserted
    store.flush([record(2.0, "b")], [])
    store.flush([record(3.0, "a")], [])
    store.stop()
    rows = sqlite3.connect(path).execute(
        "SELECT m.t, n.name FROM model_stats m JOIN names n ON n.id = m.name_id ORDER BY m.t").fetchall()
    assert rows == [(2.0, "model:b"), (3.0, "model:a")]
