"""sd_notify over a real datagram socket that the test reads, as systemd would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.daemon._sdnotify import SystemdNotifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def _receive(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def test_ready_status_stopping_and_watchdog_arrive_as_datagrams(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path})
    assert notifier is not None
    assert notifier.ready("serving 2 models")
    assert _receive(sock) == {"READY": "1", "STATUS": "serving 2 models"}
    assert notifier.status("loading resnet")
    assert _receive(sock) == {"STATUS": "loading resnet"}
    assert notifier.watchdog()
    assert _receive(sock) == {"WATCHDOG": "1"}
    assert notifier.extend_timeout(90_000_000)
    assert _receive(sock) == {"EXTEND_TIMEOUT_USEC": "90000000"}
    assert notifier.stopping()
    assert _receive(sock) == {"STOPPING": "1"}
    notifier.close()


def test_reloading_carries_the_monotonic_time_systemd_253_requires(
        listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path})
    assert notifier is not None
    before = time.monotonic_ns() // 1000
    notifier.reloading()
    fields = _receive(sock)
    after = time.monotonic_ns() // 1000
    assert fields["RELOADING"] == "1"
    assert before <= int(fields["MONOTONIC_USEC"]) <= after


def test_abstract_socket_address_is_reached_through_a_leading_nul() -> None:
    name = f"edged-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": "@" + name})
        assert notifier is not None
        notifier.ready()
        assert sock.recv(100) == b"READY=1"
    finally:
        sock.close()


def test_no_notifier_without_a_usable_notify_socket() -> None:
    assert SystemdNotifier.from_environ({}) is None
    assert SystemdNotifier.from_environ({"NOTIFY_SOCKET": ""}) is None
    assert SystemdNotifier.from_environ({"NOTIFY_SOCKET": "relative/path"}) is None


@pytest.mark.parametrize(("env", "expected"), [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(
        env: dict[str, str], expected: float | None) -> None:
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": "/run/nothing", **env})
    assert notifier is not None
    assert notifier.watchdog_interval() == expected


def test_full_queue_is_counted_and_never_blocks_or_raises(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path})
    assert notifier is not None
    results = [notifier.watchdog() for _ in range(200)]  # nobody reads: the queue fills (max_dgram_qlen)
    assert not all(results)
    assert notifier.failed_sends == results.count(False) > 0
    assert sock.recv(100) == b"WATCHDOG=1"  # what did fit was delivered intact


def test_vanished_reader_is_counted_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier is not None
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.failed_sends == 2


def test_child_process_reports_ready_through_its_environment(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    code = ("from edged.daemon._sdnotify import SystemdNotifier as N\n"
            "n = N.from_environ()\n"
            "n.ready(f'pid interval {n.watchdog_interval()}')\n")
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert _receive(sock) == {"READY": "1", "STATUS": "pid interval 2.0"}
