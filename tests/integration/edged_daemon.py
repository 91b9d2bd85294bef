"""The real daemon as a subprocess for integration tests: start, wait for readiness, read its memory, stop.

Readiness is read from ``GET /v2/health/ready`` polled against a deadline; nothing here sleeps to wait for a
state. The daemon's output goes to a file in the test's directory and is shown when a start fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.client import ClientError, EdgedClient

TESTS = Path(__file__).resolve().parent.parent
# The test backends (engine_fakes.DoublingBackend) are imported by the daemon through [models] backends.
FAKES = TESTS / "engine"
START_TIMEOUT_S = 90.0
POLL_S = 0.05


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    """``predicate()``'s first true value, polled every 50 ms; AssertionError naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def config_with_fakes(body: str = "") -> str:
    """A test config: telemetry off, the doubling test backend registered, plus ``body``."""
    return ('[telemetry]\nsource = "off"\n\n[models]\nbackends = { doubling = "engine_fakes:DoublingBackend" }\n'
            + body)


def daemon_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                          "LISTEN_FDNAMES", "JOURNAL_STREAM", "LD_PRELOAD", "MALLOC_CONF",
                          "TCMALLOC_RELEASE_RATE", "EDGED_ALLOCATOR_REEXEC")}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


@dataclass
class DaemonProcess:
    process: subprocess.Popen[bytes]
    socket_path: Path
    log_path: Path
    clients: list[EdgedClient] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout_s: float = 60.0) -> EdgedClient:
        client = EdgedClient(self.socket_path, timeout_s=timeout_s)
        self.clients.append(client)
        return client

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll /v2/health/ready until it answers 200; fail early with the output if the process exits."""
        deadline = time.monotonic() + timeout_s
        probe = EdgedClient(self.socket_path, timeout_s=5.0)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise AssertionError(f"edged exited with {self.process.returncode} before it was ready:\n"
                                         f"{self.output()}")
                try:
                    if probe.ready():
                        return
                except ClientError:
                    probe.close()
                time.sleep(POLL_S)
        finally:
            probe.close()
        raise AssertionError(f"edged not ready within {timeout_s} s:\n{self.output()}")

    def rss_kib(self) -> int:
        return proc_status_kib(self.pid, "VmRSS")

    def stop(self, wait_s: float = 30.0) -> int:
        """SIGTERM, wait up to ``wait_s``, then SIGKILL; the exit status (negative: killed by that signal)."""
        for client in self.clients:
            client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        return self.process.returncode


def start_daemon(workdir: Path, *, config: str | None = None, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, socket_name: str = "edged.sock",
                 wait: bool = True, pass_fds: Sequence[int] = (), argv_prefix: Sequence[str] = ()) -> DaemonProcess:
    """``python -m edged serve --socket workdir/edged.sock --state-dir workdir/state [--config ...] args``."""
    workdir.mkdir(parents=True, exist_ok=True)
    socket_path = workdir / socket_name
    command = [sys.executable, "-m", "edged", "serve", "--socket", str(socket_path),
               "--state-dir", str(workdir / "state")]
    if config is not None:
        config_path = workdir / "edged.toml"
        config_path.write_text(config)
        command += ["--config", str(config_path)]
    command += list(args)
    log_path = workdir / "edged.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*argv_prefix, *command], stdout=log, stderr=subprocess.STDOUT,
                                   env=daemon_environment(env), pass_fds=tuple(pass_fds))
    daemon = DaemonProcess(process, socket_path, log_path)
    if wait:
        try:
            daemon.wait_ready()
        except BaseException:
            daemon.stop(5)
            raise
    return daemon


def proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {key}")


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def mapped_libraries(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split()) >= 6}
