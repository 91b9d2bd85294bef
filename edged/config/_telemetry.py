"""The ``[telemetry]`` section: where samples come from and how long they are kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


@dataclass(frozen=True)
class TelemetryConfig:
    source: Literal["auto", "tegrastats", "jtop", "sysfs", "replay", "off"] = "auto"
    interval_s: float = field(default=1.0, metadata={"check": _positive})
    tegrastats_path: str = "/usr/bin/tegrastats"
    sysfs_root: str = "/"  # tests point this at trees captured from real modules
    replay_file: str | None = None
    replay_speed: float = field(default=1.0, metadata={"check": _positive})  # 0 < speed; large = fast
    database: str | None = None  # None: <state_dir>/telemetry.db
    raw_retention_s: float = field(default=24 * 3600.0, metadata={"check": _positive})
    minute_retention_s: float = field(default=30 * 24 * 3600.0, metadata={"check": _positive})
    hour_retention_s: float = field(default=400 * 24 * 3600.0, metadata={"check": _positive})
    flush_interval_s: float = field(default=5.0, metadata={"check": _positive})
    batch_size: int = field(default=500, metadata={"check": _positive})  # samples per write transaction
    replay_loop: bool = False  # replay the file again from the start when it ends
    # tegrastats died: first wait before a restart, doubled up to restart_backoff_max_s
    restart_backoff_s: float = field(default=1.0, metadata={"check": _positive})
    restart_backoff_max_s: float = field(default=60.0, metadata={"check": _positive})
    over_temp_c: float = field(default=85.0, metadata={"check": _positive})  # when a zone has no trip point
    jtop_socket: str = "/run/jtop.sock"  # jetson-stats' service; "auto" picks jtop only when it exists
