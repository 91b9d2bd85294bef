"""The test's end of systemd's NOTIFY_SOCKET, shared by the systemd and packaging tests."""

from __future__ import annotations

import socket
import time
from pathlib import Path


class NotifyReader:
    """The test's end of NOTIFY_SOCKET: every datagram, with the time it arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[tuple[float, list[str]]] = []

    def poll(self, timeout_s: float) -> list[str] | None:
        """One datagram's fields, or None if none arrived within timeout_s."""
        self.sock.settimeout(max(0.001, timeout_s))
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        fields = data.decode().split("\n")
        self.received.append((time.monotonic(), fields))
        return fields

    def wait_for(self, field: str, limit_s: float) -> list[str]:
        """Fields of the first datagram holding ``field`` (a deadline, not a sleep)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            fields = self.poll(deadline - time.monotonic())
            if fields is not None and field in fields:
                return fields
        raise AssertionError(f"no {field} within {limit_s} s; received {[f for _, f in self.received]}")

    def close(self) -> None:
        self.sock.close()
