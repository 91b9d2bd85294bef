"""Read side of the telemetry database, for the CLI: summaries, series, exports. Never blocks the writer (WAL).

Windows are measured back from the newest sample in the database, so a copied or replayed database answers
the same way as a live one, in device elapsed time (schema v3, see `edged.clock`): ``--since 1h`` is the last
hour of device life whatever the wall clock did meanwhile. Times shown are wall times: a raw row's own, a
rollup bucket's mapped through the newest sample's wall/elapsed pair.

``points`` uses the finest table that still covers the window: raw rows, then the
1-minute, then the 1-hour rollups. ``summary`` is exact over the window: whole hours come from the 1-hour
rollups, whole minutes from the 1-minute ones, and only the partial minute at the start and what is not yet
rolled up at the end from raw rows (see `split_window`); so a day costs about a hundred rows per series.

This module is the read path of a short-lived command: it imports neither the config package nor the writer.
"""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.errors import TelemetryError
from edged.telemetry._db import connect
from edged.telemetry._rollup import raw_union
from edged.telemetry._schema import SAMPLE_SERIES

if TYPE_CHECKING:
    from edged.config import TelemetryConfig

Range = tuple[float, float]  # [start, end)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


_MAX_DURATION_S = 100 * 365.25 * 86400  # longer than any device lives; far inside what datetime can show


def parse_duration(text: str) -> float:
    """'90s', '30m', '6h', '2d', '1w' (a bare number is seconds), up to 100 years."""
    m = _DURATION.match(text)
    if not m:
        raise TelemetryError(f"expected a duration such as 30m, 6h or 2d, found {text!r}")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not seconds <= _MAX_DURATION_S:  # a window before year 1 or past time_t raised OverflowError when shown
        raise TelemetryError(f"expected a duration of at most 100 years (5218w), found {text!r}")
    return seconds


@dataclass(frozen=True)
class Window:
    """Where each part of a window [start, newest] is read from; every range is half-open."""

    raw: tuple[Range, ...]
    minutes: tuple[Range, ...]
    hours: tuple[Range, ...]


def split_window(start: float, rolled_1m: float | None, rolled_1h: float | None) -> Window:
    """Cover [start, +inf) with whole hours below ``rolled_1h``, whole minutes below ``rolled_1m``, raw rows
    elsewhere (the partial first minute, and everything not rolled up yet)."""
    m0, h0 = math.ceil(start / 60) * 60.0, math.ceil(start / 3600) * 3600.0
    if rolled_1m is None or rolled_1m <= m0:
        return Window(raw=((start, math.inf),), minutes=(), hours=())
    raw = ((start, m0), (rolled_1m, math.inf))
    if rolled_1h is None or rolled_1h <= h0:
        return Window(raw=raw, minutes=((m0, rolled_1m),), hours=())
    return Window(raw=raw, minutes=((m0, h0), (rolled_1h, rolled_1m)), hours=((h0, rolled_1h),))


def _params(prefix: str, ranges: tuple[Range, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, (a, b) in enumerate(ranges):
        out[f"{prefix}a{i}"], out[f"{prefix}b{i}"] = a, (b if b != math.inf else 1e300)
    return out


def _bucket_parts(table: str, columns: str, prefix: str, ranges: tuple[Range, ...]) -> list[str]:
    return [f"SELECT {columns} FROM {table} WHERE bucket >= :{prefix}a{i} AND bucket < :{prefix}b{i}"
            for i in range(len(ranges))]


@dataclass(frozen=True)
class Point:
    t: float  # wall time, for display
    series: str
    mean: float
    min: float
    max: float
    elapsed: float  # device elapsed time: the key the window is measured in


class TelemetryReader:
    def __init__(self, path: str, config: TelemetryConfig | None = None) -> None:
        if not Path(path).is_file():
            raise TelemetryError(f"no telemetry database at {path} (is the daemon running with telemetry on?)")
        self._conn = connect(path, readonly=True)
        self._given_config = config
        if self._one("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('samples', 'names')") < 2:
            self._conn.close()
            raise TelemetryError(f"{path} is not an edged telemetry database (it has no samples table): point --db "
                                 "at <state dir>/telemetry.db, which the daemon writes")

    @property
    def _config(self) -> TelemetryConfig:
        # Only points() needs the retention settings; the summary does not pay for importing the config.
        if self._given_config is None:
            from edged.config import TelemetryConfig

            self._given_config = TelemetryConfig()
        return self._given_config

    def close(self) -> None:
        self._conn.close()

    def _one(self, sql: str, *args: object) -> Any:
        try:
            row = self._conn.execute(sql, args).fetchone()
        except sqlite3.Error as e:
            raise TelemetryError(f"cannot read the telemetry database: {e}") from e
        return row[0] if row else None

    def wall_offset(self) -> float:
        """Wall minus elapsed time at the newest sample: maps a rollup bucket to a time to show."""
        if self._one("PRAGMA user_version") < 3:
            return 0.0  # not upgraded yet: t is still wall time
        offset = self._one("SELECT wall - t FROM samples WHERE wall IS NOT NULL ORDER BY t DESC LIMIT 1")
        return float(offset) if offset is not None else 0.0

    def newest(self) -> float | None:
        t = self._one("SELECT MAX(t) FROM samples")
        if t is None:
            t = self._one("SELECT MAX(bucket) + 60 FROM rollup_1m")
        return float(t) if t is not None else None

    def _table_for(self, since_s: float) -> str:
        return "raw" if since_s <= self._config.raw_retention_s else self.rollup_for(since_s)

    def rollup_for(self, since_s: float) -> str:
        """The finest rollup table that covers a window."""
        return "rollup_1m" if since_s <= self._config.minute_retention_s else "rollup_1h"

    def points(self, since_s: float, series_like: str = "%", table: str | None = None) -> list[Point]:
        newest = self.newest()
        if newest is None:
            return []
        start, table = newest - since_s, table or self._table_for(since_s)
        ids = {name: i for i, name in self._conn.execute("SELECT id, name FROM names")}
        offset = self.wall_offset()
        if table == "raw":
            wall = "s.wall" if self._one("PRAGMA user_version") >= 3 else "NULL"
            sql = (f"SELECT r.t, COALESCE({wall}, r.t + :off), n.name, r.v, r.v, r.v FROM ({raw_union(ids)}) r "
                   "JOIN names n ON n.id = r.name_id LEFT JOIN samples s ON s.t = r.t "
                   "WHERE n.name LIKE :like ORDER BY r.t")
            args: dict[str, object] = {"a": start, "b": newest + 1, "like": series_like, "off": offset}
        else:
            sql = (f"SELECT r.bucket, r.bucket + :off, n.name, r.mean, r.min, r.max FROM {table} r "
                   "JOIN names n ON n.id = r.name_id WHERE r.bucket >= :a AND n.name LIKE :like ORDER BY r.bucket")
            args = {"a": start, "like": series_like, "off": offset}
        missing = [s for s in SAMPLE_SERIES if s not in ids]
        if missing:  # an empty database: nothing was ever written
            return []
        return [Point(float(wall), name, float(mean), float(lo), float(hi), float(t))
                for t, wall, name, mean, lo, hi in self._conn.execute(sql, args)]

    def _meta(self, key: str) -> float | None:
        value = self._one("SELECT value FROM meta WHERE key = ?", key)
        return float(value) if value is not None else None

    def window(self, start: float) -> Window:
        return split_window(start, self._meta("rolled_1m"), self._meta("rolled_1h"))

    def _rows(self, sql: str, args: dict[str, float]) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise TelemetryError(f"cannot read the telemetry database: {e}") from e

    def _series(self, w: Window, ids: dict[str, int]) -> list[Any]:
        raw = " UNION ALL ".join(raw_union(ids, f":ra{i}", f":rb{i}") for i in range(len(w.raw)))
        parts = [f"SELECT name_id, MIN(v) AS lo, SUM(v) AS s, MAX(v) AS hi, COUNT(v) AS n FROM ({raw}) "
                 "GROUP BY name_id",
                 *_bucket_parts("rollup_1m", "name_id, min, mean * n, max, n", "m", w.minutes),
                 *_bucket_parts("rollup_1h", "name_id, min, mean * n, max, n", "h", w.hours)]
        sql = (f"SELECT name_id, MIN(lo), SUM(s) / SUM(n), MAX(hi), SUM(n) FROM ({' UNION ALL '.join(parts)}) "
               "GROUP BY name_id HAVING SUM(n) > 0")
        return self._rows(sql, {**_params("r", w.raw), **_params("m", w.minutes), **_params("h", w.hours)})

    def _energy(self, w: Window) -> list[Any]:
        sums = "name_id, energy_mj, inferences"
        parts = [f"SELECT {sums} FROM model_stats WHERE t >= :ra{i} AND t < :rb{i}" for i in range(len(w.raw))]
        parts += _bucket_parts("model_rollup_1m", sums, "m", w.minutes)
        parts += _bucket_parts("model_rollup_1h", sums, "h", w.hours)
        # Inferences of an interval (or bucket) without a power reading have a NULL energy: not in the ratio.
        sql = (f"SELECT name_id, SUM(energy_mj), SUM(CASE WHEN energy_mj IS NOT NULL THEN inferences END) "
               f"FROM ({' UNION ALL '.join(parts)}) GROUP BY name_id")
        return self._rows(sql, {**_params("r", w.raw), **_params("m", w.minutes), **_params("h", w.hours)})

    def summary(self, since_s: float) -> dict[str, Any]:
        """Per-series min/mean/max over the window, event counts, energy per inference per model."""
        newest = self.newest()
        if newest is None:
            return {"samples": 0, "series": {}, "events": {}, "energy_per_inference_mj": {}}
        start = newest - since_s
        names = dict(self._rows("SELECT id, name FROM names", {}))
        ids = {name: i for i, name in names.items()}
        if any(s not in ids for s in SAMPLE_SERIES):  # samples without the store's names: not ours
            raise TelemetryError(f"telemetry database lacks the series names {SAMPLE_SERIES}")
        w = self.window(start)
        series = {names[i]: {"min": lo, "mean": mean, "max": hi, "n": n}
                  for i, lo, mean, hi, n in self._series(w, ids)}
        events = dict(self._conn.execute(
            "SELECT kind, COUNT(*) FROM events WHERE t >= ? GROUP BY kind", (start,)).fetchall())
        # A v1 database (the daemon has not run this edged yet; readers never migrate) has no model rollups.
        legacy = self._one("PRAGMA user_version") < 2
        energy_w = Window(raw=((start, math.inf),), minutes=(), hours=()) if legacy else w
        energy = {names[i].removeprefix("model:"): e / c for i, e, c in self._energy(energy_w)
                  if c and e is not None}
        offset = self.wall_offset()
        first = self._first_at_or_after(start)
        return {"from": start + offset, "to": newest + offset, "from_elapsed": start, "to_elapsed": newest,
                "first": first + offset, "first_elapsed": first,
                "samples": self._one(
            "SELECT COUNT(*) FROM samples WHERE t >= ?", start), "series": series, "events": events,
            "energy_per_inference_mj": energy}

    def _first_at_or_after(self, start: float) -> float:
        """The oldest data of the window [start, newest]: its oldest raw sample; where raw rows are gone
        (retention), the oldest minute bucket that ended before them; before those, the oldest hour bucket."""
        first: float | None = self._one("SELECT MIN(t) FROM samples WHERE t >= ?", start)
        for table, width in (("rollup_1m", 60), ("rollup_1h", 3600)):
            older = self._one(f"SELECT MIN(bucket) FROM {table} WHERE bucket >= ? AND bucket + ? <= ?",
                              start, width, first if first is not None else 1e300)
            first = older if older is not None else first
        return float(first) if first is not None else start

    def events(self, since_s: float) -> list[dict[str, Any]]:
        """Events of the window: ``t`` is the wall time recorded with each, ``elapsed`` the device time."""
        newest = self.newest() or 0.0
        wall = "COALESCE(wall, t)" if self._one("PRAGMA user_version") >= 3 else "t"
        cur = self._conn.execute(f"SELECT {wall}, t, kind, subject, value, detail FROM events WHERE t >= ? "
                                 "ORDER BY t", (newest - since_s,))
        return [dict(zip(("t", "elapsed", "kind", "subject", "value", "detail"), row, strict=True)) for row in cur]
