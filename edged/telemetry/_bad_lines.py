"""Counting a source's bad lines, and logging them rate-limited.

A replay file or a live tegrastats that turns corrupt may give a bad line per sample: one warning each would
flood the log (and, on a small state partition, the disk). The first few are logged in full, later ones in a
summary at most once a minute; every one is counted (``bad_lines``, exported in /metrics and status).
"""

from __future__ import annotations

import logging
import time

_LOGGED_IN_FULL = 3
_SUMMARY_EVERY_S = 60.0


class BadLines:
    def __init__(self, source: str, log: logging.Logger) -> None:
        self._source = source
        self._log = log
        self.count = 0
        self._summarised_at = -_SUMMARY_EVERY_S
        self._summarised_count = 0

    def note(self, error: Exception) -> None:
        self.count += 1
        if self.count <= _LOGGED_IN_FULL:
            self._log.warning("%s: bad line skipped: %s", self._source, error)
            self._summarised_count = self.count
            return
        now = time.monotonic()
        if now - self._summarised_at >= _SUMMARY_EVERY_S:
            self._summarised_at = now
            self._log.warning("%s: %d more bad lines skipped (%d in all), the latest: %s", self._source,
                              self.count - self._summarised_count, self.count, error)
            self._summarised_count = self.count


_NAMES_LOGGED = 32  # distinct field names logged at most; every field is counted


class UnreadFields:
    """Fields of good lines the parser did not read (a name unknown to edged, or a value no Jetson can report,
    kept in the sample's ``unparsed``): counted (``unread_fields``, in /metrics), and each field name logged the
    first time it is seen, so that a new JetPack field or a broken sensor shows once, not once a second."""

    def __init__(self, source: str, log: logging.Logger) -> None:
        self._source = source
        self._log = log
        self.count = 0
        self._seen: set[str] = set()

    def note(self, unparsed: tuple[str, ...]) -> None:
        self.count += len(unparsed)
        new = [f for f in unparsed if _name(f) not in self._seen and len(self._seen) < _NAMES_LOGGED]
        if new:
            self._seen.update(_name(f) for f in new)
            self._log.warning("%s: fields not read (unknown to edged, or a value no Jetson can report): %s",
                              self._source, " ".join(new)[:300])


def _name(field: str) -> str:
    return field.split("@", 1)[0].split(" ", 1)[0]
