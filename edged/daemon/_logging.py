"""Log handlers for the daemon: journald priority prefixes under systemd, timestamps elsewhere.

Under systemd, stderr goes to the journal, which adds its own timestamps and reads a ``<N>`` syslog priority
at the start of each line; JOURNAL_STREAM names the stream's device and inode so that a process can tell
whether its stderr still is that stream (and not redirected by a shell in between).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Literal, TextIO

LogFormat = Literal["auto", "journald", "plain"]

PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
JOURNALD_FORMAT = "%(name)s: %(message)s"

# logging level -> syslog priority (sd-daemon(3)): the highest logging level at or below a record's level.
_PRIORITIES: tuple[tuple[int, int], ...] = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
    (logging.DEBUG, 7),
)


def syslog_priority(levelno: int) -> int:
    for threshold, priority in _PRIORITIES:
        if levelno >= threshold:
            return priority
    return 7


class JournaldFormatter(logging.Formatter):
    """Prefixes every line of a record (tracebacks included) with its ``<N>`` priority, no timestamp."""

    def __init__(self) -> None:
        super().__init__(JOURNALD_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def stderr_is_journal(env: Mapping[str, str] | None = None, stream: TextIO | None = None) -> bool:
    """True when ``stream`` (stderr) is the journal stream systemd connected (JOURNAL_STREAM=dev:ino)."""
    env = os.environ if env is None else env
    stream = sys.stderr if stream is None else stream
    device, _, inode = env.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(stream.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):
        return False


def configure_logging(level: str | int = "info", format: LogFormat = "auto",
                      env: Mapping[str, str] | None = None, stream: TextIO | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one on stderr in the chosen format; return the handler."""
    stream = sys.stderr if stream is None else stream
    journald = format == "journald" or (format == "auto" and stderr_is_journal(env, stream))
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JournaldFormatter() if journald else logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
