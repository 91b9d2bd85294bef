"""The sampler survives its source failing with EMFILE (as in the field): restarted, and stale meanwhile."""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from sqlite_faults import flaky_sqlite
from telemetry_data import SYSFS

from edged.clock import ManualClock
from edged.config import TelemetryConfig
from edged.supervision import HealthBoard
from edged.telemetry import TelemetryService
from edged.telemetry._sample import Sample
from edged.telemetry._store import Record, TelemetryStore
from edged.telemetry._sysfs import SysfsSource

WAIT_S = 20.0


class OutOfDescriptorsOnce:
    """A real sysfs source whose second read fails as when the process has run out of file descriptors;
    the read after that waits for the test's go-ahead."""

    name = "sysfs"

    def __init__(self, root: Path) -> None:
        self._real = SysfsSource(str(root), 0.05)
        self.calls = 0
        self.failed = threading.Event()
        self.go_on = threading.Event()

    def next_sample(self, stop: threading.Event) -> Sample | None:
        self.calls += 1
        if self.calls == 2:
            self.failed.set()
            raise OSError(errno.EMFILE, "Too many open files", "sys/devices/system/cpu")
        if self.calls == 3:
            self.go_on.wait(WAIT_S)
        return self._real.next_sample(stop)

    def close(self) -> None:
        self.go_on.set()


def _wait(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_sampler_restarts_after_emfile_and_its_readings_are_stale_meanwhile(tmp_path: Path) -> None:
    config = TelemetryConfig(source="sysfs", sysfs_root=str(SYSFS / "orin_nano_jp6"), interval_s=0.05,
                             restart_backoff_s=0.01, restart_backoff_max_s=0.02, flush_interval_s=0.1)
    clock, board = ManualClock(), HealthBoard()
    source = OutOfDescriptorsOnce(SYSFS / "orin_nano_jp6")
    service = TelemetryService(config, str(tmp_path / "t.db"), source=source, health=board, clock=clock)
    sampler = board.component("telemetry_sampler")
    service.start()
    try:
        assert service.wait_samples(1, WAIT_S)
        assert service.snapshot()["stale"] is False
        assert "edged_gpu_utilization " in service.render_prometheus()
        assert source.failed.wait(WAIT_S)
        _wait(lambda: sampler.health.restarts == 1, "the sampler's restart")
        assert sampler.health.state == "restarting" and sampler.health.errors == 1
        assert "Too many open files" in sampler.health.last_error

        clock.advance(60.0)  # no sample for 60 s of device time
        snapshot = service.snapshot()
        assert snapshot["stale"] is True and snapshot["last_sample_age_s"] == 60.0
        text = service.render_prometheus()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["edged_telemetry_stale"].samples[0].value == 1
        assert families["edged_telemetry_last_sample_age_seconds"].samples[0].value == 60.0
        for reading in ("edged_gpu_utilization", "edged_temperature_celsius", "edged_power_milliwatts",
                        "edged_memory_used_bytes", "edged_cpu_utilization"):
            assert reading not in families, f"{reading} exported although the sample is 60 s old"

        source.go_on.set()
        assert service.wait_samples(2, WAIT_S)
        assert service.snapshot()["stale"] is False and sampler.health.state == "ok"
        assert board.overall() == ("ok", "")
    finally:
        service.stop()


def _records(count: int) -> list[Record]:
    source = SysfsSource(str(SYSFS / "orin_nano_jp6"), 0.05)
    return [Record(dataclasses.replace(source.read(), t=1000.0 + i)) for i in range(count)]


def test_writer_restarts_after_an_unexpected_exception_and_keeps_writing(tmp_path: Path) -> None:
    board, flushes = HealthBoard(), []

    def on_flush(written: int) -> None:
        flushes.append(written)
        if len(flushes) == 1:
            raise RuntimeError("a bug after the commit")

    store = TelemetryStore(str(tmp_path / "t.db"), TelemetryConfig(batch_size=2, flush_interval_s=0.05),
                           on_flush, health=board)
    writer = board.component("telemetry_writer")
    store.start()
    try:
        for record in _records(6):
            store.put(record)
        _wait(lambda: store.written == 6, "all six samples written")
        assert (writer.health.restarts, writer.health.errors) == (1, 1) and store.dropped == 0
        _wait(lambda: writer.health.state == "ok", "healthy again")
    finally:
        store.stop()


def test_writer_shows_degraded_while_the_disk_refuses_writes(tmp_path: Path) -> None:
    board = HealthBoard()
    with flaky_sqlite(fail_on="INTO samples") as made:
        store = TelemetryStore(str(tmp_path / "t.db"), TelemetryConfig(batch_size=1, flush_interval_s=0.05),
                               health=board)
    writer = board.component("telemetry_writer")
    store.start()
    try:
        first, second = _records(2)
        store.put(first)
        assert made[0].failed.wait(WAIT_S)
        _wait(lambda: writer.health.state == "degraded", "degraded")
        assert "disk I/O error" in writer.health.reason and writer.health.restarts == 0
        store.put(second)
        _wait(lambda: store.written == 1 and writer.health.state == "ok", "a good write, healthy again")
    finally:
        store.stop()
