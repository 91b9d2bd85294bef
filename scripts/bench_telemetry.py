#!/usr/bin/env python3
"""Cost of edged's telemetry: CPU per sample at 1 Hz, bulk replay, DB size vs the rollup promise, summary time.

Usage: .venv/bin/python scripts/bench_telemetry.py [--seconds 20] [--samples 100000] [--workdir DIR]

1. Sampling + storing at 1 Hz for --seconds, twice: the sysfs source on this machine's real /proc and /sys,
   and tegrastats lines (a recorded Orin Nano line replayed at real speed, so the parser runs each second).
   CPU time of this process per sample, as a percentage of one core at 1 Hz.
2. --samples replayed at top speed into a fresh database with the default retention: throughput, RSS before
   and after, database size by table (dbstat), and the size of one year at 1 Hz projected from the bytes per
   row (raw rows for raw_retention_s, 1-minute rows for minute_retention_s, 1-hour rows for the year).
3. ``edged telemetry summary --since 24h --db DB`` on that database, the headline number: the whole command's
   wall time as a user runs it (the ``edged`` console script beside this interpreter, else ``python -m edged``;
   median of 5 after one warm-up run, so the page cache is warm), against the target of 100 ms; then the query
   alone in-process (median of 20).

The headline comes first in the JSON (``summary_24h_command_ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.config import TelemetryConfig  # noqa: E402
from edged.telemetry import TelemetryReader, TelemetryService  # noqa: E402
from edged.telemetry._replay import ReplaySource  # noqa: E402
from edged.telemetry._sysfs import SysfsSource  # noqa: E402

LINE = ("05-05-2025 06:05:39 RAM 2639/7620MB (lfb 9x4MB) SWAP 0/3810MB (cached 0MB) CPU [1%@729,4%@729,8%@729,"
        "4%@729,5%@729,4%@729] GR3D_FREQ 0% cpu@44.156C soc2@43.781C soc0@44.687C gpu@45.968C tj@45.968C "
        "soc1@45.312C VDD_IN 5263mW/5263mW VDD_CPU_GPU_CV 717mW/717mW VDD_SOC 1794mW/1794mW")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Models:
    def __init__(self) -> None:
        self.n = 0

    def model_activity(self) -> dict[tuple[str, str], tuple[int, int]]:
        self.n += 1
        return {("digits", "1"): (self.n * 50, self.n * 40_000_000),
                ("yolo", "1"): (self.n * 5, self.n * 300_000_000)}


def at_one_hz(name: str, source: object, seconds: float, db: Path) -> dict[str, float]:
    config = TelemetryConfig(interval_s=1.0)
    service = TelemetryService(config, str(db), activity=Models(), source=source)  # type: ignore[arg-type]
    service.start()
    warm = 3  # leave out the start (database creation, first flush, thread start)
    service.wait_samples(warm, timeout=30)
    cpu0, wall0, n0 = time.process_time(), time.perf_counter(), service.samples
    service.wait_samples(warm + int(seconds), timeout=seconds + 30)
    cpu, wall, n = time.process_time() - cpu0, time.perf_counter() - wall0, service.samples - n0
    service.stop()
    return {"source": name, "samples": n, "wall_s": round(wall, 2), "cpu_ms_per_sample": round(cpu / n * 1e3, 3),
            "pct_of_one_core_at_1hz": round(cpu / n * 100, 3)}


def table_bytes(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    conn.close()
    return dict(rows)


def row_counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    tables = ["samples", "rails", "temperatures", "engine_loads", "model_stats", "rollup_1m", "rollup_1h"]
    out = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    conn.close()
    return out


def projection(db: Path, config: TelemetryConfig) -> dict[str, float]:
    sizes, counts = table_bytes(db), row_counts(db)
    raw = sum(sizes.get(t, 0) for t in ("samples", "rails", "temperatures", "engine_loads", "model_stats"))
    per_sample = raw / counts["samples"]
    per_minute_row = sizes.get("rollup_1m", 0) / max(1, counts["rollup_1m"])
    series = counts["rollup_1m"] / max(1, _buckets(db, "rollup_1m"))  # series per minute bucket
    minutes = config.minute_retention_s / 60
    hours = min(config.hour_retention_s, 365 * 86400) / 3600
    raw_year = per_sample * min(config.raw_retention_s, 365 * 86400)
    minute_year = per_minute_row * series * minutes
    hour_year = per_minute_row * series * hours  # same row layout as rollup_1m
    return {"bytes_per_raw_sample": round(per_sample), "bytes_per_rollup_row": round(per_minute_row),
            "series": round(series), "raw_mb": round(raw_year / 1e6, 1), "rollup_1m_mb": round(minute_year / 1e6, 1),
            "rollup_1h_mb": round(hour_year / 1e6, 1),
            "year_at_1hz_mb": round((raw_year + minute_year + hour_year) / 1e6, 1)}


def _buckets(db: Path, table: str) -> int:
    conn = sqlite3.connect(db)
    n = conn.execute(f"SELECT COUNT(DISTINCT bucket) FROM {table}").fetchone()[0]
    conn.close()
    return int(n)


def bulk(samples: int, workdir: Path, line: str) -> tuple[dict[str, float], Path]:
    lines = workdir / "bulk.log"
    lines.write_text(line + "\n")
    db = workdir / "bulk.db"
    db.unlink(missing_ok=True)
    config = TelemetryConfig()
    rss0 = rss_mib()
    source = ReplaySource(str(lines), speed=1e12, interval_s=1.0, loop=True)
    service = TelemetryService(config, str(db), activity=Models(), source=source)
    t0 = time.perf_counter()
    service.start()
    service.wait_samples(samples, timeout=3600)
    service.stop()
    wall = time.perf_counter() - t0
    out: dict[str, float] = {"samples": service.samples, "wall_s": round(wall, 1),
                             "samples_per_s": round(service.samples / wall), "rss_before_mib": round(rss0, 1),
                             "rss_after_mib": round(rss_mib(), 1), "db_file_mb": round(db.stat().st_size / 1e6, 1)}
    out.update({f"rows_{k}": v for k, v in row_counts(db).items()})
    out.update(projection(db, config))
    return out, db


TARGET_MS = 100.0


def edged_command() -> list[str]:
    script = Path(sys.executable).with_name("edged")
    return [str(script)] if script.exists() else [sys.executable, "-m", "edged"]


def summary_time(db: Path, runs: int = 5) -> dict[str, float | bool | str]:
    argv = [*edged_command(), "telemetry", "summary", "--since", "24h", "--db", str(db)]
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)  # warm-up: page cache, .pyc files
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
    reader = TelemetryReader(str(db))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        reader.summary(86400)
        times.append(time.perf_counter() - t0)
    command_ms = statistics.median(walls) * 1e3
    return {"command": " ".join(argv[-6:]), "command_median_ms": round(command_ms, 1),
            "command_max_ms": round(max(walls) * 1e3, 1), "target_ms": TARGET_MS,
            "meets_target": command_ms < TARGET_MS, "query_median_ms": round(statistics.median(times) * 1e3, 1),
            "query_max_ms": round(max(times) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--workdir")
    parser.add_argument("--line", default=LINE, help="the tegrastats line replayed in the bulk run")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="edged-bench-telemetry-"))
    workdir.mkdir(parents=True, exist_ok=True)
    one_line = workdir / "one.log"
    one_line.write_text(LINE + "\n")
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": sys.version.split()[0],
              "cpus": os.cpu_count(), "threads_at_start": threading.active_count()}
    result["sysfs_1hz"] = at_one_hz("sysfs", SysfsSource("/", 1.0), args.seconds, workdir / "sysfs.db")
    result["tegrastats_lines_1hz"] = at_one_hz("replay", ReplaySource(str(one_line), 1.0, 1.0, True),
                                               args.seconds, workdir / "replay.db")
    result["bulk"], db = bulk(args.samples, workdir, args.line)
    summary = summary_time(db)
    headline = {"summary_24h_command_ms": summary["command_median_ms"], "target_ms": TARGET_MS}
    print(json.dumps({**headline, **result, "summary_24h": summary}, indent=2))


if __name__ == "__main__":
    main()
