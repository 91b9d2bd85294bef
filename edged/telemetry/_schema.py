"""The telemetry database schema, versioned by ``PRAGMA user_version`` and upgraded by ordered migrations.

Layout: ``samples`` holds one row per sample (scalars); ``rails``, ``temperatures`` and ``engine_loads``
one row per value, keyed by (t, name_id) in WITHOUT ROWID tables so that the key is the only index;
``names`` maps the series names (``power_mw:VDD_IN``, ``temp_c:cpu``, ``engine_load_pct:VIC``,
``model:resnet``, and the scalar columns of ``samples``) to small integers. ``model_stats`` is per-model
inference counts and energy per sample interval, ``events`` throttling, over-temperature, power-mode and
model load/unload. ``rollup_1m`` and ``rollup_1h`` hold min/mean/max/count per series and bucket;
``model_rollup_1m`` and ``model_rollup_1h`` (v2) hold per-model sums (inferences, compute time, energy) per
bucket, so that energy per inference over a day reads aggregates instead of every raw interval.

Time (v3): every ``t`` and ``bucket`` is device elapsed time (`edged.clock.DeviceClock.elapsed`), which never
jumps with the wall clock, so retention and ``--since`` windows age by device life; ``samples.wall`` and
``events.wall`` keep the wall clock of the moment for display and export. Rollup buckets are aligned on elapsed
time. Upgrading a v2 database (whose ``t`` was wall time) moves its whole history by one multiple of an hour so
that its newest row is no later than the elapsed time at the upgrade; the old ``t`` becomes ``wall``.

Space: deleted pages go to SQLite's freelist and are reused by later inserts (auto_vacuum stays NONE, no
VACUUM ever runs): at steady state the file stops growing at its high-water mark.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable

from edged.telemetry._db import rollback_quietly

_V1 = """
CREATE TABLE names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE samples (
    t REAL PRIMARY KEY, ram_used_mb INTEGER, ram_total_mb INTEGER, swap_used_mb INTEGER,
    swap_total_mb INTEGER, cpu_load_pct REAL, cpu_json TEXT, gpu_load_pct INTEGER, gpu_freq_mhz INTEGER,
    emc_load_pct INTEGER, emc_freq_mhz INTEGER, power_in_mw INTEGER
) WITHOUT ROWID;
CREATE TABLE rails (t REAL, name_id INTEGER, now_mw INTEGER, avg_mw INTEGER,
    PRIMARY KEY (t, name_id)) WITHOUT ROWID;
CREATE TABLE temperatures (t REAL, name_id INTEGER, celsius REAL, PRIMARY KEY (t, name_id)) WITHOUT ROWID;
CREATE TABLE engine_loads (t REAL, name_id INTEGER, on_ INTEGER, load_pct INTEGER, freq_mhz INTEGER,
    PRIMARY KEY (t, name_id)) WITHOUT ROWID;
CREATE TABLE model_stats (t REAL, name_id INTEGER, dt_s REAL, inferences INTEGER, compute_ns INTEGER,
    energy_mj REAL, PRIMARY KEY (t, name_id)) WITHOUT ROWID;
CREATE TABLE events (id INTEGER PRIMARY KEY, t REAL NOT NULL, kind TEXT NOT NULL, subject TEXT,
    value REAL, detail TEXT);
CREATE INDEX events_t ON events (t);
CREATE TABLE rollup_1m (bucket INTEGER, name_id INTEGER, min REAL, mean REAL, max REAL, n INTEGER,
    PRIMARY KEY (bucket, name_id)) WITHOUT ROWID;
CREATE TABLE rollup_1h (bucket INTEGER, name_id INTEGER, min REAL, mean REAL, max REAL, n INTEGER,
    PRIMARY KEY (bucket, name_id)) WITHOUT ROWID;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
"""


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would commit the migration's transaction first; run statement by statement instead.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _v1(conn: sqlite3.Connection, elapsed_now: float) -> None:
    _run_script(conn, _V1)


_V2 = """
CREATE TABLE model_rollup_1m (bucket INTEGER, name_id INTEGER, inferences INTEGER, compute_ns INTEGER,
    energy_mj REAL, PRIMARY KEY (bucket, name_id)) WITHOUT ROWID;
CREATE TABLE model_rollup_1h (bucket INTEGER, name_id INTEGER, inferences INTEGER, compute_ns INTEGER,
    energy_mj REAL, PRIMARY KEY (bucket, name_id)) WITHOUT ROWID;
INSERT INTO model_rollup_1m
    SELECT CAST(t / 60 AS INTEGER) * 60, name_id, SUM(inferences), SUM(compute_ns), SUM(energy_mj)
    FROM model_stats WHERE t < (SELECT CAST(value AS REAL) FROM meta WHERE key = 'rolled_1m') GROUP BY 1, 2;
INSERT INTO model_rollup_1h
    SELECT bucket / 3600 * 3600, name_id, SUM(inferences), SUM(compute_ns), SUM(energy_mj)
    FROM model_rollup_1m WHERE bucket < (SELECT CAST(value AS REAL) FROM meta WHERE key = 'rolled_1h') GROUP BY 1, 2
"""


def _v2(conn: sqlite3.Connection, elapsed_now: float) -> None:
    # Backfill from the raw intervals a v1 database still holds (its raw retention, a day by default). Older
    # energy is gone, so the oldest backfilled bucket may hold only its tail: the same sum the raw rows gave.
    _run_script(conn, _V2)


_KEYED_BY_T = ("samples", "rails", "temperatures", "engine_loads", "model_stats")
_KEYED_BY_BUCKET = ("rollup_1m", "rollup_1h", "model_rollup_1m", "model_rollup_1h")
_NEWEST = ("SELECT MAX(x) FROM (SELECT MAX(t) AS x FROM samples UNION ALL SELECT MAX(t) FROM events "
           "UNION ALL SELECT MAX(bucket) + 60 FROM rollup_1m UNION ALL SELECT MAX(bucket) + 3600 FROM rollup_1h)")


def _shift_keys(conn: sqlite3.Connection, table: str, column: str, shift: float) -> None:
    # Through a copy: an in-place UPDATE of a primary key can collide with a row not moved yet.
    conn.execute(f"CREATE TEMP TABLE _moving AS SELECT * FROM {table}")
    conn.execute(f"DELETE FROM {table}")
    conn.execute(f"UPDATE _moving SET {column} = {column} - ?", (shift,))
    conn.execute(f"INSERT INTO {table} SELECT * FROM _moving")
    conn.execute("DROP TABLE _moving")


def _v3(conn: sqlite3.Connection, elapsed_now: float) -> None:
    conn.execute("ALTER TABLE samples ADD COLUMN wall REAL")
    conn.execute("ALTER TABLE events ADD COLUMN wall REAL")
    conn.execute("UPDATE samples SET wall = t")
    conn.execute("UPDATE events SET wall = t")
    newest = conn.execute(_NEWEST).fetchone()[0]
    if newest is None or newest <= elapsed_now:
        return  # nothing recorded ahead of device life: the history ages from where it is
    shift = math.ceil((newest - elapsed_now) / 3600) * 3600.0  # whole hours keep the rollup buckets aligned
    for table in _KEYED_BY_T:
        _shift_keys(conn, table, "t", shift)
    for table in _KEYED_BY_BUCKET:
        _shift_keys(conn, table, "bucket", shift)
    conn.execute("UPDATE events SET t = t - ?", (shift,))
    conn.execute("UPDATE meta SET value = CAST(CAST(value AS REAL) - ? AS TEXT) "
                 "WHERE key IN ('rolled_1m', 'rolled_1h')", (shift,))


# Index i upgrades user_version i to i + 1. Append, never edit a released step.
MIGRATIONS: tuple[Callable[[sqlite3.Connection, float], None], ...] = (_v1, _v2, _v3)
SCHEMA_VERSION = len(MIGRATIONS)

# Scalar columns of `samples` that are rolled up, under their series names.
SAMPLE_SERIES = ("gpu_load_pct", "cpu_load_pct", "emc_load_pct", "ram_used_mb", "power_in_mw")


def migrate(conn: sqlite3.Connection, elapsed_now: float) -> int:
    """Bring the schema to SCHEMA_VERSION, one transaction per step; return the version found.
    ``elapsed_now`` is the device clock's elapsed time, for the step that re-keys wall time (v3)."""
    found: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        from edged.errors import TelemetryError
        raise TelemetryError(f"telemetry database schema is version {found}, newer than this edged "
                             f"({SCHEMA_VERSION}); upgrade edged or point [telemetry] database elsewhere")
    for version in range(found, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](conn, elapsed_now)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise
    return found
