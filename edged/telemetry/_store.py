"""The SQLite store: one writer thread, batched transactions, WAL so that readers are never blocked.

Durability: WAL with ``synchronous=NORMAL``. A killed process (SIGKILL) loses nothing that was committed and
never corrupts the file; what it loses is the batch still in memory (at most ``batch_size`` samples or
``flush_interval_s`` of them). A power cut may also lose the last committed transactions, never consistency.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edged.config import TelemetryConfig
from edged.errors import TelemetryError
from edged.supervision import HealthBoard, SupervisedThread
from edged.telemetry._db import connect
from edged.telemetry._derived import Event, ModelInterval
from edged.telemetry._rollup import apply_retention, roll_hours, roll_minutes
from edged.telemetry._sample import Sample
from edged.telemetry._schema import SAMPLE_SERIES, migrate

log = logging.getLogger(__name__)
_STOP = object()


@dataclass(frozen=True)
class Record:
    sample: Sample
    power_in_mw: int | None = None
    models: tuple[ModelInterval, ...] = ()
    events: tuple[Event, ...] = ()


@dataclass
class _Names:
    conn: sqlite3.Connection
    ids: dict[str, int] = field(default_factory=dict)

    def __call__(self, name: str) -> int:
        if name not in self.ids:
            self.conn.execute("INSERT OR IGNORE INTO names (name) VALUES (?)", (name,))
            self.ids[name] = self.conn.execute("SELECT id FROM names WHERE name = ?", (name,)).fetchone()[0]
        return self.ids[name]


def _rows(records: list[Record], nid: _Names) -> dict[str, list[tuple[object, ...]]]:
    rows: dict[str, list[tuple[object, ...]]] = {
        k: [] for k in ("samples", "rails", "temps", "engines", "models")}
    for r in records:
        s, t = r.sample, r.sample.t
        cpu = json.dumps([[c.load_pct, c.freq_mhz] for c in s.cpu], separators=(",", ":"))
        rows["samples"].append((t, s.ram_used_mb, s.ram_total_mb, s.swap_used_mb, s.swap_total_mb,
                                s.cpu_mean_load(), cpu, s.gpu_load_pct, s.gpu_freq_mhz, s.emc_load_pct,
                                s.emc_freq_mhz, r.power_in_mw))
        rows["rails"] += [(t, nid(f"power_mw:{k}"), v.now_mw, v.avg_mw) for k, v in s.power_mw.items()]
        rows["temps"] += [(t, nid(f"temp_c:{k}"), v) for k, v in s.temps_c.items()]
        rows["engines"] += [(t, nid(f"engine_load_pct:{k}"), int(e.on), e.load_pct, e.freq_mhz)
                            for k, e in s.engines.items()]
        rows["models"] += [(t, nid(f"model:{m.model}"), m.dt_s, m.inferences, m.compute_ns, m.energy_mj)
                           for m in r.models]
    return rows


class TelemetryStore:
    def __init__(self, path: str, config: TelemetryConfig,
                 on_flush: Callable[[int], None] | None = None, *, health: HealthBoard | None = None) -> None:
        self.path = path
        self._config = config
        self._on_flush = on_flush
        # Bounded: a stalled disk makes the sampler wait, then drop (counted), instead of growing memory.
        self._queue: queue.Queue[object] = queue.Queue(maxsize=4 * config.batch_size)
        self.dropped = 0
        self._thread: SupervisedThread | None = None
        self._writer = (health or HealthBoard()).component("telemetry_writer")
        self.written = 0  # samples committed
        self.error: Exception | None = None
        import sqlite_utils  # imported here so that the read-only CLI does not pay for it

        conn = connect(path)
        migrate(conn)
        self._db = sqlite_utils.Database(conn)
        self._names = _Names(conn)
        self._series = {name: self._names(name) for name in SAMPLE_SERIES}

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
            self.error = TelemetryError(f"telemetry write to {self.path} failed: {e}")
            log.error("%s", self.error)
            self._writer.degraded(str(self.error))
            return
        if batch or events:
            self._writer.ok()

    def flush(self, batch: list[Record], events: list[Event]) -> None:
        """Write one batch in one transaction, then roll up and apply retention (writer thread only)."""
        if not batch and not events:
            return
        conn = self._db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._insert(batch, events)
            if batch:
                self._maintain(max(r.sample.t for r in batch))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.written += len(batch)
        if self._on_flush is not None:
            self._on_flush(self.written)

    def _insert(self, batch: list[Record], events: list[Event]) -> None:
        conn = self._db.conn
        rows = _rows(batch, self._names)
        events = [e for r in batch for e in r.events] + events
        conn.executemany("INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows["samples"])
        conn.executemany("INSERT OR REPLACE INTO rails VALUES (?,?,?,?)", rows["rails"])
        conn.executemany("INSERT OR REPLACE INTO temperatures VALUES (?,?,?)", rows["temps"])
        conn.executemany("INSERT OR REPLACE INTO engine_loads VALUES (?,?,?,?,?)", rows["engines"])
        conn.executemany("INSERT OR REPLACE INTO model_stats VALUES (?,?,?,?,?,?)", rows["models"])
        if events:
            self._db.table("events").insert_all(
                [{"t": e.t, "kind": e.kind, "subject": e.subject, "value": e.value, "detail": e.detail}
                 for e in events])

    def _maintain(self, newest: float) -> None:
        conn = self._db.conn
        roll_minutes(conn, self._series, newest)
        roll_hours(conn)
        c = self._config
        apply_retention(conn, newest, c.raw_retention_s, c.minute_retention_s, c.hour_retention_s)
