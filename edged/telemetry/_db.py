"""Opening the telemetry database: the writer's WAL settings, or a read-only connection for the CLI.

Kept apart from the store so that the read path (``edged telemetry summary``) imports only sqlite3.

The WAL is kept small, as the MQTT outbox's: SQLite checkpoints every 1,000 pages (4 MB) by default, which on a
small state partition fills the disk with WAL before the database grows at all, and then every write fails.

A database another process holds is waited for up to 5 s (``sqlite3.connect``'s own ``timeout`` covers the
pragmas below too), then refused as locked; the service retries later (see `edged.telemetry._service`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from edged.errors import TelemetryError

_WAL_PAGES = 128  # checkpoint (merge the WAL into the database) every 128 pages, 512 kB
_BUSY_TIMEOUT_S = 5.0


def connect(path: str, readonly: bool = False) -> sqlite3.Connection:
    conn: sqlite3.Connection | None = None
    try:
        if readonly:
            conn = _connect_readonly(path)
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_PAGES * 4096}")  # truncate the WAL back after
    except sqlite3.Error as e:
        if conn is not None:
            conn.close()
        raise TelemetryError(open_failure(path, e)) from e
    return conn


def _connect_readonly(path: str) -> sqlite3.Connection:
    """A read-only connection. The path goes in the URI percent-encoded: a '#' or '?' in it would otherwise end
    the file name. On a read-only filesystem a WAL database cannot get its -shm file; it is then opened as
    immutable (nothing can be writing to it there), which reads the database file alone."""
    uri = Path(path).absolute().as_uri()
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        conn.close()
        if not _read_only_mount(path):  # elsewhere a writer may be at work: immutable would read torn pages
            raise
        conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    return conn


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def open_failure(path: str, error: sqlite3.Error | OSError) -> str:
    """What went wrong opening the database at ``path``, and what to do about it, in one line."""
    text = str(error.strerror if isinstance(error, OSError) and error.strerror else error)
    lowered = text.lower()
    if "not a database" in lowered or "malformed" in lowered:
        return (f"telemetry database {path} is damaged ({text}): move it aside or delete it, and edged starts "
                "a new one")
    if "locked" in lowered or "busy" in lowered:
        return (f"telemetry database {path} is locked by another process ({text}): stop the process that "
                f"holds it (fuser {path} names it)")
    if "full" in lowered or "no space" in lowered:
        return f"telemetry database {path} cannot grow: disk full ({text}): free space on its partition"
    if "readonly" in lowered or "read-only" in lowered or "permission" in lowered or "unable to open" in lowered:
        return (f"telemetry database {path} cannot be written ({text}): make it and its folder writable by the "
                "user edged runs as (on a filesystem mounted read-write), or set [telemetry] database to a "
                "writable path")
    return f"cannot open telemetry database {path}: {text}"


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back what a failed transaction left, for the caller to re-raise its own error: SQLite may have rolled
    back by itself (a full disk, SQLITE_FULL), and a ROLLBACK that then fails would hide the cause."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
