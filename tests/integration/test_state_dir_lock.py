"""One daemon per state directory: a second `edged serve` on a directory a running daemon holds stops at once with
one error line naming the directory and the holder's PID, and touches nothing there; a daemon killed with SIGKILL
leaves no lock behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from integration.edged_daemon import config_with_fakes, daemon_environment, start_daemon
from modelgen import add_custom_model
from tmpfs_mount import mounted_tmpfs


def _second_serve(tmp_path: Path, state: Path) -> subprocess.CompletedProcess[str]:
    socket_path = tmp_path / "second.sock"
    return subprocess.run([sys.executable, "-m", "edged", "serve", "--socket", str(socket_path), "--state-dir",
                           str(state), "--config", str(tmp_path / "first" / "edged.toml")],
                          capture_output=True, text=True, timeout=90, env=daemon_environment(), check=False)


def test_a_second_daemon_on_the_same_state_dir_exits_naming_the_directory_and_the_holder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    config = config_with_fakes(f'repository = "{tmp_path / "models"}"\n')
    first = start_daemon(tmp_path / "first", config=config)
    state = tmp_path / "first" / "state"
    try:
        before = {path.name: path.read_bytes() for path in state.iterdir() if path.is_file()}
        second = _second_serve(tmp_path, state)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"edged serve: error: state directory {state} is in use by another edged daemon (PID {first.pid} "
            "holds its edged.lock): stop that daemon first (systemctl stop edged), or give this one a state_dir "
            "(--state-dir) of its own"]
        assert not (tmp_path / "second.sock").exists()  # it stopped before listening
        # nothing under the directory was written by the second one (its start history, clock, lock file)
        assert {path.name: path.read_bytes() for path in state.iterdir() if path.is_file()} == before
        assert first.client().ready()
    finally:
        assert first.stop() == 0, first.output()


def test_a_daemon_killed_with_sigkill_leaves_no_lock_behind(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    config = config_with_fakes(f'repository = "{tmp_path / "models"}"\n')
    first = start_daemon(tmp_path / "run", config=config)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    assert (tmp_path / "run" / "state" / "edged.lock").exists()  # the file stays; the kernel dropped the lock
    again = start_daemon(tmp_path / "run", config=config)
    try:
        assert again.client().ready()
    finally:
        assert again.stop() == 0, again.output()


def test_a_daemon_on_a_full_state_dir_serves_with_telemetry_degraded(tmp_path: Path) -> None:
    """The state directory's partition is full at start (a real 1 MB tmpfs, filled): edged takes its lock without
    the PID, serves inference and reports the telemetry history it cannot store; before, writing the PID into
    edged.lock ended the start in an ENOSPC traceback, and systemd restarted it into the same one, for good."""
    with mounted_tmpfs(tmp_path / "full", "1m") as mount_point:
        (mount_point / "state").mkdir()
        fd = os.open(mount_point / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):  # ENOSPC: the file system is full
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        repo = tmp_path / "models"
        add_custom_model(repo, "doubled", "doubling")
        config = config_with_fakes().replace('source = "off"', 'source = "sysfs"')
        daemon = start_daemon(tmp_path / "run", config=config,
                              args=["--model-repository", str(repo), "--state-dir", str(mount_point / "state")])
        try:
            client = daemon.client()
            result = client.infer("doubled", {"input": np.ones((1, 4), np.float32)})
            assert result.as_numpy("output").tolist() == [[2.0] * 4]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                health = client.status()["health"]
                if health["components"].get("telemetry_writer", {}).get("state") == "degraded":
                    break
                time.sleep(0.1)
            assert health["state"] == "degraded" and "disk full" in health["reason"], health
            assert "cannot write this daemon's PID" in daemon.output()
        finally:
            daemon.stop(10)
