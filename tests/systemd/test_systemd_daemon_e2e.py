"""The daemon under the systemd protocols, with no systemd: NOTIFY_SOCKET pointed at a datagram socket the test
reads (READY, STATUS, WATCHDOG, STOPPING) and socket activation (LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES).

systemd sets WATCHDOG_PID and LISTEN_PID to the pid of the process it starts; a small ``python -c`` wrapper
does the same here (tests/activation.py: it sets them to its own pid, then execs the daemon, which keeps it).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from activation import wrapper
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from modelgen import add_custom_model
from notify_reader import NotifyReader

from edged.client import ClientError, EdgedClient

WATCHDOG_USEC = 1_000_000
PING_INTERVAL_S = WATCHDOG_USEC / 2e6

@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyReader]:
    reader = NotifyReader(tmp_path / "notify.sock")
    yield reader
    reader.close()


def _health(socket_path: Path) -> int | None:
    """Status of GET /v2/health/ready, or None while nothing answers on the socket."""
    connection = http.client.HTTPConnection("localhost", timeout=5)
    try:
        connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.sock.settimeout(5)
        connection.sock.connect(str(socket_path))
        connection.request("GET", "/v2/health/ready")
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        connection.close()


def _notify_env(notify: NotifyReader) -> dict[str, str]:
    return {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}


def test_ready_comes_only_after_health_is_ready_then_status_watchdog_pings_and_stopping(
        tmp_path: Path, notify: NotifyReader) -> None:
    # A model whose warm-up takes 1 s: a window in which the socket answers but the daemon is not ready.
    repo = tmp_path / "models"
    add_custom_model(repo, "slow_start", "doubling",
                     extra='parameters { key: "delay_s" value: { string_value: "1.0" } }')
    daemon = start_daemon(tmp_path, config=config_with_fakes(), args=["--model-repository", str(repo)],
                          env=_notify_env(notify), wait=False, argv_prefix=wrapper("WATCHDOG_PID"))
    try:
        health_before_ready: list[int | None] = []
        deadline = time.monotonic() + 60
        ready_fields: list[str] | None = None
        while ready_fields is None:
            assert time.monotonic() < deadline, f"no READY=1; got {notify.received}\n{daemon.output()}"
            assert daemon.process.poll() is None, daemon.output()
            fields = notify.poll(0.02)
            if fields is not None and "READY=1" in fields:
                ready_fields = fields
            else:
                health_before_ready.append(_health(daemon.socket_path))
        assert _health(daemon.socket_path) == 200
        # Triton answers "not ready" with 400, and so does edged.
        assert 400 in health_before_ready, f"never saw the not-ready window: {health_before_ready}"
        status = [f for f in ready_fields if f.startswith("STATUS=")]
        assert status and "1 model version(s) ready" in status[0], ready_fields

        first = time.monotonic()
        for _ in range(4):
            notify.wait_for("WATCHDOG=1", 2 * PING_INTERVAL_S + 1)
        # Four pings at half of WATCHDOG_USEC take about 1.5 s; far less would mean a busy loop.
        assert time.monotonic() - first > 3 * PING_INTERVAL_S * 0.8

        daemon.process.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
        assert daemon.process.wait(30) == 0, daemon.output()
    finally:
        daemon.stop()


def test_watchdog_stops_when_the_engine_hangs(tmp_path: Path, notify: NotifyReader) -> None:
    repo = tmp_path / "models"
    add_custom_model(repo, "hang", "doubling",
                     extra='parameters { key: "block_until_released" value: { string_value: "true" } }')
    config = config_with_fakes("warmup = false\nstall_timeout_s = 0.5\n\n[server]\nshutdown_timeout_s = 1\n")
    daemon = start_daemon(tmp_path, config=config, args=["--model-repository", str(repo)], env=_notify_env(notify))
    try:
        notify.wait_for("READY=1", 30)
        notify.wait_for("WATCHDOG=1", 2 * PING_INTERVAL_S + 1)
        notify.wait_for("WATCHDOG=1", 2 * PING_INTERVAL_S + 1)

        def submit() -> None:
            # The execution never finishes; the request's fate after the stop does not matter here.
            with EdgedClient(daemon.socket_path, timeout_s=20) as client, contextlib.suppress(ClientError):
                client.infer("hang", {"input": np.ones((1, 4), np.float32)})

        threading.Thread(target=submit, daemon=True).start()
        submitted = time.monotonic()
        # Pings stop once the execution has run past stall_timeout_s: wait for a silence of two ping
        # periods (what systemd's WatchdogSec would notice) within a deadline.
        last_ping = submitted
        deadline = submitted + 15
        while time.monotonic() - last_ping < 2 * WATCHDOG_USEC / 1e6:
            assert time.monotonic() < deadline, f"pings kept coming: {notify.received[-6:]}\n{daemon.output()}"
            fields = notify.poll(0.1)
            if fields is not None and "WATCHDOG=1" in fields:
                last_ping = time.monotonic()
        assert last_ping - submitted < 0.5 + 2 * PING_INTERVAL_S + 1, "pings stopped, but far too late"
        assert daemon.process.poll() is None, "a hang is not a crash: the process must still be there"
        assert "engine wedged: hang/1" in daemon.output()

        daemon.process.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
    finally:
        daemon.stop(wait_s=5)


def test_socket_activation_serves_on_the_inherited_socket(tmp_path: Path, notify: NotifyReader) -> None:
    activated = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(activated))
    listener.listen(16)
    # A client that connects before the daemon exists is queued by the kernel, not refused.
    early = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    early.settimeout(60)
    early.connect(str(activated))
    early.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
    repo = tmp_path / "models"
    add_custom_model(repo, "doubling", "doubling")
    env = {**_notify_env(notify), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "edged"}
    daemon = start_daemon(tmp_path, config=config_with_fakes(), args=["--model-repository", str(repo)],
                          env=env, socket_name="not-used.sock", wait=False, pass_fds=[listener.fileno()],
                          argv_prefix=wrapper("LISTEN_PID", listener.fileno()))
    listener.close()  # the daemon holds the only copy now, as with systemd's socket unit
    try:
        notify.wait_for("READY=1", 60)
        reply = early.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        with EdgedClient(activated, timeout_s=30) as client:
            assert client.ready()
            out = client.infer("doubling", {"input": np.arange(4, dtype=np.float32).reshape(1, 4)})
            np.testing.assert_array_equal(out.as_numpy("output"), [[0, 2, 4, 6]])
        assert f"listening on uds:{activated} (inherited from systemd)" in daemon.output()
        assert not daemon.socket_path.exists(), "with an inherited socket the daemon must not open its own"
        assert daemon.stop() == 0, daemon.output()
        assert activated.exists(), "the inherited socket's file belongs to the socket unit"
    finally:
        early.close()
        daemon.stop()


def _reload(daemon: DaemonProcess, notify: NotifyReader) -> list[str]:
    """SIGHUP, then the fields of the READY=1 that must follow RELOADING=1."""
    os.kill(daemon.pid, signal.SIGHUP)
    notify.wait_for("RELOADING=1", 10)
    return notify.wait_for("READY=1", 20)


def test_sighup_with_a_config_that_is_not_utf8_keeps_the_config_rescans_and_is_ready_again(
        tmp_path: Path, notify: NotifyReader) -> None:
    secret = "sk-never-in-the-journal-0123456789"
    repo = tmp_path / "models"
    add_custom_model(repo, "first", "doubling")
    with socket.socket() as probe:  # the key guards only a TCP listener: the daemon refuses it without one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = config_with_fakes(f'warmup = false\n\n[server]\nhttp_port = {port}\nopenai_api_key = "{secret}"\n')
    daemon = start_daemon(tmp_path, config=config, args=["--model-repository", str(repo)], env=_notify_env(notify))
    try:
        notify.wait_for("READY=1", 30)
        add_custom_model(repo, "added", "doubling")
        config_file = tmp_path / "edged.toml"
        with config_file.open("ab") as f:
            f.write(b"# caf\xe9\n")  # an editor in a Latin-1 locale
        bad_byte = config_file.read_bytes().index(b"\xe9")
        fields = _reload(daemon, notify)
        problem = f"config not reloaded: {config_file}: the file is not UTF-8 text (byte {bad_byte})"
        status = next(field for field in fields if field.startswith("STATUS="))
        assert status.startswith(f"STATUS={problem}"), fields
        assert daemon.client().model_ready("added"), "the rescan SIGHUP promises was skipped"

        config_file.write_text(config)  # fixed: the next reload is a clean one
        fields = _reload(daemon, notify)
        assert not any("not reloaded" in field for field in fields), fields
    finally:
        daemon.stop(wait_s=5)
    log = daemon.output()
    assert secret not in log and "Traceback" not in log and "UnicodeDecodeError" not in log, log
    assert log.count("SIGHUP: config not reloaded") == 1, log
