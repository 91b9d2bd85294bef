"""Rollups and retention, run by the store's writer thread after a flush.

Raw rows become 1-minute aggregates once their minute is complete, 1-minute aggregates become 1-hour ones once
their hour is complete; ``meta`` remembers how far each has gone so that every bucket is aggregated once.
Retention is measured from the newest sample, not the wall clock, so a replayed or clock-jumped history ages
consistently. Raw rows are deleted only once rolled up.
"""

from __future__ import annotations

import math
import sqlite3

from edged.telemetry._db import rollback_quietly
from edged.telemetry._schema import SAMPLE_SERIES

_RAW_TABLES = ("samples", "rails", "temperatures", "engine_loads", "model_stats")


def raw_union(series_ids: dict[str, int], a: str = ":a", b: str = ":b") -> str:
    """Every raw value as (t, name_id, v) with a <= t < b; ``a`` and ``b`` name the query's parameters."""
    parts = [
        f"SELECT t, name_id, now_mw AS v FROM rails WHERE t >= {a} AND t < {b}",
        f"SELECT t, name_id, celsius FROM temperatures WHERE t >= {a} AND t < {b}",
        f"SELECT t, name_id, load_pct FROM engine_loads WHERE load_pct IS NOT NULL AND t >= {a} AND t < {b}",
        f"SELECT t, name_id, inferences / dt_s FROM model_stats WHERE dt_s > 0 AND t >= {a} AND t < {b}",
    ]
    for column in SAMPLE_SERIES:
        parts.append(f"SELECT t, {series_ids[column]}, {column} FROM samples "
                     f"WHERE {column} IS NOT NULL AND t >= {a} AND t < {b}")
    return " UNION ALL ".join(parts)


def _meta(conn: sqlite3.Connection, key: str) -> float | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return float(row[0]) if row else None


def _set_meta(conn: sqlite3.Connection, key: str, value: float) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, repr(value)))


def roll_minutes(conn: sqlite3.Connection, series_ids: dict[str, int], newest: float) -> None:
    end = newest // 60 * 60
    start = _meta(conn, "rolled_1m")
    if start is None:
        first = conn.execute("SELECT MIN(t) FROM samples").fetchone()[0]
        start = first // 60 * 60 if first is not None else end
    if end > start:
        conn.execute(
            "INSERT OR REPLACE INTO rollup_1m (bucket, name_id, min, mean, max, n) "
            "SELECT CAST(t / 60 AS INTEGER) * 60, name_id, MIN(v), AVG(v), MAX(v), COUNT(v) "
            f"FROM ({raw_union(series_ids)}) GROUP BY 1, 2", {"a": start, "b": end})
        conn.execute(
            "INSERT OR REPLACE INTO model_rollup_1m (bucket, name_id, inferences, compute_ns, energy_mj) "
            "SELECT CAST(t / 60 AS INTEGER) * 60, name_id, SUM(inferences), SUM(compute_ns), SUM(energy_mj) "
            "FROM model_stats WHERE t >= ? AND t < ? GROUP BY 1, 2", (start, end))
    _set_meta(conn, "rolled_1m", max(start, end))


def roll_hours(conn: sqlite3.Connection) -> None:
    rolled_1m = _meta(conn, "rolled_1m")
    if rolled_1m is None:
        return
    end = rolled_1m // 3600 * 3600
    start = _meta(conn, "rolled_1h")
    if start is None:
        first = conn.execute("SELECT MIN(bucket) FROM rollup_1m").fetchone()[0]
        start = first // 3600 * 3600 if first is not None else end
    if end > start:
        conn.execute(
            "INSERT OR REPLACE INTO rollup_1h (bucket, name_id, min, mean, max, n) "
            "SELECT bucket / 3600 * 3600, name_id, MIN(min), SUM(mean * n) / SUM(n), MAX(max), SUM(n) "
            "FROM rollup_1m WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2", (start, end))
        conn.execute(
            "INSERT OR REPLACE INTO model_rollup_1h (bucket, name_id, inferences, compute_ns, energy_mj) "
            "SELECT bucket / 3600 * 3600, name_id, SUM(inferences), SUM(compute_ns), SUM(energy_mj) "
            "FROM model_rollup_1m WHERE bucket >= ? AND bucket < ? GROUP BY 1, 2", (start, end))
    _set_meta(conn, "rolled_1h", max(start, end))


def drop_unusable_times(conn: sqlite3.Connection) -> int:
    """Delete rows keyed at an infinite time and forget rollup marks that are not finite; return the rows.

    A clock.json with an infinite offset (refused by `edged.clock` now) keyed rows at inf: the newest row would
    stay inf for good, so retention never reached it, every ``--since`` window was measured back from it, and a
    NaN mark stopped the rollups. A mark forgotten is found again from the oldest row."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        dropped = sum(conn.execute(f"DELETE FROM {table} WHERE t > 1e308 OR t < -1e308").rowcount
                      for table in (*_RAW_TABLES, "events"))
        for key in ("rolled_1m", "rolled_1h"):
            mark = _meta(conn, key)
            if mark is not None and not math.isfinite(mark):
                conn.execute("DELETE FROM meta WHERE key = ?", (key,))
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise
    return dropped


def apply_retention(conn: sqlite3.Connection, newest: float, raw_s: float, minute_s: float,
                    hour_s: float) -> None:
    rolled = _meta(conn, "rolled_1m") or 0.0
    raw_cut = min(newest - raw_s, rolled)
    for table in _RAW_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE t < ?", (raw_cut,))
    for prefix in ("", "model_"):
        conn.execute(f"DELETE FROM {prefix}rollup_1m WHERE bucket < ?", (newest - minute_s,))
        conn.execute(f"DELETE FROM {prefix}rollup_1h WHERE bucket < ?", (newest - hour_s,))
    conn.execute("DELETE FROM events WHERE t < ?", (newest - hour_s,))
