"""Opening the telemetry database: the writer's WAL settings, or a read-only connection for the CLI.

Kept apart from the store so that the read path (``edged telemetry summary``) imports only sqlite3.
"""

from __future__ import annotations

import sqlite3

from edged.errors import TelemetryError


def connect(path: str, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.Error as e:
        raise TelemetryError(f"cannot open telemetry database {path}: {e}") from e
    return conn
