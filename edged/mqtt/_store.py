"""The outbox's SQLite file: messages waiting for a PUBACK, in the order they were produced.

WAL journal. ``fsync`` policy: "always" commits (and fsyncs) every message on its own; "batch" (the default)
commits each group of messages in one transaction with synchronous=FULL, so one fsync covers the group and a
message is on disk before it is first sent; "off" uses synchronous=NORMAL, which survives a crash or kill -9
of the process but may lose the last commits on power loss.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
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
    created REAL NOT NULL
)
"""
_COLUMNS = "message_id, topic, payload, qos, retain, correlation, content_type, user_props, created"
_ROW = tuple[str, str, bytes, int, int, bytes | None, str | None, bytes | None, float]

Stored = tuple[int, Outbound, float]  # (seq, message, created)


class OutboxStore:
    def __init__(self, path: Path, fsync: str) -> None:
        self.path = path
        self._per_message = fsync == "always"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'NORMAL' if fsync == 'off' else 'FULL'}")
            self._db.execute(_SCHEMA)
            self.id_salt = create_tables(self._db)
        except sqlite3.Error as e:
            raise OutboxError(f"outbox {path}: cannot open: {e}") from e

    def close(self) -> None:
        self._db.close()

    def answered(self, client: str) -> dict[int, tuple[int, bytes]]:
        """mid -> (ordinal, digest) of the last input answered under it (see _msgid)."""
        return load_answered(self._db, client)

    def totals(self) -> tuple[int, int]:
        """(messages, payload bytes) stored."""
        count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()
        return int(count), int(size)

    def write(self, messages: Sequence[tuple[Outbound, float]], deletes: Sequence[int]) -> list[int]:
        """Insert ``messages`` and delete acknowledged seqs in one transaction (or one per message)."""
        try:
            if self._per_message:
                return self._write_each(messages, deletes)
            self._db.execute("BEGIN")
            seqs = [self._insert(m, created) for m, created in messages]
            record_answered(self._db, [m.answers for m, _ in messages if m.answers is not None])
            self._delete(deletes)
            self._db.execute("COMMIT")
            return seqs
        except sqlite3.Error as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise OutboxError(f"outbox {self.path}: write failed: {e}") from e

    def _write_each(self, messages: Sequence[tuple[Outbound, float]], deletes: Sequence[int]) -> list[int]:
        seqs = [self._insert(m, created) for m, created in messages]  # autocommit: one fsync each
        # after its result: a crash in between leaves the state as the result's first delivery saw it
        record_answered(self._db, [m.answers for m, _ in messages if m.answers is not None])
        self._delete(deletes)
        return seqs

    def _insert(self, message: Outbound, created: float) -> int:
        cursor = self._db.execute(f"INSERT INTO outbox ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  _to_row(message, created))
        return int(cursor.lastrowid or 0)

    def _delete(self, seqs: Sequence[int]) -> None:
        if seqs:
            self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])

    def load(self, after_seq: int, limit: int) -> list[Stored]:
        rows = self._db.execute(f"SELECT seq, {_COLUMNS} FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                                (after_seq, limit)).fetchall()
        return [(int(r[0]), _from_row(r[1:]), float(r[9])) for r in rows]

    def drop_oldest(self, count: int, size: int) -> tuple[int, int, int]:
        """Delete the oldest rows until ``count`` messages and ``size`` bytes are gone: (rows, bytes, max seq)."""
        rows, freed, last = 0, 0, 0
        for seq, length in self._db.execute("SELECT seq, LENGTH(payload) FROM outbox ORDER BY seq"):
            if rows >= count and freed >= size:
                break
            rows, freed, last = rows + 1, freed + int(length), int(seq)
        if rows:
            self._db.execute("DELETE FROM outbox WHERE seq <= ?", (last,))
        return rows, freed, last

    def drop_older_than(self, created: float) -> tuple[int, int, int]:
        """Delete rows created before ``created``: (rows, bytes, max seq)."""
        rows, freed, last = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0), COALESCE(MAX(seq), 0) FROM outbox "
            "WHERE created < ?", (created,)).fetchone()
        if rows:
            self._db.execute("DELETE FROM outbox WHERE created < ?", (created,))
        return int(rows), int(freed), int(last)


def _to_row(message: Outbound, created: float) -> _ROW:
    props = orjson.dumps(message.user_properties) if message.user_properties else None
    return (message.message_id, message.topic, message.payload, message.qos, int(message.retain),
            message.correlation_data, message.content_type, props, created)


def _from_row(row: Sequence[object]) -> Outbound:
    message_id, topic, payload, qos, retain, correlation, content_type, props = row[:8]
    user = tuple((str(k), str(v)) for k, v in orjson.loads(props)) if isinstance(props, bytes) else ()
    return Outbound(topic=str(topic), payload=bytes(payload) if isinstance(payload, bytes | bytearray) else b"",
                    qos=int(str(qos)), retain=bool(retain),
                    correlation_data=correlation if isinstance(correlation, bytes) else None,
                    content_type=content_type if isinstance(content_type, str) else None,
                    user_properties=user, message_id=str(message_id))
