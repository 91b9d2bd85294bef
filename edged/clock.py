"""Time that cannot jump: ages and retention are measured in device elapsed time, wall time is for display only.

A device in the field may boot offline with its clock in 1970 or 2038 and then get NTP; anything aged by the wall
clock would then be dropped at once or kept forever. ``DeviceClock.elapsed()`` is ``CLOCK_BOOTTIME`` (which
counts suspend and never steps) plus the elapsed time accumulated by earlier boots, so it only moves forward,
across reboots too. Rows that must be aged (outbox messages, telemetry samples) record ``elapsed()`` beside their
wall timestamp.

The offset for this boot comes from a small state file (``clock.json``): the boot id of the boot that wrote it,
that boot's offset and the last elapsed value it checkpointed. On a new boot the offset becomes the last value
the previous boot recorded; stores that find rows newer than that (a crash between checkpoints) raise it with
``advance_past``. Time spent powered off is not counted: elapsed time is device life, not calendar time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from edged.durable import write_atomic

log = logging.getLogger(__name__)
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
STATE_FILE_NAME = "clock.json"


class Clock(Protocol):
    def wall(self) -> float:
        """Seconds since the epoch, as the system clock says now: for display and export only."""

    def elapsed(self) -> float:
        """Seconds of device life: never steps backwards or forwards with the wall clock."""


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


class DeviceClock:
    """The daemon's clock. ``wall`` and ``boottime`` are injectable so tests can jump the one and not the other."""

    def __init__(self, state_file: Path | None = None, *, wall: Callable[[], float] = time.time,
                 boottime: Callable[[], float] = _boottime, boot_id: str | None = None) -> None:
        self._wall = wall
        self._boottime = boottime
        self._state_file = state_file
        self._boot_id = read_boot_id() if boot_id is None else boot_id
        self._lock = threading.Lock()
        self._offset = 0.0
        if state_file is not None:
            self._offset = self._offset_from(state_file)
            self.checkpoint()

    def wall(self) -> float:
        return self._wall()

    def elapsed(self) -> float:
        return self._offset + self._boottime()

    def advance_past(self, value: float) -> None:
        """Make ``elapsed()`` at least ``value``: a store found rows recorded later than the last checkpoint."""
        if not _usable(value):  # a row written while the offset was NaN or inf must not bring it back
            log.warning("clock: ignored a recorded elapsed time of %r (not a usable time)", value)
            return
        with self._lock:
            behind = value - self.elapsed()
            if behind > 0:
                self._offset += behind
        self.checkpoint()

    def checkpoint(self) -> None:
        """Record this boot's offset and elapsed time (atomically), so the next boot continues from here."""
        if self._state_file is None:
            return
        with self._lock:
            document = {"boot_id": self._boot_id, "offset": self._offset, "last_elapsed": self.elapsed()}
            # A full or read-only disk must not stop the clock; the next checkpoint tries again.
            with contextlib.suppress(OSError):
                write_atomic(self._state_file, json.dumps(document).encode())

    def _offset_from(self, state_file: Path) -> float:
        try:
            document = json.loads(state_file.read_text(encoding="utf-8"))
            offset = float(document.get("offset", 0.0))
            last = float(document.get("last_elapsed", 0.0))
            same_boot = bool(self._boot_id) and document.get("boot_id") == self._boot_id
        except (OSError, ValueError, TypeError, AttributeError):
            return 0.0
        # json reads NaN and Infinity: such an offset would make every elapsed time NaN or inf for good (a NaN key
        # fails every telemetry write, inf files every row under one key), and each checkpoint would write it back.
        last_ok = _usable(last)
        if same_boot and _usable(offset):
            return offset  # a restart of the daemon within one boot: CLOCK_BOOTTIME carried on
        if same_boot or not last_ok:
            fallback = last if last_ok else 0.0
            log.warning("%s: offset %r, last_elapsed %r: not a usable time; continuing from %.1f s (the stores "
                        "move it past their newest rows)", state_file, offset, last, fallback)
            return fallback
        return last  # a new boot: continue from where the previous one stopped recording


def _usable(seconds: float) -> bool:
    """A finite, non-negative number of seconds: what an offset or an elapsed time can be."""
    return math.isfinite(seconds) and seconds >= 0


class ManualClock:
    """A clock that moves only when told: for tests and replays that need exact control over both times."""

    def __init__(self, wall: float = 1_700_000_000.0, elapsed: float = 1_000.0) -> None:
        self._wall_now = wall
        self._elapsed_now = elapsed

    def wall(self) -> float:
        return self._wall_now

    def elapsed(self) -> float:
        return self._elapsed_now

    def advance(self, seconds: float) -> None:
        """Time passes: both clocks move together."""
        self._wall_now += seconds
        self._elapsed_now += seconds

    def jump_wall(self, seconds: float) -> None:
        """The wall clock steps (NTP after an offline boot, a wrong RTC); elapsed time does not."""
        self._wall_now += seconds


def state_file_in(state_dir: Path) -> Path:
    return state_dir / STATE_FILE_NAME
