"""One daemon per state directory: an exclusive ``flock`` on ``<state_dir>/edged.lock``, held for the process's life.

Two daemons on one state directory (``edged serve`` started by hand beside the systemd one) would both write the
outbox, the telemetry database, the OTA journal and ``clock.json``, and corrupt each other's view of them. The
kernel drops the lock when the process ends, however it ends (SIGKILL included), so a stale file never blocks a
start; the file stays (unlinking it would let a third daemon lock a new inode while the second holds the old one).
The PID written into it is only for the message: the lock, not the file's content, decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from edged.errors import ConfigError, StateDirInUse

LOCK_NAME = "edged.lock"

log = logging.getLogger(__name__)


def lock_state_dir(state_dir: Path) -> int:
    """Take the state directory's lock, or raise `StateDirInUse` naming the directory and the holder's PID; the
    open descriptor, which must stay open (close-on-exec, so no child process inherits the lock)."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise ConfigError(f"cannot open the state directory's lock file {path}: {e.strerror}; state_dir (or "
                          "--state-dir) must be a directory edged may write") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StateDirInUse(state_dir, holder) from None
    except OSError as e:  # ENOLCK: a file system without locks (some network mounts)
        os.close(fd)
        raise ConfigError(f"cannot lock {path}: {e.strerror}; put state_dir (or --state-dir) on a local file "
                          "system") from e
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:  # a full disk (ENOSPC, EDQUOT): the PID is only for a message, the lock is held
        log.warning("state directory %s: cannot write this daemon's PID into %s (%s); the lock is held, "
                    "a second daemon's refusal will not name this PID: free space there", state_dir, path,
                    e.strerror)
    return fd


def _holder(fd: int) -> int | None:
    """The PID the holder wrote, if it has written one yet (it writes right after taking the lock)."""
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode("ascii").strip())
    return None
