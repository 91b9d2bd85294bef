"""The `TelemetrySource` seam, and the choice of a source from ``[telemetry] source``.

Every source paces itself: `next_sample` blocks until the next sample is due (or ``stop`` is set) and returns
None only when the source has ended (stop requested, or a replay file ran out). Sources are built only by
`open_source`, which imports the chosen implementation lazily, so that jtop is imported only when chosen.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edged.clock import Clock
from edged.config import TelemetryConfig
from edged.errors import ConfigKeyError, TelemetryError
from edged.telemetry._sample import Sample


class TelemetrySource(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def bad_lines(self) -> int: ...  # readings refused as corrupt (skipped, not stored)

    def next_sample(self, stop: threading.Event) -> Sample | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SourceChoice:
    name: str  # "tegrastats" | "jtop" | "sysfs" | "replay" | "off"
    reason: str  # one line for logs and `edged doctor`


def _tegrastats_usable(config: TelemetryConfig) -> bool:
    return os.path.isfile(config.tegrastats_path) and os.access(config.tegrastats_path, os.X_OK)


def _jtop_usable(config: TelemetryConfig) -> bool:
    return importlib.util.find_spec("jtop") is not None and os.path.exists(config.jtop_socket)


def _sysfs_usable(config: TelemetryConfig) -> bool:
    root = Path(config.sysfs_root)
    return (root / "proc" / "stat").is_file() or (root / "sys" / "class" / "thermal").is_dir()


def choose_source(config: TelemetryConfig) -> SourceChoice:
    """Which source ``config`` selects, and why; ``auto`` prefers tegrastats, then jtop, then sysfs."""
    if config.source != "auto":
        return SourceChoice(config.source, f"configured: [telemetry] source = {config.source!r}")
    if _tegrastats_usable(config):
        return SourceChoice("tegrastats", f"auto: {config.tegrastats_path} is executable")
    if _jtop_usable(config):
        return SourceChoice("jtop", f"auto: jetson-stats is installed and {config.jtop_socket} exists")
    if _sysfs_usable(config):
        return SourceChoice("sysfs", f"auto: no {config.tegrastats_path}, no jtop service; reading "
                            f"{config.sysfs_root} (thermal, hwmon, cpufreq, /proc)")
    return SourceChoice("off", f"auto: no tegrastats, no jtop service and nothing under {config.sysfs_root}")


def open_source(config: TelemetryConfig, choice: SourceChoice | None = None,
                clock: Clock | None = None) -> TelemetrySource | None:
    """Build the chosen source; None when telemetry is off. ``clock`` lays out a replay's times."""
    choice = choice or choose_source(config)
    if choice.name == "off":
        return None
    if choice.name == "tegrastats":
        from edged.telemetry._tegrastats_source import TegrastatsSource
        return TegrastatsSource(config)
    if choice.name == "replay":
        from edged.telemetry._replay import ReplaySource
        if config.replay_file is None:
            raise ConfigKeyError("telemetry.replay_file", "source = 'replay' needs replay_file, found none")
        try:
            return ReplaySource(config.replay_file, config.replay_speed, config.interval_s, config.replay_loop,
                                clock)
        except TelemetryError as e:  # the file named by the key cannot be read
            raise ConfigKeyError("telemetry.replay_file", str(e)) from e
    if choice.name == "sysfs":
        from edged.telemetry._sysfs import SysfsSource
        return SysfsSource(config.sysfs_root, config.interval_s)
    if choice.name == "jtop":
        from edged.telemetry._jtop import JtopSource
        try:
            return JtopSource(config.interval_s)
        except TelemetryError as e:  # jetson-stats missing or its service unreachable: the choice of source
            raise ConfigKeyError("telemetry.source", f"{e}; or choose another source") from e
    raise TelemetryError(f"unknown telemetry source {choice.name!r}")


def describe_source(config: TelemetryConfig) -> str:
    """One line for ``edged doctor``: the source ``config`` selects and why."""
    choice = choose_source(config)
    return f"{choice.name} ({choice.reason})"
