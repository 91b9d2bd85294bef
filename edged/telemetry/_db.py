"""Opening the telemetry database: the writer's WAL settings, or a read-only connection for the CLI.

Kept apart from the store so that the read path (``edged telemetry summary``) imports only sqlite3.

The WAL is kept small, as the MQTT outbox's: SQLite checkpoints every 1,000 pages (4 MB) by default, which on a
small state partition fills the disk with WAL before the database grows at all, and then every write fails.
"""

from __future__ import annotations

import sqlite3

from edged.errors import TelemetryError

_WAL_PAGES = 128  # checkpoint (merge the WAL into the database) every 128 pages, 512 kB


def connect(path: str, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_PAGES * 4096}")  # truncate the WAL back after
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.Error as e:
        raise TelemetryError(f"cannot open telemetry database {path}: {e}") from e
    return conn
