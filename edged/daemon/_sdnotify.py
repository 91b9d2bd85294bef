"""sd_notify(3) for the daemon: state changes and watchdog pings to systemd over NOTIFY_SOCKET.

Sends never block and never raise into the daemon: with nobody reading, the datagram queue fills after ten
messages, and a send then fails with EAGAIN; such failures are counted and logged, and the daemon goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

logger = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends ``KEY=value`` datagrams to the socket systemd named in NOTIFY_SOCKET."""

    def __init__(self, address: str, watchdog_usec: int | None = None) -> None:
        # An address starting with "@" is in the abstract namespace: a leading NUL byte on the wire.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_usec = watchdog_usec
        self.failed_sends = 0
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> SystemdNotifier | None:
        """The notifier systemd asked for, or None when the process does not run under Type=notify."""
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        if not address.startswith(("/", "@")):
            return None
        return cls(address, _watchdog_usec(env))

    def ready(self, status: str = "") -> bool:
        return self._send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self._send(f"STATUS={text}")

    def reloading(self) -> bool:
        # systemd >= 253 (Type=notify-reload) needs the CLOCK_MONOTONIC time of the reload request.
        return self._send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> bool:
        return self._send("STOPPING=1")

    def watchdog(self) -> bool:
        return self._send("WATCHDOG=1")

    def extend_timeout(self, usec: int) -> bool:
        return self._send(f"EXTEND_TIMEOUT_USEC={int(usec)}")

    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half of WatchdogSec=), or None when no watchdog is armed for us."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2_000_000

    def close(self) -> None:
        self._socket.close()

    def _send(self, *fields: str) -> bool:
        message = "\n".join(fields).encode()
        try:
            self._socket.sendto(message, socket.MSG_DONTWAIT, self.address)
        except OSError as e:
            self.failed_sends += 1
            if self.failed_sends & (self.failed_sends - 1):
                return False  # log the 1st, 2nd, 4th, 8th... failure: a dead reader must not flood the log
            logger.warning("sd_notify to %s failed (%s failures so far): %s: %s", self.address.lstrip("\0"),
                           self.failed_sends, message.decode(), e.strerror or e)
            return False
        return True


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None  # the watchdog is armed for another process (a parent that exec'd us without it)
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec if usec > 0 else None
