"""Read side of the telemetry database, for the CLI: summaries, series, exports. Never blocks the writer (WAL).

Windows are measured back from the newest sample in the database, so a copied or replayed database answers
the same way as a live one. The finest table that still covers the window is used: raw rows, then the
1-minute, then the 1-hour rollups.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.config import TelemetryConfig
from edged.errors import TelemetryError
from edged.telemetry._rollup import raw_union
from edged.telemetry._schema import SAMPLE_SERIES
from edged.telemetry._store import connect

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90s', '30m', '6h', '2d', '1w' (a bare number is seconds)."""
    m = _DURATION.match(text)
    if not m:
        raise TelemetryError(f"expected a duration such as 30m, 6h or 2d, found {text!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True)
class Point:
    t: float
    series: str
    mean: float
    min: float
    max: float


class TelemetryReader:
    def __init__(self, path: str, config: TelemetryConfig | None = None) -> None:
        if not Path(path).is_file():
            raise TelemetryError(f"no telemetry database at {path} (is the daemon running with telemetry on?)")
        self._conn = connect(path, readonly=True)
        self._config = config or TelemetryConfig()

    def close(self) -> None:
        self._conn.close()

    def _one(self, sql: str, *args: object) -> Any:
        try:
            row = self._conn.execute(sql, args).fetchone()
        except sqlite3.Error as e:
            raise TelemetryError(f"cannot read the telemetry database: {e}") from e
        return row[0] if row else None

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
        if table == "raw":
            sql = (f"SELECT r.t, n.name, r.v, r.v, r.v FROM ({raw_union(ids)}) r JOIN names n ON n.id = r.name_id"
                   " WHERE n.name LIKE :like ORDER BY r.t")
            args: dict[str, object] = {"a": start, "b": newest + 1, "like": series_like}
        else:
            sql = (f"SELECT r.bucket, n.name, r.mean, r.min, r.max FROM {table} r JOIN names n ON n.id = r.name_id"
                   " WHERE r.bucket >= :a AND n.name LIKE :like ORDER BY r.bucket")
            args = {"a": start, "like": series_like}
        missing = [s for s in SAMPLE_SERIES if s not in ids]
        if missing:  # an empty database: nothing was ever written
            return []
        return [Point(float(t), name, float(mean), float(lo), float(hi))
                for t, name, mean, lo, hi in self._conn.execute(sql, args)]

    def summary(self, since_s: float) -> dict[str, Any]:
        """Per-series min/mean/max over the window, event counts, energy per inference per model."""
        newest = self.newest()
        if newest is None:
            return {"samples": 0, "series": {}, "events": {}, "energy_per_inference_mj": {}}
        start = newest - since_s
        table = "rollup_1h" if since_s > self._config.minute_retention_s else "rollup_1m"
        names = dict(self._conn.execute("SELECT id, name FROM names").fetchall())
        series = {
            names[i]: {"min": lo, "mean": mean, "max": hi, "n": n}
            for i, lo, mean, hi, n in self._conn.execute(
                f"SELECT name_id, MIN(min), SUM(mean * n) / SUM(n), MAX(max), SUM(n) FROM {table} "
                "WHERE bucket >= ? GROUP BY name_id", (start,))}
        events = dict(self._conn.execute(
            "SELECT kind, COUNT(*) FROM events WHERE t >= ? GROUP BY kind", (start,)).fetchall())
        energy = {
            names[i].removeprefix("model:"): e / c
            for i, e, c in self._conn.execute(
                "SELECT name_id, SUM(energy_mj), SUM(inferences) FROM model_stats WHERE t >= ? "
                "GROUP BY name_id", (start,)) if c}
        return {"from": start, "to": newest, "samples": self._one(
            "SELECT COUNT(*) FROM samples WHERE t >= ?", start), "series": series, "events": events,
            "energy_per_inference_mj": energy}

    def events(self, since_s: float) -> list[dict[str, Any]]:
        newest = self.newest() or 0.0
        cur = self._conn.execute("SELECT t, kind, subject, value, detail FROM events WHERE t >= ? ORDER BY t",
                                 (newest - since_s,))
        return [dict(zip(("t", "kind", "subject", "value", "detail"), row, strict=True)) for row in cur]
