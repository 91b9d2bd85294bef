"""Faults at the SQLite edge for the outbox and telemetry tests: real connections, one injected failure or stall."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

WAIT_S = 20.0


class FlakyConnection:
    """A real sqlite3 connection with one fault at the edge: the first statement containing ``fail_on`` raises
    a raw ``sqlite3.OperationalError``; statements containing ``stall_on`` wait until ``go_on`` is set."""

    def __init__(self, real: sqlite3.Connection, fail_on: str | None, stall_on: str | None) -> None:
        self._real = real
        self._fail_on, self._stall_on = fail_on, stall_on
        self.failed = threading.Event()
        self.stalled = threading.Event()
        self.go_on = threading.Event()

    def _edge(self, sql: str) -> None:
        if self._fail_on is not None and self._fail_on in sql and not self.failed.is_set():
            self.failed.set()
            raise sqlite3.OperationalError("disk I/O error")
        if self._stall_on is not None and self._stall_on in sql and not self.go_on.is_set():
            self.stalled.set()
            self.go_on.wait(WAIT_S)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._edge(sql)
        return self._real.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._edge(sql)
        return self._real.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def flaky_sqlite(fail_on: str | None = None, stall_on: str | None = None) -> Iterator[list[FlakyConnection]]:
    """While active, every sqlite3.connect() returns a FlakyConnection (the outbox opens its file here)."""
    made: list[FlakyConnection] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> FlakyConnection:
        made.append(FlakyConnection(real_connect(*args, **kwargs), fail_on, stall_on))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect)
        yield made
