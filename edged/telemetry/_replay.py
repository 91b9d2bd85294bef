"""Replay a file of recorded tegrastats lines at real or accelerated speed.

Spacing comes from the lines' own timestamps when they have them (lines sharing a whole-second stamp,
as `tegrastats --interval 500` prints them, split the gap to the next), else from the configured interval. Sample
times (wall and device elapsed, see `edged.clock`) are laid out from the moment the replay starts, so a replayed
history looks like a live one; pacing uses the monotonic clock, so a wall clock step neither stalls nor rushes
it. Comments and blanks are skipped; lines the parser refuses (garbage, corrupt values) are skipped and
counted (``bad_lines``), and logged rate-limited. A file without one usable line is a `TelemetryError` (the
sampler shows it as degraded) rather than an endless loop over nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from edged.clock import Clock, DeviceClock
from edged.errors import TelemetryError, TelemetryParseError
from edged.telemetry._bad_lines import BadLines
from edged.telemetry._sample import Sample
from edged.telemetry.tegrastats import parse_tegrastats

log = logging.getLogger(__name__)


def _stamp(timestamp: str | None) -> float | None:
    if timestamp is None:
        return None
    try:
        return datetime.strptime(timestamp, "%m-%d-%Y %H:%M:%S").timestamp()
    except ValueError:
        return None


class ReplaySource:
    def __init__(self, path: str, speed: float = 1.0, interval_s: float = 1.0, loop: bool = False,
                 clock: Clock | None = None) -> None:
        if speed <= 0:
            raise TelemetryError(f"replay speed must be positive, found {speed}")
        try:
            # Bytes that are not UTF-8 (a capture cut mid-character, a serial console's noise) become U+FFFD:
            # the parser then refuses or keeps that line alone, never the whole file.
            text = Path(path).read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise TelemetryError(f"cannot read replay file {path}: {e.strerror}") from e
        self._path = path
        self._lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        self._speed = speed
        self._interval = interval_s
        self._loop = loop
        self._bad = BadLines("replay", log)
        self._iter = self._samples()
        self._clock = clock or DeviceClock()
        self._start: tuple[float, float, float] | None = None  # (monotonic, wall, elapsed) at the first sample

    @property
    def name(self) -> str:
        return "replay"

    @property
    def bad_lines(self) -> int:
        return self._bad.count

    def _samples(self) -> Iterator[tuple[float, Sample]]:
        """Yield (offset in sample time, sample) forever when looping."""
        offset = 0.0
        while True:
            usable = 0
            for step, sample in self._spaced(self._parsed()):
                usable += 1
                offset += step
                yield offset, sample
            if usable == 0:  # looping over such a file would spin forever, yielding nothing
                raise TelemetryError(self._unusable())
            if not self._loop:
                return

    def _parsed(self) -> Iterator[Sample]:
        for line in self._lines:
            try:
                yield parse_tegrastats(line)
            except TelemetryParseError as e:
                self._bad.note(e)

    def _spaced(self, samples: Iterator[Sample]) -> Iterator[tuple[float, Sample]]:
        """Each sample with the time since the one before. Stamps count whole seconds, so the k lines that share
        one (``--interval 500`` prints two a second) split the gap to the next stamp between them; a line
        without a stamp, or a gap that is none or too long (captures concatenated), is one configured interval.
        """
        group: list[Sample] = []
        stamp: float | None = None
        last_step = self._interval
        for sample in samples:
            new = _stamp(sample.timestamp)
            if group and (new is None or new != stamp):
                last_step = self._step(stamp, new, len(group))
                yield from ((last_step, s) for s in group)
                group = []
            group.append(sample)
            stamp = new
        yield from ((last_step if stamp is not None else self._interval, s) for s in group)

    def _step(self, stamp: float | None, new: float | None, count: int) -> float:
        gap = new - stamp if new is not None and stamp is not None else None
        return gap / count if gap is not None and 0 < gap <= 60 * self._interval else self._interval

    def _unusable(self) -> str:
        found = (f"all {len(self._lines)} of its lines were refused as not tegrastats or corrupt"
                 if self._lines else "it holds no line but blanks and comments")
        return (f"replay file {self._path} has no usable tegrastats line ({found}): point [telemetry] "
                "replay_file at a recording of tegrastats output, then restart edged")

    def next_sample(self, stop: threading.Event) -> Sample | None:
        if self._start is None:
            self._start = (time.monotonic(), self._clock.wall(), self._clock.elapsed())
        item = next(self._iter, None)
        if item is None or stop.is_set():
            return None
        offset, sample = item
        started, wall, elapsed = self._start
        wait = started + offset / self._speed - time.monotonic()
        if wait > 0.001 and stop.wait(wait):  # shorter waits only hand the GIL to the writer thread
            return None
        return dataclasses.replace(sample, t=wall + offset, elapsed=elapsed + offset)

    def close(self) -> None:
        self._iter = iter(())
