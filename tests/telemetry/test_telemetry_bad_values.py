"""Corrupt readings and a full disk: a bad line is refused and counted, one bad value never costs its batch, a
small state partition is not filled by the WAL, and a full disk is reported as a full disk."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from edged.config import TelemetryConfig
from edged.errors import TelemetryParseError
from edged.supervision import HealthBoard
from edged.telemetry import Rail, Sample, TelemetryService
from edged.telemetry._replay import ReplaySource
from edged.telemetry._store import Record, TelemetryStore
from edged.telemetry.tegrastats import parse_tegrastats

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tegrastats" / "orin_nano_jp6.log"
GOOD = [ln for ln in FIXTURE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
HUGE = "RAM 99999999999999999999/7620MB CPU [1%@729] VDD_IN 99999999999999999999mW/1mW tj@50C"


@pytest.mark.parametrize("line", [
    HUGE,
    "RAM 9000/7620MB CPU [1%@729] tj@50C",  # used above total
    "RAM 3000/99999999999MB CPU [1%@729] tj@50C",  # above 16 TiB
])
def test_a_line_with_an_impossible_ram_field_is_refused_as_bad(line):
    with pytest.raises(TelemetryParseError, match="corrupt"):
        parse_tegrastats(line)


_GOOD_REST = "EMC_FREQ 3%@2133 cpu@50.5C tj@51C VDD_IN 5000mW/4900mW VDD_SOC 1500mW/1500mW"


@pytest.mark.parametrize(("field", "check"), [
    ("GR3D_FREQ 200%@[305,305]", lambda s: s.gpu_load_pct is None and s.gpu_gpc_freq_mhz is None),
    ("SWAP 900/100MB (cached 0MB)", lambda s: s.swap_used_mb is None and s.swap_total_mb is None),
    ("gpu@9000C", lambda s: "gpu" not in s.temps_c),
    ("soc0@-650788.984C", lambda s: "soc0" not in s.temps_c),  # a thermal zone's bogus read
    ("VDD_CPU_GPU_CV 99999999999mW/1mW", lambda s: "VDD_CPU_GPU_CV" not in s.power_mw),
    ("NVDEC 400%@115", lambda s: "NVDEC" not in s.engines),
    ("APE 999999999", lambda s: "APE" not in s.engines),
    ("MTS fg 300% bg 0%", lambda s: "MTS" not in s.engines),
    ("EMC 5%@999999999", lambda s: s.emc_load_pct == 3),  # the good EMC_FREQ later in the line is read
    ("VIC 3%@" + "9" * 5000, lambda s: "VIC" not in s.engines),  # past int()'s 4300 digits
])
def test_an_impossible_field_costs_that_field_only(field, check):
    """One bad thermal zone or torn rail refused the whole line: power, and so energy, was lost with it."""
    sample = parse_tegrastats(f"RAM 3000/7620MB CPU [1%@729,2%@729] {field} {_GOOD_REST}")
    assert check(sample)
    assert field.split()[0] in " ".join(sample.unparsed)  # kept, not silently dropped
    assert sample.power_mw["VDD_IN"] == Rail(5000, 4900) and sample.temps_c["tj"] == 51.0
    assert (sample.ram_used_mb, [c.load_pct for c in sample.cpu]) == (3000, [1, 2])


def test_an_impossible_core_costs_that_core_only():
    sample = parse_tegrastats("RAM 3000/7620MB CPU [1%@729,150%@729,3%@999999999,off] tj@50C")
    assert [(c.load_pct, c.freq_mhz) for c in sample.cpu] == [(1, 729), (None, None), (None, None),
                                                               (None, None)]
    assert sample.unparsed == ("150%@729", "3%@999999999") and sample.temps_c == {"tj": 50.0}


def test_every_recorded_fixture_line_is_still_accepted():
    for path in FIXTURE.parent.glob("*.log"):
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                parse_tegrastats(line)


def _sample(t: float, ram_used_mb: int = 1000) -> Sample:
    return Sample(t=t, ram_used_mb=ram_used_mb, ram_total_mb=8000, gpu_load_pct=5, temps_c={"cpu": 40.0},
                  power_mw={"VDD_IN": Rail(5000, 5000)})


def test_one_value_beyond_64_bits_skips_its_record_and_keeps_the_rest_of_the_batch(tmp_path):
    path = str(tmp_path / "t.db")
    health = HealthBoard()
    store = TelemetryStore(path, TelemetryConfig(batch_size=10, flush_interval_s=0.05), health=health)
    store.start()
    t0 = 1_800_000_000.0
    for i in range(5):
        store.put(Record(_sample(t0 + i, ram_used_mb=10**20 if i == 2 else 1000)))
    store.stop()
    rows = sqlite3.connect(path).execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert (rows, store.rejected, store.dropped, store.error) == (4, 1, 0, None)
    writer = health.component("telemetry_writer").health
    assert (writer.state, writer.errors) == ("ok", 0)


def test_replayed_bad_lines_are_counted_exported_and_logged_rate_limited(tmp_path, caplog):
    replay = tmp_path / "replay.log"
    replay.write_text("\n".join(GOOD[:2] + [HUGE, "garbage"] * 20 + GOOD[2:4]) + "\n")
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.05), str(tmp_path / "t.db"),
                               source=ReplaySource(str(replay), speed=1e6))
    with caplog.at_level(logging.WARNING, logger="edged.telemetry"):
        service.start()
        service.wait_samples(4, timeout=10)
        service.stop()
    snapshot = service.snapshot()
    assert (service.samples, snapshot["bad_lines"]) == (4, 40)
    assert "edged_telemetry_bad_lines_total{source=\"replay\"} 40" in service.render_prometheus()
    bad_warnings = [r for r in caplog.records if "bad line" in r.getMessage()]
    assert 1 <= len(bad_warnings) <= 5  # the first few in full, then a summary: not one per line


def test_on_a_small_partition_the_wal_stays_small_and_a_full_disk_is_reported_as_full(tmpfs):
    path = str(tmpfs / "telemetry.db")
    health = HealthBoard()
    store = TelemetryStore(path, TelemetryConfig(batch_size=50, flush_interval_s=0.05), health=health)
    store.start()
    t0 = 1_800_000_000.0
    rails = {f"RAIL_{i}": Rail(5000 + i, 5000) for i in range(30)}
    stop = threading.Event()  # set once the disk is full
    for i in range(20_000):  # far more than 1 MiB holds
        store.put(Record(Sample(t=t0 + i, ram_used_mb=1000, ram_total_mb=8000, power_mw=rails,
                                temps_c={f"s{j}": 40.0 for j in range(10)})))
        if store.error is not None:
            stop.set()
            break
    store.stop()
    wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
    assert stop.is_set(), "the 1 MiB partition never filled up"
    assert "disk full" in str(store.error) and "cannot rollback" not in str(store.error)
    assert "raw_retention_s" in str(store.error)  # says what to do
    # 128 pages (512 kB) between checkpoints, plus what one batch adds before its commit checkpoints
    assert wal <= 720 * 1024, f"the WAL holds {wal} bytes of a 1 MiB partition"
    assert store.dropped > 0
    writer = health.component("telemetry_writer").health
    assert writer.state == "degraded" and "disk full" in writer.reason


def test_fields_not_read_are_counted_exported_and_logged_once_per_name(tmp_path, caplog):
    """A refused field (a bogus zone) or an unknown one went nowhere but the sample's unparsed list: no counter,
    no log line, while a whole bad line is counted in edged_telemetry_bad_lines_total."""
    replay = tmp_path / "replay.log"
    replay.write_text("".join(f"RAM 3000/7620MB CPU [1%@729] soc0@-65078{i}.5C tj@50C VDD_IN 5000mW/5000mW "
                              "FROB 7/8/x\n" for i in range(10)))
    service = TelemetryService(TelemetryConfig(flush_interval_s=0.05), str(tmp_path / "t.db"),
                               source=ReplaySource(str(replay), speed=1e6))
    with caplog.at_level(logging.WARNING, logger="edged.telemetry"):
        service.start()
        service.wait_samples(10, timeout=10)
        service.stop()
    assert service.snapshot()["unread_fields"] == 30  # soc0@..., FROB, 7/8/x in each of 10 lines
    assert 'edged_telemetry_fields_unread_total{source="replay"} 30' in service.render_prometheus()
    logged = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert len(logged) == 1 and "soc0@" in logged[0] and "FROB" in logged[0]
