"""The outbox's SQLite file: messages waiting for a PUBACK, in the order they were produced.

WAL journal. ``fsync`` policy: "always" commits (and fsyncs) every message on its own; "batch" (the default)
commits each group of messages in one transaction with synchronous=FULL, so one fsync covers the group and a
message is on disk before it is first sent; "off" uses synchronous=NORMAL, which survives a crash or kill -9
of the process but may lose the last commits on power loss.

Each row records ``elapsed``, the device elapsed time (``edged.clock``) when it was produced: ages are measured
by it and never by ``created``, the wall time kept for display. Every method that deletes rows returns what it
actually deleted (rows and payload bytes), so the outbox's counters follow the file, never its own guesses.
Rows are deleted either by seq (acknowledged) or as a prefix in seq order of the rows not yet sent (bounds,
age): the outbox is FIFO, and a row in flight is never dropped (it is delivered, and counted, on its PUBACK).
Statements per group: one INSERT per message, one DELETE for all acknowledged seqs, one INSERT for the inputs
the group's results answer (the message id state of ``_msgid``, in the same transaction), BEGIN, COMMIT and
``PRAGMA page_count``.

A full disk must never pin the file. In WAL mode a deletion is a write: it appends to the WAL, which needs space
unless a checkpoint has emptied the WAL first; and a checkpoint copies the WAL into the main file, which needs
space for every page the WAL holds beyond the main file's end (the pages of a growing backlog), while the WAL
still holds its own. So a file whose main part lags the WAL could fill a small disk and then free nothing, ever:
neither the deletions of acknowledged rows nor the checkpoint that would give the WAL's space back can run.
Two measures keep that from happening. After each commit that grew the database past its main file, and
whenever the WAL passes its cap (``WAL_CAP_BYTES``), the WAL is checkpointed while there is room, so the main
file never lags by more than one group, and a group holds at most ``GROUP_BYTES`` of payload. And a reserve file
(``<outbox>-reserve``, ``RESERVE_BYTES``, as databases keep one) is released when a write fails, which lets the
checkpoint through; the checkpoint truncates the WAL, whose space then lets the deletions through. Once made,
messages are written only while the reserve is there (it is made again as soon as the disk has room for it) or
while the file's own free pages hold them (the file does not grow, so no checkpoint needs room).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from edged.errors import OutboxError
from edged.mqtt._message import Outbound
from edged.mqtt._msgid import create_tables, load_answered, record_answered

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    correlation BLOB,
    content_type TEXT,
    user_props BLOB,
    created REAL NOT NULL,
    elapsed REAL NOT NULL
)
"""
_COLUMNS = "message_id, topic, payload, qos, retain, correlation, content_type, user_props, created, elapsed"
_INSERT = f"INSERT INTO outbox ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# One statement whatever the number of seqs (a JSON array); RETURNING gives what was really there.
_DELETE = "DELETE FROM outbox WHERE seq IN (SELECT value FROM json_each(?)) RETURNING LENGTH(payload)"
_WAL_PAGES = 128
WAL_CAP_BYTES = _WAL_PAGES * 4096
GROUP_BYTES = 32 << 10  # payload bytes per transaction at most: what a checkpoint may have to add to the main file
RESERVE_BYTES = 128 << 10  # covers the main file's lag (a group, its index pages and rows' overhead) twice over
log = logging.getLogger(__name__)
_ROW = tuple[str, str, bytes, int, int, bytes | None, str | None, bytes | None, float, float]

Stored = tuple[int, Outbound, float]  # (seq, message, elapsed)
Timed = tuple[Outbound, float, float]  # (message, wall time, elapsed) as put() recorded them


class OutboxStore:
    def __init__(self, path: Path, fsync: str, elapsed_now: float) -> None:
        """``elapsed_now``: the clock's elapsed time, given to rows of a file written before ``elapsed`` existed
        (their age then counts from this upgrade, since their wall times may come from a wrong clock). A damaged
        file (SQLite finds it malformed or not a database) is moved aside with its WAL, logged, and an empty
        outbox takes its place: its results cannot be read anyway, and refusing it would stop the daemon's
        every start (systemd restarting it in a loop, serving nothing)."""
        self.path = path
        self.reserve = path.with_name(path.name + "-reserve")
        self._wal = path.with_name(path.name + "-wal")
        self.per_message = fsync == "always"  # the outbox then writes groups of one
        self._lagging = False  # a checkpoint after a commit failed: the main file lags the WAL
        self._reserved = False  # the reserve was made once: messages are written only while it is there
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._open(fsync, elapsed_now)
            except sqlite3.DatabaseError as e:
                if not _damaged(e):
                    raise
                aside = self._move_aside()
                log.error("mqtt: outbox %s is damaged (%s): moved it aside to %s and started an empty outbox; "
                          "the results it held are not sent (their inputs were acknowledged). Keep the file to "
                          "inspect it, else delete it", path, e, aside)
                self._open(fsync, elapsed_now)
        except (sqlite3.Error, OSError) as e:
            raise OutboxError(f"outbox {path}: cannot open: {e}") from e
        self.keep_reserve()

    def _open(self, fsync: str, elapsed_now: float) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'NORMAL' if fsync == 'off' else 'FULL'}")
            # A WAL grows until a checkpoint succeeds; SQLite's 1,000 pages (4 MB) could take all of a small state
            # partition, after which nothing (not even deletions) can be written. Keep it small and reused.
            self._db.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={_WAL_PAGES * 4096}")
            # a damaged page deep in the file would otherwise fail only the read that reaches it, at every
            # restart of the outbox thread, for good
            problem = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")
            self._db.execute(_SCHEMA)
            self._migrate(elapsed_now)
            self.id_salt = create_tables(self._db)
            self._page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        except sqlite3.Error:
            self._db.close()
            raise

    def _move_aside(self) -> Path:
        """Rename the file and its WAL and shared-memory index to ``<file>.damaged-<unix seconds>[-wal|-shm]``."""
        aside = self.path.with_name(f"{self.path.name}.damaged-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(self.path.name + suffix)
            if source.exists():
                source.rename(aside.with_name(aside.name + suffix))
        return aside

    def _migrate(self, elapsed_now: float) -> None:
        columns = {str(row[1]) for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "elapsed" not in columns:
            self._db.execute("BEGIN")
            self._db.execute("ALTER TABLE outbox ADD COLUMN elapsed REAL NOT NULL DEFAULT 0")
            self._db.execute("UPDATE outbox SET elapsed = ?", (elapsed_now,))
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    def trace(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback`` with each SQL statement run (None: stop); for counting statements per message."""
        self._db.set_trace_callback(callback)

    def answered(self, client: str) -> dict[int, tuple[int, bytes]]:
        """mid -> (ordinal, digest) of the last input answered under it (see _msgid)."""
        return load_answered(self._db, client)

    def totals(self) -> tuple[int, int]:
        """(messages, payload bytes) stored."""
        count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()
        return int(count), int(size)

    def drop_topics(self, refused: Callable[[str], bool]) -> tuple[int, int]:
        """Delete the rows whose topic ``refused`` says no broker takes: (rows, payload bytes)."""
        try:
            bad = [int(seq) for seq, topic in self._db.execute("SELECT seq, topic FROM outbox") if refused(topic)]
            return self._delete(bad)
        except sqlite3.Error as e:
            raise OutboxError(f"outbox {self.path}: cannot drop messages: {e}") from e

    def max_elapsed(self) -> float:
        return float(self._db.execute("SELECT COALESCE(MAX(elapsed), 0) FROM outbox").fetchone()[0])

    def write(self, messages: Sequence[Timed], deletes: Sequence[int]) -> tuple[list[int], int, int]:
        """Insert ``messages`` and delete acknowledged seqs in one transaction: (the new seqs, rows deleted,
        bytes deleted). On failure none of it happened."""
        if messages and self._reserved and not self.keep_reserve() and not self._fits_inside(messages):
            raise OutboxError(f"outbox {self.path}: write failed: database or disk is full (no room for the "
                              f"{RESERVE_BYTES >> 10} KiB reserve that lets acknowledged messages be deleted "
                              "on a full disk)")
        if messages and self._lagging and not self.checkpoint():
            # the main file still lags the WAL: writing more would grow what a checkpoint needs past the reserve
            raise OutboxError(f"outbox {self.path}: write failed: database or disk is full (its WAL cannot be "
                              "checkpointed into the main file)")
        try:
            self._db.execute("BEGIN")
            seqs = [self._insert(m) for m in messages]
            # with the results: whenever a result is on disk, so is the state its message id was derived from
            record_answered(self._db, [m.answers for m, _, _ in messages if m.answers is not None])
            rows, freed = self._delete(deletes)
            self._db.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback()
            raise OutboxError(f"outbox {self.path}: write failed: {e}") from e
        self._catch_up(bool(messages))
        return seqs, rows, freed

    def _catch_up(self, inserted: bool) -> None:
        """After a commit: checkpoint when the WAL passed its cap or holds pages beyond the main file's end, so
        that a checkpoint on a full disk never needs more than the reserve. Steady traffic reuses free pages and
        costs one ``PRAGMA page_count`` per group; only a backlog growing to a new size checkpoints."""
        try:
            wal = self._wal.stat().st_size
            main = self.path.stat().st_size
            if wal <= WAL_CAP_BYTES and not inserted:
                return
            if wal <= WAL_CAP_BYTES:
                pages = int(self._db.execute("PRAGMA page_count").fetchone()[0])
                if pages * self._page_size <= main:
                    return
        except (OSError, sqlite3.Error):
            pass
        # no room for it now: no more messages are written until it succeeds, the reserve covers the lag
        self._lagging = not self.checkpoint()

    def _fits_inside(self, messages: Sequence[Timed]) -> bool:
        """The file's free pages hold ``messages`` twice over: writing them does not grow the main file, so a
        checkpoint needs no room (the reserve is for a growing file) and empties the WAL they take."""
        try:
            free = int(self._db.execute("PRAGMA freelist_count").fetchone()[0]) * self._page_size
        except sqlite3.Error:
            return False
        return free >= 2 * sum(len(m.payload) + len(m.topic) + 256 for m, _, _ in messages)

    def checkpoint(self) -> bool:
        """Copy the WAL into the main file and truncate it; False when that failed (a full disk). A reader of
        another process (a backup) may keep it from finishing: not a failure, the next one catches up."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            return False
        self._lagging = False
        return True

    def _rollback(self) -> None:
        # SQLite may already have rolled back by itself (SQLITE_FULL); a failing ROLLBACK changes nothing more.
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def reclaim(self) -> bool:
        """After a failed write: release the reserve, copy the WAL into the database and truncate it, which gives
        the WAL's space back for the deletions; True when the checkpoint succeeded."""
        with contextlib.suppress(OSError):
            self.reserve.unlink(missing_ok=True)
        return self.checkpoint()

    def keep_reserve(self) -> bool:
        """Make the reserve file when it is missing and the disk has room for it and a group more; True when it
        is there. Once made, messages are written only while it is (deletions always are): what a full disk
        leaves is kept for the deletions and checkpoints. A failure leaves no partial file: tried again later."""
        if self.reserve.exists():
            self._reserved = True
            return True
        try:
            stat = os.statvfs(self.path.parent)
            if stat.f_bavail * stat.f_frsize < RESERVE_BYTES + 2 * GROUP_BYTES:
                return False
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.write(fd, bytes(RESERVE_BYTES))  # a file system without fallocate
            os.fsync(fd)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                self.reserve.unlink()
            return False
        os.close(fd)
        self._reserved = True
        return True

    def _insert(self, timed: Timed) -> int:
        cursor = self._db.execute(_INSERT, _to_row(*timed))
        return int(cursor.lastrowid or 0)

    def _delete(self, seqs: Sequence[int]) -> tuple[int, int]:
        if not seqs:
            return 0, 0
        sizes = self._db.execute(_DELETE, (orjson.dumps(list(seqs)),)).fetchall()
        return len(sizes), sum(int(s[0]) for s in sizes)

    def load(self, after_seq: int, limit: int) -> list[Stored]:
        try:
            rows = self._db.execute(f"SELECT seq, {_COLUMNS} FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (after_seq, limit)).fetchall()
        except sqlite3.OperationalError as e:
            # A read can fail for want of space (the -shm file, a checkpoint): that is the full disk, handled
            # and retried with the writes. Any other read error propagates, and the supervised thread restarts
            # (counted, shown) with the page still to load; under a full disk its growing backoff would stall.
            if "full" not in str(e):
                raise
            raise OutboxError(f"outbox {self.path}: cannot read messages: {e}") from e
        return [(int(r[0]), _from_row(r[1:]), float(r[10])) for r in rows]

    def drop_oldest(self, count: int, size: int, first: int) -> tuple[int, int, int]:
        """Delete the oldest rows from seq ``first`` on (those never sent) until ``count`` messages and ``size``
        bytes are gone: (rows, bytes, max seq)."""
        rows, freed, last = 0, 0, 0
        try:
            for seq, length in self._db.execute("SELECT seq, LENGTH(payload) FROM outbox WHERE ? <= seq "
                                                "ORDER BY seq", (first,)):
                if rows >= count and freed >= size:
                    break
                rows, freed, last = rows + 1, freed + int(length), int(seq)
        except sqlite3.Error as e:
            raise OutboxError(f"outbox {self.path}: cannot read messages: {e}") from e
        return self._delete_range(first, last) if rows else (0, 0, 0)

    def drop_older_than(self, elapsed: float, first: int) -> tuple[int, int, int]:
        """Delete the rows from seq ``first`` on up to the newest one produced before device elapsed time
        ``elapsed``."""
        try:
            last = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE elapsed < ? AND seq >= ?",
                                    (elapsed, first)).fetchone()
        except sqlite3.Error as e:
            raise OutboxError(f"outbox {self.path}: cannot read messages: {e}") from e
        return self._delete_range(first, int(last[0])) if last[0] else (0, 0, 0)

    def _delete_range(self, first: int, last: int) -> tuple[int, int, int]:
        try:
            sizes = self._db.execute("DELETE FROM outbox WHERE seq BETWEEN ? AND ? RETURNING LENGTH(payload)",
                                     (first, last)).fetchall()
        except sqlite3.Error as e:
            raise OutboxError(f"outbox {self.path}: cannot drop messages: {e}") from e
        return len(sizes), sum(int(s[0]) for s in sizes), last


def _to_row(message: Outbound, created: float, elapsed: float) -> _ROW:
    props = orjson.dumps(message.user_properties) if message.user_properties else None
    return (message.message_id, message.topic, message.payload, message.qos, int(message.retain),
            message.correlation_data, message.content_type, props, created, elapsed)


def _from_row(row: Sequence[object]) -> Outbound:
    message_id, topic, payload, qos, retain, correlation, content_type, props = row[:8]
    user = tuple((str(k), str(v)) for k, v in orjson.loads(props)) if isinstance(props, bytes) else ()
    return Outbound(topic=str(topic), payload=bytes(payload) if isinstance(payload, bytes | bytearray) else b"",
                    qos=int(str(qos)), retain=bool(retain),
                    correlation_data=correlation if isinstance(correlation, bytes) else None,
                    content_type=content_type if isinstance(content_type, str) else None,
                    user_properties=user, message_id=str(message_id))


def _damaged(error: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT or SQLITE_NOTADB: the file itself is bad (not a lock, a permission or a full disk)."""
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (11, 26)
    text = str(error).lower()
    return "malformed" in text or "not a database" in text
