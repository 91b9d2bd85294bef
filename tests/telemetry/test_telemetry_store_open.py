"""A telemetry database that cannot be opened (garbage, a malformed page, read-only media, a full disk, a lock
held by another process) never stops the service: live readings go on, ``telemetry_writer`` is degraded with
the file and what to do, and the store opens by itself once the cause is gone."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from telemetry_data import SYSFS

from edged.clock import ManualClock
from edged.config import TelemetryConfig
from edged.errors import TelemetryError
from edged.supervision import HealthBoard
from edged.telemetry import Rail, Sample, TelemetryService
from edged.telemetry._store import Record, TelemetryStore

WAIT_S = 20.0
CONFIG = TelemetryConfig(source="sysfs", sysfs_root=str(SYSFS / "orin_nano_jp6"), interval_s=0.05,
                         restart_backoff_s=0.05, restart_backoff_max_s=0.1, flush_interval_s=0.05)


def _wait(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])


def _service(path: Path, board: HealthBoard) -> TelemetryService:
    return TelemetryService(CONFIG, str(path), health=board, clock=ManualClock())


def test_a_garbage_database_file_degrades_the_writer_and_a_new_one_is_used_once_it_is_moved_aside(tmp_path):
    path = tmp_path / "telemetry.db"
    path.write_bytes(os.urandom(8192))
    board = HealthBoard()
    service = _service(path, board)
    service.start()  # raised "file is not a database" and stopped the daemon's start
    try:
        assert service.wait_samples(2, WAIT_S), "no live readings while the database is damaged"
        writer = board.component("telemetry_writer").health
        assert writer.state == "degraded"
        assert str(path) in writer.reason and "damaged" in writer.reason and "move it aside" in writer.reason
        snapshot = service.snapshot()
        assert snapshot["store_error"] == writer.reason and snapshot["store_dropped"] >= 1
        assert "edged_gpu_utilization " in service.render_prometheus()
        path.rename(tmp_path / "telemetry.db.damaged")  # what the reason tells the user to do
        _wait(lambda: board.component("telemetry_writer").health.state == "ok", "the store opened on a retry")
        assert service.snapshot()["store_error"] is None
        assert service.wait_samples(service.samples + 3, WAIT_S)  # stored now
    finally:
        service.stop()
    assert _rows(path) >= 1


def test_a_malformed_page_is_a_telemetry_error_naming_the_file(tmp_path):
    path = tmp_path / "telemetry.db"
    store = TelemetryStore(str(path), TelemetryConfig())
    store.flush([Record(Sample(t=float(i), ram_used_mb=1, ram_total_mb=2, power_mw={"VDD_IN": Rail(1, 1)}))
                 for i in range(3000)], [])
    store.stop()
    pages = path.stat().st_size // 4096
    with path.open("r+b") as f:  # keep the header and the schema (pages 1-3), damage the rows
        for page in range(3, pages):
            f.seek(page * 4096)
            f.write(os.urandom(4096))
    with pytest.raises(TelemetryError, match="damaged") as raised:  # was a raw sqlite3.DatabaseError
        TelemetryStore(str(path), TelemetryConfig())
    assert str(path) in str(raised.value) and "malformed" in str(raised.value)


_HOLD_LOCK = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
""")


def test_a_database_another_process_holds_degrades_and_opens_once_the_lock_is_released(tmp_path):
    """Slow (about 5 s): the first open waits SQLite's busy timeout before it calls the file locked."""
    path = tmp_path / "telemetry.db"
    sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    board = HealthBoard()
    service = _service(path, board)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        service.start()  # raised "database is locked" and stopped the daemon's start
        writer = board.component("telemetry_writer").health
        assert writer.state == "degraded" and "locked by another process" in writer.reason
        assert f"fuser {path}" in writer.reason
        assert service.wait_samples(1, WAIT_S)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(WAIT_S) == 0
        _wait(lambda: board.component("telemetry_writer").health.state == "ok", "opened once released")
        assert service.wait_samples(service.samples + 3, WAIT_S)  # stored now
    finally:
        service.stop()
        holder.kill()
        holder.wait()
    assert _rows(path) >= 1


def _remount(mount: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def test_a_database_on_read_only_media_degrades_and_opens_when_the_media_is_writable_again(tmpfs):
    path = tmpfs / "state" / "telemetry.db"
    _remount(tmpfs, "ro")
    board = HealthBoard()
    service = _service(path, board)
    service.start()  # the folder cannot even be made on a read-only filesystem
    try:
        assert service.wait_samples(1, WAIT_S)
        writer = board.component("telemetry_writer").health
        assert writer.state == "degraded" and str(path) in writer.reason and "writable" in writer.reason
        _remount(tmpfs, "rw")
        _wait(lambda: board.component("telemetry_writer").health.state == "ok", "opened once writable")
        assert service.wait_samples(service.samples + 3, WAIT_S)  # stored now
    finally:
        service.stop()
    assert _rows(path) >= 1


def test_a_full_disk_at_open_degrades_and_the_store_opens_once_space_is_freed(tmpfs):
    filler = tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass  # the partition is full
    finally:
        os.close(fd)
    path = tmpfs / "telemetry.db"
    board = HealthBoard()
    service = _service(path, board)
    service.start()
    try:
        assert service.wait_samples(1, WAIT_S)
        writer = board.component("telemetry_writer").health
        assert writer.state == "degraded" and "disk full" in writer.reason and str(path) in writer.reason
        assert "free space" in writer.reason
        filler.unlink()
        _wait(lambda: board.component("telemetry_writer").health.state == "ok", "opened once space is free")
        assert service.wait_samples(service.samples + 3, WAIT_S)  # stored now
    finally:
        service.stop()
    assert _rows(path) >= 1
