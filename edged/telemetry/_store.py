"""The SQLite store: one writer thread, batched transactions, WAL so that readers are never blocked.

Time: a record is keyed by its device elapsed time (``Record.elapsed``, see `edged.clock`), which ages the
rollups and retention; its wall time is kept beside it for display. A record without one (a history built by a
tool, a test) is keyed by its sample's time.

Durability: WAL with ``synchronous=NORMAL``. A killed process (SIGKILL) loses nothing that was committed and
never corrupts the file; what it loses is the batch still in memory (at most ``batch_size`` samples or
``flush_interval_s`` of them). A power cut may also lose the last committed transactions, never consistency.

Bad values: a record with a number SQLite cannot hold (beyond 64 bits) is skipped and counted (``rejected``),
never allowed to fail its batch. A failed write (a full disk) is reported with SQLite's own reason, and the WAL
is then checkpointed and truncated so that the space it holds comes back (see `edged.telemetry._db`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edged.clock import Clock, DeviceClock
from edged.config import TelemetryConfig
from edged.errors import TelemetryError
from edged.supervision import HealthBoard, SupervisedThread
from edged.telemetry._db import connect, open_failure, rollback_quietly
from edged.telemetry._derived import Event, ModelInterval
from edged.telemetry._rollup import apply_retention, drop_unusable_times, roll_hours, roll_minutes
from edged.telemetry._sample import Sample
from edged.telemetry._schema import SAMPLE_SERIES, migrate

log = logging.getLogger(__name__)
_STOP = object()
_INT64 = (-(2**63), 2**63 - 1)
_SQLITE_FULL = 13  # "database or disk is full" (sqlite3 names the constant only from Python 3.11)


@dataclass(frozen=True)
class Record:
    sample: Sample
    power_in_mw: int | None = None
    models: tuple[ModelInterval, ...] = ()
    events: tuple[Event, ...] = ()
    elapsed: float | None = None  # device elapsed time when sampled (the key); None: sample.t
    wall: float | None = None  # wall clock when sampled, for display; None: sample.t

    @property
    def key(self) -> float:
        return self.elapsed if self.elapsed is not None else self.sample.t


@dataclass
class _Names:
    """Series name -> id in ``names``. An id inserted inside a transaction stays ``pending`` until it commits:
    a rolled-back insert frees its id for the next new name, and a cached one would file rows under that one."""

    conn: sqlite3.Connection
    ids: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)

    def __call__(self, name: str) -> int:
        known = self.ids.get(name, self.pending.get(name))
        if known is not None:
            return known
        self.conn.execute("INSERT OR IGNORE INTO names (name) VALUES (?)", (name,))
        found: int = self.conn.execute("SELECT id FROM names WHERE name = ?", (name,)).fetchone()[0]
        if self.conn.in_transaction:
            self.pending[name] = found
        else:
            self.ids[name] = found
        return found

    def committed(self) -> None:
        self.ids.update(self.pending)
        self.pending.clear()

    def rolled_back(self) -> None:
        self.pending.clear()


_Rows = dict[str, list[tuple[object, ...]]]


def _record_rows(r: Record, nid: _Names) -> _Rows:
    s, t = r.sample, r.key
    cpu = json.dumps([[c.load_pct, c.freq_mhz] for c in s.cpu], separators=(",", ":"))
    return {
        "samples": [(t, s.ram_used_mb, s.ram_total_mb, s.swap_used_mb, s.swap_total_mb, s.cpu_mean_load(), cpu,
                     s.gpu_load_pct, s.gpu_freq_mhz, s.emc_load_pct, s.emc_freq_mhz, r.power_in_mw,
                     r.wall if r.wall is not None else s.t)],
        "rails": [(t, nid(f"power_mw:{k}"), v.now_mw, v.avg_mw) for k, v in s.power_mw.items()],
        "temps": [(t, nid(f"temp_c:{k}"), v) for k, v in s.temps_c.items()],
        "engines": [(t, nid(f"engine_load_pct:{k}"), int(e.on), e.load_pct, e.freq_mhz)
                    for k, e in s.engines.items()],
        "models": [(t, nid(f"model:{m.model}"), m.dt_s, m.inferences, m.compute_ns, m.energy_mj)
                   for m in r.models],
    }


def _storable(rows: _Rows) -> bool:
    """Whether every integer fits SQLite's 64 bits (a bigger one raises OverflowError, not sqlite3.Error)."""
    low, high = _INT64
    return all(not isinstance(v, int) or low <= v <= high
               for table in rows.values() for row in table for v in row)


class TelemetryStore:
    def __init__(self, path: str, config: TelemetryConfig,
                 on_flush: Callable[[int], None] | None = None, *, health: HealthBoard | None = None,
                 clock: Clock | None = None) -> None:
        self.path = path
        self._config = config
        self._on_flush = on_flush
        # Bounded: a stalled disk makes the sampler wait, then drop (counted), instead of growing memory.
        self._queue: queue.Queue[object] = queue.Queue(maxsize=4 * config.batch_size)
        self.dropped = 0
        self._thread: SupervisedThread | None = None
        self._writer = (health or HealthBoard()).component("telemetry_writer")
        self.written = 0  # samples committed
        self.rejected = 0  # records skipped because a value cannot be stored (beyond 64 bits)
        self.error: Exception | None = None
        import sqlite_utils  # imported here so that the read-only CLI does not pay for it

        conn = connect(path)
        clock = clock or DeviceClock()
        try:  # a damaged file may open and fail only here ("malformed"): one error, naming the file, either way
            migrate(conn, clock.elapsed())
            if dropped := drop_unusable_times(conn):
                log.warning("telemetry database %s: dropped %d rows keyed at an infinite time (written while "
                            "clock.json held an infinite offset)", path, dropped)
            newest = conn.execute("SELECT MAX(t) FROM samples").fetchone()[0]
            self._names = _Names(conn)
            self._series = {name: self._names(name) for name in SAMPLE_SERIES}
        except TelemetryError:
            conn.close()
            raise
        except sqlite3.Error as e:
            conn.close()
            raise TelemetryError(open_failure(path, e)) from e
        if newest is not None and isinstance(clock, DeviceClock):
            clock.advance_past(float(newest))  # rows written after the clock's last checkpoint (a crash)
        self._db = sqlite_utils.Database(conn)

    def start(self) -> None:
        self._thread = SupervisedThread("edged-telemetry-writer", self._run, self._writer)
        self._thread.start()

    def put(self, record: Record) -> None:
        self._put(record)

    def put_event(self, event: Event) -> None:
        self._put(event)

    def _put(self, item: Record | Event) -> None:
        try:
            self._queue.put(item, timeout=1.0)
        except queue.Full:
            self.dropped += 1
            log.warning("telemetry writer is behind; dropped a sample (%d so far)", self.dropped)

    def stop(self) -> None:
        """Flush what is queued and close; safe to call twice."""
        if self._thread is not None:
            self._thread.stop()
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._db.conn.close()

    def _run(self) -> None:
        batch: list[Record] = []
        events: list[Event] = []
        deadline = time.monotonic() + self._config.flush_interval_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if isinstance(item, Record):
                batch.append(item)
            elif isinstance(item, Event):
                events.append(item)
            full = len(batch) >= self._config.batch_size
            if item is _STOP or full or time.monotonic() >= deadline:
                written = self.written
                try:
                    self._flush_safely(batch, events)
                except Exception:  # the supervisor restarts this thread; a batch not written is counted lost
                    self.dropped += len(batch) if self.written == written else 0
                    raise
                batch, events = [], []
                deadline = time.monotonic() + self._config.flush_interval_s
            if item is _STOP:
                return

    def _flush_safely(self, batch: list[Record], events: list[Event]) -> None:
        try:
            self.flush(batch, events)
        except sqlite3.Error as e:  # a full disk must not kill the sampler; count and log instead
            self.error = TelemetryError(self._failure(e))
            self.dropped += len(batch)
            log.error("%s", self.error)
            self._writer.degraded(str(self.error))
            # The WAL may hold the space: merge it into the database and truncate it, so the next batch can fit.
            with contextlib.suppress(sqlite3.Error):
                self._db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return
        if batch or events:
            self.error = None
            self._writer.ok()

    def _failure(self, e: sqlite3.Error) -> str:
        if getattr(e, "sqlite_errorcode", None) == _SQLITE_FULL or "full" in str(e):
            return (f"telemetry write to {self.path} failed: disk full ({e}); samples are dropped until space "
                    "is freed: free space on the state partition, or lower [telemetry] raw_retention_s")
        return f"telemetry write to {self.path} failed: {e}"

    def flush(self, batch: list[Record], events: list[Event]) -> None:
        """Write one batch in one transaction, then roll up and apply retention (writer thread only)."""
        if not batch and not events:
            return
        conn = self._db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._insert(batch, events)
            if batch:
                self._maintain(max(r.key for r in batch))
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            self._names.rolled_back()
            raise
        self._names.committed()
        self.written += len(batch)
        if self._on_flush is not None:
            self._on_flush(self.written)

    def _insert(self, batch: list[Record], events: list[Event]) -> None:
        conn = self._db.conn
        rows: _Rows = {k: [] for k in ("samples", "rails", "temps", "engines", "models")}
        for record in batch:
            one = _record_rows(record, self._names)
            if not _storable(one):
                self.rejected += 1
                log.warning("telemetry sample at %.1f skipped: a value does not fit 64 bits (%d so far)",
                            record.key, self.rejected)
                continue
            for table, table_rows in one.items():
                rows[table] += table_rows
        events = [e for r in batch for e in r.events] + events
        conn.executemany("INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows["samples"])
        conn.executemany("INSERT OR REPLACE INTO rails VALUES (?,?,?,?)", rows["rails"])
        conn.executemany("INSERT OR REPLACE INTO temperatures VALUES (?,?,?)", rows["temps"])
        conn.executemany("INSERT OR REPLACE INTO engine_loads VALUES (?,?,?,?,?)", rows["engines"])
        conn.executemany("INSERT OR REPLACE INTO model_stats VALUES (?,?,?,?,?,?)", rows["models"])
        if events:
            self._db.table("events").insert_all(
                [{"t": e.t, "kind": e.kind, "subject": e.subject, "value": e.value, "detail": e.detail,
                  "wall": e.wall if e.wall is not None else e.t} for e in events])

    def _maintain(self, newest: float) -> None:
        conn = self._db.conn
        roll_minutes(conn, self._series, newest)
        roll_hours(conn)
        c = self._config
        apply_retention(conn, newest, c.raw_retention_s, c.minute_retention_s, c.hour_retention_s)
